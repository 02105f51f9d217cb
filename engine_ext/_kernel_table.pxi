# Included by _engine.pyx: `KernelTable`, one kernel variant callable kernel by kernel on
# NumPy arrays (for tests), and the checks of its operands.


def max_row_len() -> int:
    """The longest row (elements) any kernel takes (kernels.h MAX_ROW_LEN)."""
    return MAX_ROW_LEN


cdef _check_row(Py_ssize_t n, Py_ssize_t n_other):
    """Element-wise operands: non-empty, of one length, at most MAX_ROW_LEN (the SIMD kernels
    keep per-row scratch of that size)."""
    if n < 1 or n_other != n:
        raise ValueError("operands must be non-empty and of one length")
    if n > MAX_ROW_LEN:
        raise ValueError(f"row of {n} elements is longer than the kernels' limit of {MAX_ROW_LEN}")


cdef tuple _state_copies(state, bint in_place):
    """(written, read) float32 copies of `state` for a kernel that reads one state and writes
    another: one array twice (in_place), or two, the written one NaN so that every element the
    kernel leaves unwritten shows."""
    written = np.array(state, dtype=np.float32, copy=True)
    if in_place:
        return written, written
    read = np.array(state, dtype=np.float32, copy=True)
    written[...] = np.nan
    return written, read


