# cython: language_level=3, boundscheck=False, wraparound=False
"""The C engine behind Python: `Engine` owns the C memory (weights are borrowed from the model
file's memory map, which it keeps alive); `KernelTable` exposes single kernels for tests.

Design: this module converts and forwards; the contracts (validation, records, snapshots, the
fault hook) live in pool.py. Every call into C that does real work releases the GIL.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int8_t, int32_t, uint8_t, uint16_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

import numpy as np

from kernels cimport *

KERNEL_NAMES = ("auto", "scalar", "avx2", "avx512vnni")


cdef const kernel_table *_select(str name) except NULL:
    if name not in KERNEL_NAMES:
        raise ValueError(f"unknown kernel variant {name!r}; choose one of {', '.join(KERNEL_NAMES)}")
    cdef bytes raw = name.encode()
    cdef const kernel_table *kt = kernels_select(raw)
    if kt == NULL:
        raise ValueError(f"kernel variant {name!r} is not supported by this CPU; use 'auto' or 'scalar'")
    return kt


def resolve_variant(str name) -> str:
    """The kernel variant `name` ('auto', 'scalar', 'avx2', 'avx512vnni') selects on this CPU."""
    return _select(name).name.decode()


def avx2_supported() -> bool:
    return bool(kernels_avx2_supported())


def avx512vnni_supported() -> bool:
    return bool(kernels_avx512vnni_supported())


def peak_macs(str mix, long iters) -> int:
    """int8 products computed by `iters` rounds of an instruction mix ('vnni512', 'vnni256',
    'avx2'; kernels.h kernel_peak_macs), 0 if this CPU lacks it. Runs without the GIL."""
    cdef bytes raw = mix.encode()
    cdef const char *name = raw
    cdef long done
    with nogil:
        done = kernel_peak_macs(name, iters)
    return done


def read_sum(const uint8_t[::1] buf) -> int:
    """The wrapping 64-bit sum of `buf` read as little-endian words, a tail under 8 bytes byte by
    byte (kernels.h kernel_read_sum): every byte read once, in order, without the GIL (the
    memory-read probe of `bench versus --probe`)."""
    cdef size_t n = buf.shape[0]
    cdef uint64_t total
    if n == 0:
        return 0
    with nogil:
        total = kernel_read_sum(&buf[0], n)
    return total


def avx2_tile_pairs(int ggml_type) -> int:
    """(activation row, output) pairs the avx2 variant's prefill tiles (arch/x86_avx2_tiles.c)
    computed for weights of this ggml type since the process started, over all threads (0 off
    x86): a call of whole 16-row tiles on a tiled type adds rows x whole-group outputs."""
    return gemm_tiles_avx2_pairs(ggml_type)


def row_bytes(int ggml_type, int k) -> int:
    return ggml_row_bytes(ggml_type, k)


cdef weight_t _weight(object ref) except *:
    cdef const uint8_t[::1] raw = ref.data
    cdef weight_t w
    w.type = ref.ggml_type
    w.n_in = ref.shape[0]
    w.n_out = ref.shape[1] if len(ref.shape) > 1 else 1
    w.rows = &raw[0]
    w.x8 = NULL
    if len(ref.shape) < 3 and <size_t>raw.shape[0] != ggml_row_bytes(w.type, w.n_in) * <size_t>w.n_out:
        raise ValueError(f"tensor {ref.name!r}: {raw.shape[0]} bytes do not match its shape {ref.shape}")
    return w


cdef weight_t _experts(object ref) except *:
    """A 3-D expert tensor (n_in, per expert, n_expert) as one weight of per * n_expert rows."""
    cdef weight_t w = _weight(ref)
    w.n_out = ref.shape[1] * ref.shape[2]
    cdef const uint8_t[::1] raw = ref.data
    if <size_t>raw.shape[0] != ggml_row_bytes(w.type, w.n_in) * <size_t>w.n_out:
        raise ValueError(f"tensor {ref.name!r}: {raw.shape[0]} bytes do not match its shape {ref.shape}")
    return w


cdef const float *_f32(object ref, int n) except NULL:
    cdef const uint8_t[::1] raw = ref.data
    if ref.ggml_type != GGML_TYPE_F32 or raw.shape[0] != 4 * n:
        raise ValueError(f"tensor {ref.name!r}: expected {n} F32 values")
    return <const float *>&raw[0]


cdef const float *_f32_opt(dict tensors, str name, int n) except? NULL:
    """An optional F32 vector: NULL when the model has no such tensor."""
    if name not in tensors:
        return NULL
    return _f32(tensors[name], n)


# KV element types (kv_q8.h: KV_F32, KV_F16, KV_Q8_0)
_KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 2}


cdef class Engine:
    """The forward pass and KV memory for `num_slots` slots of `ctx_len` tokens.

    Not thread-safe: the caller serialises calls (pool.SlotPool holds a lock)."""

    cdef engine *e
    cdef object model_file  # keeps the weights' memory map alive
    cdef readonly int num_slots, ctx_len, n_vocab, n_threads, max_batch_tokens, ring_len
    cdef readonly size_t kv_bytes, state_bytes
    cdef readonly int rollback
    cdef readonly str kernel_variant, kv_dtype

    def __cinit__(self, model_file, int num_slots, int ctx_len, int threads, str kv_dtype,
                  int max_batch_tokens, str kernels, bint swa_ring=False, int rollback=0):
        self.e = NULL
        if kv_dtype not in _KV_TYPES:
            raise ValueError(f"kv_dtype must be one of {sorted(_KV_TYPES)}, got {kv_dtype!r}")
        if kv_dtype == "q8_0" and model_file.config.head_dim % 32:
            raise ValueError(f"kv_dtype q8_0 needs a head_dim that is a multiple of 32 "
                             f"(the model's is {model_file.config.head_dim}); use f16")
        cdef const kernel_table *kt = _select(kernels)
        cfg = model_file.config
        cdef model_desc m
        m.n_layers = cfg.n_layers
        m.dim = cfg.dim
        m.n_heads = cfg.n_heads
        m.n_kv_heads = cfg.n_kv_heads
        m.head_dim = cfg.head_dim
        m.ffn_dim = cfg.ffn_dim
        m.n_vocab = cfg.n_vocab
        m.rope_mode = int(cfg.rope_mode)
        m.activation = int(cfg.activation)
        m.rms_eps = cfg.rms_eps
        m.embed_scale = cfg.embed_scale
        m.attn_scale = cfg.attn_scale
        t = model_file.tensors
        m.rope_freqs = _f32_opt(t, "rope_freqs.weight", cfg.head_dim // 2)
        m.token_embd = _weight(t["token_embd.weight"])
        m.output = _weight(t["token_embd.weight" if cfg.tied_output else "output.weight"])
        m.output_norm = _f32(t[cfg.output_norm_name], cfg.dim)
        m.conv_len = cfg.conv_len
        m.rope_dim = cfg.rope_dim
        m.q_gate = cfg.q_gate
        ssm = cfg.ssm
        m.ssm_taps = ssm.conv if ssm is not None else 0
        m.ssm_d = ssm.d_state if ssm is not None else 0
        m.ssm_k_heads = ssm.k_heads if ssm is not None else 0
        m.ssm_v_heads = ssm.v_heads if ssm is not None else 0
        moe = cfg.moe
        m.n_expert = moe.n_expert if moe is not None else 0
        m.n_expert_used = moe.n_expert_used if moe is not None else 0
        m.expert_ffn = moe.expert_ffn if moe is not None else 0
        m.expert_norm = moe.norm_weights if moe is not None else 0
        m.qk_norm_full = cfg.qk_norm_full
        mb = cfg.mamba
        m.mamba_taps = mb.conv if mb is not None else 0
        m.mamba_state = mb.d_state if mb is not None else 0
        m.mamba_groups = mb.n_group if mb is not None else 0
        m.mamba_heads = mb.n_heads if mb is not None else 0
        m.mamba_inner = mb.inner if mb is not None else 0
        m.residual_scale = cfg.residual_scale
        m.logit_scale = cfg.logit_scale
        m.no_rope = not cfg.rope
        m.shexp_ungated = moe is not None and moe.shared_ffn > 0 and not moe.shared_gate
        m.release_rows = bool(getattr(model_file, "read_only_map", False))
        # zeroed: the weights a layer's kind lacks stay empty (NULL rows)
        cdef layer_weights *layers = <layer_weights *>calloc(cfg.n_layers, sizeof(layer_weights))
        if layers == NULL:
            raise MemoryError()
        cdef int status = ENGINE_OK
        cdef int kv_type = _KV_TYPES[kv_dtype]
        try:
            for i in range(cfg.n_layers):
                p = f"blk.{i}."
                layers[i].attn_norm = _f32(t[p + "attn_norm.weight"], cfg.dim)
                layers[i].ffn_norm = _f32(t[p + cfg.ffn_norm_name + ".weight"], cfg.dim)
                if moe is None:
                    layers[i].ffn_gate = _weight(t[p + "ffn_gate.weight"])
                    layers[i].ffn_up = _weight(t[p + "ffn_up.weight"])
                    layers[i].ffn_down = _weight(t[p + "ffn_down.weight"])
                else:  # experts (moe.c), and qwen2moe's shared expert in the dense FFN's place
                    layers[i].moe_router = _weight(t[p + "ffn_gate_inp.weight"])
                    layers[i].moe_gate = _experts(t[p + "ffn_gate_exps.weight"])
                    layers[i].moe_up = _experts(t[p + "ffn_up_exps.weight"])
                    layers[i].moe_down = _experts(t[p + "ffn_down_exps.weight"])
                    if moe.shared_ffn:
                        if moe.shared_gate:
                            layers[i].shexp_gate = _f32(t[p + "ffn_gate_inp_shexp.weight"], cfg.dim)
                        layers[i].ffn_gate = _weight(t[p + "ffn_gate_shexp.weight"])
                        layers[i].ffn_up = _weight(t[p + "ffn_up_shexp.weight"])
                        layers[i].ffn_down = _weight(t[p + "ffn_down_shexp.weight"])
                layers[i].rope_base = cfg.layer_rope_bases[i]
                layers[i].window = cfg.layer_windows[i]
                if cfg.conv_layers[i]:  # lfm2: a short-convolution block instead of attention
                    layers[i].conv_in = _weight(t[p + "shortconv.in_proj.weight"])
                    layers[i].conv_out = _weight(t[p + "shortconv.out_proj.weight"])
                    layers[i].conv_w = _f32(t[p + "shortconv.conv.weight"], cfg.dim * cfg.conv_len)
                    continue
                if cfg.recurrent_layers[i] and mb is not None:  # granitehybrid: a Mamba2 block
                    layers[i].mamba_in = _weight(t[p + "ssm_in.weight"])
                    layers[i].mamba_out = _weight(t[p + "ssm_out.weight"])
                    layers[i].mamba_conv = _f32(t[p + "ssm_conv1d.weight"], mb.conv_dim * mb.conv)
                    layers[i].mamba_conv_b = _f32(t[p + "ssm_conv1d.bias"], mb.conv_dim)
                    layers[i].mamba_dt = _f32(t[p + "ssm_dt.bias"], mb.n_heads)
                    layers[i].mamba_a = _f32(t[p + "ssm_a"], mb.n_heads)
                    layers[i].mamba_d = _f32(t[p + "ssm_d"], mb.n_heads)
                    layers[i].mamba_norm = _f32(t[p + "ssm_norm.weight"], mb.inner)
                    continue
                if cfg.recurrent_layers[i]:  # qwen35: a Gated DeltaNet block instead of attention
                    layers[i].ssm_qkv = _weight(t[p + "attn_qkv.weight"])
                    layers[i].ssm_z = _weight(t[p + "attn_gate.weight"])
                    layers[i].ssm_beta = _weight(t[p + "ssm_beta.weight"])
                    layers[i].ssm_alpha = _weight(t[p + "ssm_alpha.weight"])
                    layers[i].ssm_out = _weight(t[p + "ssm_out.weight"])
                    layers[i].ssm_conv = _f32(t[p + "ssm_conv1d.weight"], ssm.conv_dim * ssm.conv)
                    layers[i].ssm_dt = _f32(t[p + "ssm_dt.bias"], ssm.v_heads)
                    layers[i].ssm_a = _f32(t[p + "ssm_a"], ssm.v_heads)
                    layers[i].ssm_norm = _f32(t[p + "ssm_norm.weight"], ssm.d_state)
                    continue
                layers[i].attn_q = _weight(t[p + "attn_q.weight"])
                layers[i].attn_k = _weight(t[p + "attn_k.weight"])
                layers[i].attn_v = _weight(t[p + "attn_v.weight"])
                layers[i].bq = _f32_opt(t, p + "attn_q.bias", cfg.n_heads * cfg.head_dim)
                layers[i].bk = _f32_opt(t, p + "attn_k.bias", cfg.n_kv_heads * cfg.head_dim)
                layers[i].bv = _f32_opt(t, p + "attn_v.bias", cfg.n_kv_heads * cfg.head_dim)
                qn, kn = (cfg.n_heads, cfg.n_kv_heads) if cfg.qk_norm_full else (1, 1)
                layers[i].q_norm = _f32_opt(t, p + "attn_q_norm.weight", qn * cfg.head_dim)
                layers[i].k_norm = _f32_opt(t, p + "attn_k_norm.weight", kn * cfg.head_dim)
                layers[i].attn_output = _weight(t[p + "attn_output.weight"])
                if cfg.post_norms:
                    layers[i].post_attn_norm = _f32(t[p + "post_attention_norm.weight"], cfg.dim)
                layers[i].post_ffn_norm = _f32_opt(t, p + "post_ffw_norm.weight", cfg.dim)
            m.layers = layers
            with nogil:
                self.e = engine_create(&m, kt, num_slots, ctx_len, kv_type, max_batch_tokens, threads, swa_ring,
                                       rollback, &status)
        finally:
            free(layers)
        if self.e == NULL:
            if status == ENGINE_ENOMEM:
                # per position: keys and values of an attention layer, the conv input of a conv layer
                # (none for a DeltaNet layer: its f32 state is fixed per slot, and per rollback state)
                row = sum(0 if rec else cfg.dim if conv else 2 * cfg.n_kv_heads * cfg.head_dim
                          for conv, rec in zip(cfg.conv_layers, cfg.recurrent_layers))
                state = 4 * sum(cfg.recurrent_layers) * cfg.recurrent_state_floats
                elt = {"f32": 4, "f16": 2, "q8_0": 34 / 32}[kv_dtype]
                kv_gib = (num_slots * row * (-(-ctx_len // KEY_LANES) * KEY_LANES) * elt
                          + num_slots * (1 + rollback) * state) / 2**30
                raise MemoryError(f"cannot allocate {kv_gib:.1f} GiB of KV and recurrent state for {num_slots} slots "
                                  f"x {ctx_len} tokens (plus weights and step buffers); use fewer slots or a shorter "
                                  "ctx_len")
            raise ValueError("the engine rejected the model or its arguments (shapes or types unsupported)")
        self.model_file = model_file
        self.num_slots = num_slots
        self.ctx_len = ctx_len
        self.n_vocab = cfg.n_vocab
        self.n_threads = engine_n_threads(self.e)
        self.max_batch_tokens = max_batch_tokens
        self.kv_bytes = engine_kv_bytes(self.e)
        self.ring_len = engine_ring_len(self.e)
        self.kernel_variant = kt.name.decode()
        self.kv_dtype = kv_dtype
        self.state_bytes = engine_state_bytes(self.e)
        self.rollback = rollback

    def __dealloc__(self):
        if self.e != NULL:
            engine_destroy(self.e)
            self.e = NULL

    def forward(self, const int32_t[:, ::1] items, const int32_t[::1] tokens, float[:, ::1] logits,
                int fault_layer=-1):
        """items: int32 [n, 4] (slot, start_pos, n_tokens, want_logits: logits of the item's last
        that many tokens), validated by the caller; tokens: the items' ids concatenated;
        logits: float32 [sum of want_logits, n_vocab] written in place.
        Returns the engine status (0 ok, ENGINE_EFAULT when the test fault fired)."""
        cdef int n = items.shape[0], i, off = 0, n_want = 0, status
        if items.shape[1] != 4 or logits.shape[1] != self.n_vocab:
            raise ValueError("forward: bad array shapes")
        for i in range(n):
            if items[i, 3] < 0 or items[i, 3] > items[i, 2]:
                raise ValueError(f"forward: item {i} wants {items[i, 3]} logits rows of {items[i, 2]} tokens")
            n_want += items[i, 3]
        if logits.shape[0] != n_want:
            raise ValueError(f"forward: the items want {n_want} logits rows but the logits array has {logits.shape[0]}")
        cdef engine_item *its = <engine_item *>malloc(sizeof(engine_item) * max(n, 1))
        if its == NULL:
            raise MemoryError()
        cdef float *out = &logits[0, 0] if logits.shape[0] > 0 else NULL
        try:
            for i in range(n):
                its[i].slot = items[i, 0]
                its[i].start_pos = items[i, 1]
                its[i].n_tokens = items[i, 2]
                its[i].want_logits = items[i, 3]
                if off + items[i, 2] > tokens.shape[0]:
                    raise ValueError("forward: token array shorter than the items")
                its[i].tokens = &tokens[off]
                off += items[i, 2]
            with nogil:
                status = engine_forward(self.e, its, n, out, fault_layer)
        finally:
            free(its)
        if status == ENGINE_EINVAL:
            raise ValueError("forward: the engine rejected the batch (slot, position or token id out of range)")
        if status == ENGINE_EINTERNAL:
            raise RuntimeError("forward: a step walked another number of phases than the engine counted (engine bug)")
        return status

    def workers_busy(self) -> int:
        """Pool workers inside a task at this instant (engine_workers_busy; tests: 0 after any
        forward has returned)."""
        return engine_workers_busy(self.e)

    def moe_active(self) -> list:
        """Per layer, the experts the last step ran (each once for all the rows that chose it);
        0 on dense layers."""
        return [engine_moe_active(self.e, l) for l in range(self.model_file.config.n_layers)]

    def kv_snapshot_bytes(self, int n) -> int:
        """Bytes of the KV of n tokens as kv_snapshot writes them."""
        if not 0 <= n <= self.ctx_len:
            raise ValueError(f"length {n} out of range")
        return engine_kv_snapshot_bytes(self.e, n)

    def kv_snapshot(self, int slot, int n, bytes head) -> bytes:
        """bytes: `head` followed by the KV of the first n tokens of `slot` (engine_kv_read)."""
        self._check(slot, n)
        cdef Py_ssize_t hlen = len(head)
        cdef size_t kv_len = engine_kv_snapshot_bytes(self.e, n)
        out = PyBytes_FromStringAndSize(NULL, hlen + kv_len)
        cdef char *dst = PyBytes_AS_STRING(out)
        memcpy(dst, <const char *>head, hlen)
        with nogil:
            engine_kv_read(self.e, slot, n, dst + hlen)
        return out

    def kv_restore(self, int slot, int n, const uint8_t[::1] kv):
        """Overwrite the KV of the first n tokens of `slot` from bytes laid out as kv_snapshot
        writes them."""
        self._check(slot, n)
        if <size_t>kv.shape[0] != engine_kv_snapshot_bytes(self.e, n):
            raise ValueError("kv_restore: wrong KV byte count")
        if n == 0:
            return
        with nogil:
            engine_kv_write(self.e, slot, n, &kv[0])

    def kv_copy(self, int src, int dst, int n):
        self._check(src, n)
        self._check(dst, n)
        with nogil:
            engine_kv_copy(self.e, src, dst, n)

    def state_read(self, int slot, int which) -> bytes:
        """One slot's recurrent state entry `which` (engine_state_read: the state at length n is
        entry n % (rollback + 1))."""
        self._check(slot, 0)
        if not 0 <= which <= self.rollback:
            raise ValueError(f"state entry {which} out of range")
        out = PyBytes_FromStringAndSize(NULL, self.state_bytes)
        cdef char *dst = PyBytes_AS_STRING(out)
        with nogil:
            engine_state_read(self.e, slot, which, dst)
        return out

    def state_write(self, int slot, int which, const uint8_t[::1] state):
        """Overwrite one slot's recurrent state entry `which` with bytes laid out as state_read's."""
        self._check(slot, 0)
        if not 0 <= which <= self.rollback:
            raise ValueError(f"state entry {which} out of range")
        if <size_t>state.shape[0] != self.state_bytes:
            raise ValueError("state_write: wrong state byte count")
        if self.state_bytes:
            with nogil:
                engine_state_write(self.e, slot, which, &state[0])

    def state_copy(self, int src, int which, int dst):
        """dst's state entry `which` = src's (the state at one length, copied to another slot)."""
        self._check(src, 0)
        self._check(dst, 0)
        if not 0 <= which <= self.rollback:
            raise ValueError(f"state entry {which} out of range")
        with nogil:
            engine_state_copy(self.e, src, which, dst)

    cdef _check(self, int slot, int n):
        if not (0 <= slot < self.num_slots and 0 <= n <= self.ctx_len):
            raise ValueError(f"slot {slot} / length {n} out of range")


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