cdef class KernelTable:
    """One kernel variant, callable kernel by kernel on NumPy arrays (for tests)."""

    cdef const kernel_table *kt
    cdef readonly str name

    def __cinit__(self, str variant):
        self.kt = _select(variant)
        self.name = self.kt.name.decode()

    def quantize_q8a(self, const float[:, ::1] x):
        """x float32 [n, k] -> (qs int8 [n, k], d float32 [n, k/32], s float32 [n, k/32])."""
        cdef int n = x.shape[0], k = x.shape[1], nb = k // QK, r
        if k % QK:
            raise ValueError("k must be a multiple of 32")
        _check_row(k, k)
        qs = np.empty((n, k), np.int8)
        d = np.empty((n, nb), np.float32)
        s = np.empty((n, nb), np.float32)
        cdef int8_t[:, ::1] qv = qs
        cdef float[:, ::1] dv = d, sv = s
        for r in range(n):
            self.kt.quantize_q8a(&qv[r, 0], &dv[r, 0], &sv[r, 0], &x[r, 0], k)
        return qs, d, s

    def dequantize_row(self, int ggml_type, const uint8_t[::1] raw, int k):
        if not 0 <= ggml_type < GGML_TYPE_COUNT or ggml_row_bytes(ggml_type, k) == 0 \
                or self.kt.dequantize_row[ggml_type] == NULL \
                or (ggml_block_elems(ggml_type) and k % ggml_block_elems(ggml_type)) \
                or raw.shape[0] != ggml_row_bytes(ggml_type, k):
            raise ValueError("row bytes do not match type and k")
        _check_row(k, k)
        out = np.empty(k, np.float32)
        cdef float[::1] ov = out
        self.kt.dequantize_row[ggml_type](&ov[0], &raw[0], k)
        return out

    def gemm(self, int ggml_type, const uint8_t[::1] w, int n_out, const float[:, ::1] x,
             quantized=None, y=None, int o0=0, int o1=-1, bint grouped=True, int repeat=1):
        """Y[r, o] = W[o] . X[r] for o in [o0, o1) (o0 a multiple of 8); w: the file's rows;
        quantized = quantize_q8a(x) output for block weights; y (float32 [n, n_out]) given:
        accumulate into it. grouped: block weights read from their row groups (as the engine
        does) rather than from the file rows. repeat: run the kernel that many times (timing)."""
        cdef int n = x.shape[0], k = x.shape[1]
        if o1 < 0:
            o1 = n_out
        if not 0 <= ggml_type < GGML_TYPE_COUNT or self.kt.gemm[ggml_type] == NULL \
                or n < 1 or n_out < 1 or ggml_row_bytes(ggml_type, k) == 0:
            raise ValueError("unsupported type or empty operands")
        if ggml_block_elems(ggml_type) and k % ggml_block_elems(ggml_type):
            raise ValueError(f"k must be a multiple of the type's block of {ggml_block_elems(ggml_type)}")
        _check_row(k, k)
        if w.shape[0] != ggml_row_bytes(ggml_type, k) * n_out:
            raise ValueError("weight bytes do not match type, k and n_out")
        if o0 % ROW_GROUP or not (0 <= o0 <= o1 <= n_out) or (o1 % ROW_GROUP and o1 != n_out):
            raise ValueError("o0 must be a multiple of 8, and o1 too unless it is n_out")
        cdef gemm_weight gw
        gw.type = ggml_type
        gw.n_in = k
        gw.n_out = n_out
        gw.rows = &w[0]
        gw.x8 = NULL
        packed = np.zeros(max(1, x8_bytes(ggml_type, k, n_out)), np.uint8)
        cdef uint8_t[::1] pv = packed
        if grouped and x8_bytes(ggml_type, k, n_out) > 0:
            pack_x8(&pv[0], &w[0], ggml_type, k, n_out)
            gw.x8 = &pv[0]
        cdef act_rows a
        a.f = &x[0, 0]
        a.k = k
        a.qs = NULL
        a.d = NULL
        a.s = NULL
        cdef const int8_t[:, ::1] qv
        cdef const float[:, ::1] dv, sv
        if quantized is not None:
            qv, dv, sv = quantized
            a.qs = &qv[0, 0]
            a.d = &dv[0, 0]
            a.s = &sv[0, 0]
        elif ggml_block_elems(ggml_type):
            raise ValueError("block weights need the quantized activations")
        if quantized is not None and not (qv.shape[0] == n and qv.shape[1] == k and dv.shape[0] == n
                                          and dv.shape[1] == k // QK and sv.shape[0] == n and sv.shape[1] == k // QK):
            raise ValueError("quantized activations do not match x (use quantize_q8a(x))")
        if y is not None and (y.dtype != np.float32 or y.shape != (n, n_out) or not y.flags.c_contiguous):
            raise ValueError(f"y must be a C-contiguous float32 array of shape ({n}, {n_out})")
        cdef int accumulate = y is not None
        out = np.zeros((n, n_out), np.float32) if y is None else y
        cdef float[:, ::1] ov = out
        cdef int i
        with nogil:
            for i in range(repeat):
                self.kt.gemm[ggml_type](&ov[0, 0], n_out, &gw, o0, o1, &a, n, accumulate)
        return out

    def attention(self, const float[:, ::1] q, k, v, int pos0, int group, int head_dim, float scale,
                  int repeat=1, int window=0):
        """q float32 [n_q, group*head_dim]; k, v [>= pos0+n_q, head_dim] float16 or float32 rows
        (k is rearranged into the engine's blocked key layout here): every chunk's partial
        state folded in order, then normalised (attention_rows). window > 0: each row sees only
        its last `window` keys. repeat: run the kernel that many times (timing)."""
        cdef int n_q = q.shape[0], kv_f16 = k.dtype == np.float16
        if n_q < 1 or group < 1 or n_q * group > ATTN_MAX_ROWS or q.shape[1] != group * head_dim \
                or not 0 < head_dim <= MAX_ROW_LEN or window < 0 or pos0 < 0:
            raise ValueError("bad attention shapes")
        kc = np.ascontiguousarray(k).view(np.uint16 if kv_f16 else np.float32)
        vc = np.ascontiguousarray(v).view(np.uint16 if kv_f16 else np.float32)
        if kc.shape[0] < pos0 + n_q or vc.shape != kc.shape or kc.shape[1] != head_dim:
            raise ValueError("bad key/value shapes")
        n_blocks = -(-kc.shape[0] // KEY_LANES)
        padded = np.zeros((n_blocks * KEY_LANES, head_dim), kc.dtype)
        padded[: kc.shape[0]] = kc
        kc = np.ascontiguousarray(padded.reshape(n_blocks, KEY_LANES, head_dim).transpose(0, 2, 1))
        cdef const uint8_t[::1] kb = kc.reshape(-1).view(np.uint8), vb = vc.reshape(-1).view(np.uint8)
        out = np.zeros((n_q, group * head_dim), np.float32)
        scratch = np.zeros(attn_scratch_floats(kc.shape[0], head_dim), np.float32)
        cdef float[:, ::1] ov = out
        cdef float[::1] sv = scratch
        cdef int i
        with nogil:
            for i in range(repeat):
                attention_rows(self.kt, &ov[0, 0], group * head_dim, &q[0, 0], group * head_dim, &kb[0], &vb[0],
                               kv_f16, pos0, n_q, group, head_dim, scale, window, &sv[0])
        return out

    def attention_q8(self, const float[:, ::1] q, k_rows, v_rows, int pos0, int group, int head_dim, float scale,
                     int window=0, int repeat=1):
        """attention() on q8_0 KV: k_rows, v_rows uint8 [>= pos0+n_q, head_dim / 32 * 34], each row
        head_dim / 32 blocks of an f16 scale (little-endian) and 32 int8 values (kv_q8.h); the keys
        are rearranged here into the engine's blocked q8_0 key layout. repeat: as attention()'s."""
        cdef int n_q = q.shape[0]
        if n_q < 1 or group < 1 or n_q * group > ATTN_MAX_ROWS or q.shape[1] != group * head_dim \
                or not 0 < head_dim <= MAX_ROW_LEN or head_dim % 32 or window < 0 or pos0 < 0:
            raise ValueError("bad attention shapes")
        n_groups = head_dim // 32
        kr = np.ascontiguousarray(k_rows, np.uint8)
        vr = np.ascontiguousarray(v_rows, np.uint8)
        if kr.ndim != 2 or kr.shape[0] < pos0 + n_q or vr.shape != kr.shape or kr.shape[1] != n_groups * 34:
            raise ValueError("bad key/value shapes")
        n_blocks = -(-kr.shape[0] // KEY_LANES)
        padded = np.zeros((n_blocks * KEY_LANES, n_groups, 34), np.uint8)
        padded[: kr.shape[0]] = kr.reshape(-1, n_groups, 34)
        blocks = padded.reshape(n_blocks, KEY_LANES, n_groups, 34)
        scales = blocks[..., :2].transpose(0, 2, 1, 3).reshape(n_blocks, n_groups, 2 * KEY_LANES)
        # per group: quads of 4 dims, each key by key (kv_q8.h): [block][group][quad][lane][4]
        values = blocks[..., 2:].reshape(n_blocks, KEY_LANES, n_groups, 8, 4).transpose(0, 2, 3, 1, 4)
        values = values.reshape(n_blocks, n_groups, 32 * KEY_LANES)
        kc = np.ascontiguousarray(np.concatenate([scales, values], axis=2)).reshape(-1)
        cdef const uint8_t[::1] kb = kc, vb = vr.reshape(-1)
        out = np.zeros((n_q, group * head_dim), np.float32)
        scratch = np.zeros(attn_scratch_floats(n_blocks * KEY_LANES, head_dim), np.float32)
        cdef float[:, ::1] ov = out
        cdef float[::1] sv = scratch
        cdef int i
        with nogil:
            for i in range(repeat):
                attention_rows(self.kt, &ov[0, 0], group * head_dim, &q[0, 0], group * head_dim, &kb[0], &vb[0],
                               2, pos0, n_q, group, head_dim, scale, window, &sv[0])
        return out

    def rmsnorm(self, const float[::1] x, const float[::1] w, float eps):
        _check_row(x.shape[0], w.shape[0])
        out = np.empty(x.shape[0], np.float32)
        cdef float[::1] ov = out
        self.kt.rmsnorm(&ov[0], &x[0], &w[0], x.shape[0], eps)
        return out

    def rope(self, const float[::1] x, int n_heads, int head_dim, const float[::1] cos_sin, bint neox=False):
        """Rotate each head's pairs by the angles of cos_sin [head_dim/2][2]: adjacent pairs, or
        with neox the halves (x[i], x[i + head_dim/2])."""
        if n_heads < 1 or head_dim < 2 or head_dim % 2 or head_dim > MAX_ROW_LEN \
                or x.shape[0] != n_heads * head_dim or cos_sin.shape[0] != head_dim:
            raise ValueError("x must hold n_heads * head_dim floats (head_dim even), cos_sin head_dim")
        out = np.array(x, np.float32)
        cdef float[::1] ov = out
        if neox:
            self.kt.rope_neox(&ov[0], n_heads, head_dim, &cos_sin[0])
        else:
            self.kt.rope(&ov[0], n_heads, head_dim, &cos_sin[0])
        return out

    def silu_mul(self, const float[::1] g, const float[::1] u):
        _check_row(g.shape[0], u.shape[0])
        out = np.empty(g.shape[0], np.float32)
        cdef float[::1] ov = out
        self.kt.silu_mul(&ov[0], &g[0], &u[0], g.shape[0])
        return out

    def gelu_tanh_mul(self, const float[::1] g, const float[::1] u):
        """gelu(g) * u, GELU's tanh approximation (kernels.h)."""
        _check_row(g.shape[0], u.shape[0])
        out = np.empty(g.shape[0], np.float32)
        cdef float[::1] ov = out
        self.kt.gelu_tanh_mul(&ov[0], &g[0], &u[0], g.shape[0])
        return out

    def exp(self, const float[::1] x):
        out = np.empty(x.shape[0], np.float32)
        cdef float[::1] ov = out
        self.kt.exp(&ov[0], &x[0], x.shape[0])
        return out

    def f32_to_f16(self, const float[::1] x):
        out = np.empty(x.shape[0], np.uint16)
        cdef uint16_t[::1] ov = out
        self.kt.f32_to_f16(&ov[0], &x[0], x.shape[0])
        return out

    def f16_to_f32(self, const uint16_t[::1] h):
        out = np.empty(h.shape[0], np.float32)
        cdef float[::1] ov = out
        self.kt.f16_to_f32(&ov[0], &h[0], h.shape[0])
        return out

    def shortconv(self, const float[::1] gate, rows, const float[:, ::1] w):
        """gate float32 [n]; rows: a list of w.shape[0] entries, each a float32 or float16 [n]
        array (all of one dtype) or None (a position before 0); w float32 [taps, n] tap-major:
        out[c] = gate[c] * sum_i w[i, c] * rows[i][c] (kernels.h shortconv)."""
        cdef int n = gate.shape[0], taps = w.shape[0], i
        if not 1 <= taps <= 16 or w.shape[1] != n or len(rows) != taps:
            raise ValueError("w must be [taps <= 16, n] with one row per tap")
        _check_row(n, n)
        present = [np.ascontiguousarray(r) for r in rows if r is not None]
        dtypes = {a.dtype for a in present}
        if not dtypes <= {np.dtype(np.float32), np.dtype(np.float16)} or len(dtypes) > 1 \
                or any(a.shape != (n,) for a in present):
            raise ValueError("rows must be float32 or float16 arrays of one dtype and n elements")
        cdef int f16 = dtypes == {np.dtype(np.float16)}
        cdef const void *ptrs[16]
        cdef const uint8_t[::1] raw
        kept = []
        for i in range(taps):
            if rows[i] is None:
                ptrs[i] = NULL
                continue
            a = np.ascontiguousarray(rows[i]).view(np.uint8)
            kept.append(a)
            raw = a
            ptrs[i] = &raw[0]
        out = np.empty(n, np.float32)
        cdef float[::1] ov = out
        self.kt.shortconv(&ov[0], &gate[0], ptrs, f16, &w[0, 0], taps, n)
        return out


    def ssm_conv(self, const float[::1] x, const float[:, ::1] tail, const float[:, ::1] w, bint in_place=True):
        """One conv position over n channels (kernels.h ssm_conv): x float32 [n], tail float32
        [taps-1, n] (oldest first), w float32 [taps, n] tap-major. Returns (out, new tail): the
        new tail written over a copy of tail (in_place) or into another array."""
        cdef int n = x.shape[0], taps = w.shape[0]
        if not 2 <= taps <= 16 or w.shape[1] != n or tail.shape[0] != taps - 1 or tail.shape[1] != n:
            raise ValueError("need w [taps in 2..16, n] and tail [taps-1, n]")
        _check_row(n, n)
        new_tail, src = _state_copies(tail, in_place)
        out = np.empty(n, np.float32)
        cdef float[:, ::1] tv = new_tail
        cdef float[:, ::1] sv = src
        cdef float[::1] ov = out
        self.kt.ssm_conv(&ov[0], &tv[0, 0], &sv[0, 0], &x[0], &w[0, 0], taps, n, n)
        return out, new_tail

    def l2norm(self, const float[::1] x, float eps):
        """x / sqrt(sum(x^2) + eps) (kernels.h l2norm)."""
        _check_row(x.shape[0], x.shape[0])
        out = np.array(x, dtype=np.float32, copy=True)
        cdef float[::1] ov = out
        self.kt.l2norm(&ov[0], x.shape[0], eps)
        return out

    def gdn_step(self, const float[:, ::1] S, const float[::1] q, const float[::1] k, const float[::1] v,
                 float decay, float beta, float scale, bint in_place=True):
        """One token of the delta rule on S [d, d] (kernels.h gdn_step). Returns (new S, o): the
        new state written over a copy of S (in_place) or into another array."""
        cdef int d = S.shape[0]
        if S.shape[1] != d or q.shape[0] != d or k.shape[0] != d or v.shape[0] != d:
            raise ValueError("need S [d, d] and q, k, v [d]")
        _check_row(d, d)
        new_s, src = _state_copies(S, in_place)
        out = np.empty(d, np.float32)
        cdef float[:, ::1] sv = new_s
        cdef float[:, ::1] iv = src
        cdef float[::1] ov = out
        self.kt.gdn_step(&sv[0, 0], &iv[0, 0], &ov[0], &q[0], &k[0], &v[0], decay, beta, scale, d)
        return new_s, out

    def gdn_steps(self, const float[:, ::1] S, const float[:, ::1] q, const float[:, ::1] k, const float[:, ::1] v,
                  const float[::1] decay, const float[::1] beta, float scale):
        """n tokens of the delta rule on S [d, d] (kernels.h gdn_steps): q, k, v [n, d], decay and
        beta [n]. Returns (new S, o [n, d])."""
        cdef int d = S.shape[0], n = q.shape[0]
        if (S.shape[1] != d or q.shape[1] != d or k.shape[1] != d or v.shape[1] != d or n < 1 or
                k.shape[0] != n or v.shape[0] != n or decay.shape[0] != n or beta.shape[0] != n):
            raise ValueError("need S [d, d], q, k, v [n, d] and decay, beta [n], n >= 1")
        _check_row(d, d)
        new_s = np.array(S, dtype=np.float32, copy=True)
        out = np.empty((n, d), np.float32)
        cdef float[:, ::1] sv = new_s
        cdef float[:, ::1] ov = out
        self.kt.gdn_steps(&sv[0, 0], &ov[0, 0], d, &q[0, 0], &k[0, 0], &v[0, 0], d, &decay[0], &beta[0], 1, scale,
                          d, n)
        return new_s, out

    def mamba2_scan(self, const float[:, ::1] S, const float[::1] x, const float[::1] B, const float[::1] C,
                    float dA, float dt, bint in_place=True):
        """One token of one Mamba2 head's scan on S [p, n] (kernels.h mamba2_scan): x [p], B, C
        [n]. Returns (new S, y [p]): the new state written over a copy of S (in_place) or into
        another array."""
        cdef int p = S.shape[0], n = S.shape[1]
        if p < 1 or n < 1 or x.shape[0] != p or B.shape[0] != n or C.shape[0] != n:
            raise ValueError("need S [p, n], x [p] and B, C [n]")
        _check_row(n, n)
        new_s, src = _state_copies(S, in_place)
        y = np.empty(p, np.float32)
        cdef float[:, ::1] sv = new_s
        cdef float[:, ::1] iv = src
        cdef float[::1] yv = y
        self.kt.mamba2_scan(&sv[0, 0], &iv[0, 0], &yv[0], &x[0], &B[0], &C[0], dA, dt, p, n)
        return new_s, y

    def gdn_gates(self, const float[::1] alpha, const float[::1] beta, const float[::1] dt, const float[::1] a):
        """The delta rule's gates of n heads (kernels.h gdn_gates). Returns (decay, beta)."""
        cdef int n = alpha.shape[0]
        if beta.shape[0] != n or dt.shape[0] != n or a.shape[0] != n:
            raise ValueError("alpha, beta, dt and a need one value per head")
        _check_row(n, n)
        decay = np.array(alpha, dtype=np.float32, copy=True)
        out_beta = np.array(beta, dtype=np.float32, copy=True)
        cdef float[::1] dv = decay, bv = out_beta
        self.kt.gdn_gates(&dv[0], &bv[0], &dt[0], &a[0], n)
        return decay, out_beta
