/* A slot's memory: where each layer keeps a slot's keys and values (full planes, sliding-window
 * rings, short-convolution rows) and its recurrent states, and reading, writing and copying
 * them (snapshots, restore, copy_prefix: engine.h). The forward pass writes them at the
 * addresses engine_internal.h computes: KV rows in engine_attention.c (store_kv), conv rows in
 * engine_conv.c, states in engine_recurrent.c.
 *
 * KV memory, one block per slot, head-major so attention streams contiguous memory:
 *
 *   kv = [slot][layer][0 = k, 1 = v][kv head][plane of ctx_pad x head_dim]  (f16 or f32)
 *   v plane: row p = position p
 *   k plane: blocks of KEY_LANES positions, dimension-major inside (kernels.h key_index)
 *
 *   k plane   | block 0: d0[p0..p7] d1[p0..p7] ... | block 1: d0[p8..p15] ... |
 *
 * q8_0 (kv_type KV_Q8_0, kv_q8.h): a head row is head_dim / 32 blocks of an f16 scale and 32
 * int8 values (34 bytes, kv_row); v rows are those blocks in order; a k block keeps, per group of
 * 32 dimensions, the 8 positions' scales and then the group's values in quads of 4 dimensions,
 * key by key, so keys still stream front to back, 8 lanes of 4 dimensions per load (int8 dot
 * products), and a block is KEY_LANES * kv_row bytes:
 *
 *   v row p   | d q[0..31] | d q[32..63] | ...
 *   k block   | group 0: d[p0..p7] | p0 q[0..3] ... p7 q[0..3] | p0 q[4..7] ... | group 1: ...
 *
 * Rows are quantized as they are stored (store_kv), never re-quantized after.
 *
 * ctx_pad = ctx_len rounded up to KEY_LANES. A slot's first n tokens are the first
 * ceil(n / KEY_LANES) blocks of every k plane and the first n rows of every v plane (what
 * truncate, copy and snapshot rely on).
 *
 * Rings (swa_ring): a sliding-window layer needs only the keys of its window, so its planes
 * hold ring_len rows instead of ctx_pad, and position p lives at row p % ring_len. ring_len is
 * the widest window + max_tokens - 1 (a step writes up to max_tokens rows before its first row
 * attends back a window), rounded up to ATTN_CHUNK. Planes therefore differ in size per layer:
 *
 *   kv = [slot][layer: ctx_pad or ring_len rows per plane][0 = k, 1 = v][kv head][plane]
 *
 *   positions  0 ....... R-1 | R ....... 2R-1 | 2R ...       (R = ring_len, a multiple of
 *   ring row   0 ....... R-1 | 0 ....... R-1  | 0 ...         ATTN_CHUNK and of KEY_LANES)
 *
 * Short-convolution layers (lfm2) keep no keys or values but the input of their convolution,
 * b * x ([dim] per position, in the KV dtype; f16 when the KV is q8_0), as one row per position, so a slot's first n
 * tokens are the first n rows there too and truncate, copy and snapshot work as on full KV:
 *
 *   kv = [slot][layer: ... | conv layer: [ctx_pad][dim] rows, row p = position p | ...]
 *
 * NOTE: attention stays bit-identical to full planes: a chunk of ATTN_CHUNK keys never wraps,
 * so the chunk kernels run on the same keys in the same order with positions shifted by a
 * multiple of R (pos0 - S, chunk - S / ATTN_CHUNK); only where the keys are read from changes.
 * Rows a ring has overwritten are only read inside masked lanes (probability exactly 0).
 * The scheduler-side contract (how far back a slot can be cut) lives in engine_ext/pool.py.
 */
#include <string.h>

#include "engine_internal.h"
#include "kv_q8.h"

/* ---- KV planes ----------------------------------------------------------------------------- */

/* Bytes of a slot's first n tokens in one k plane (whole blocks) and one v plane. */
static inline size_t k_plane_bytes(const engine *e, int n) {
    return (size_t)(n + KEY_LANES - 1) / KEY_LANES * KEY_LANES * e->kv_row;
}

static inline size_t v_plane_bytes(const engine *e, int n) { return (size_t)n * e->kv_row; }

/* A ring layer's snapshot of n tokens: the rows of positions ring_lo(n) .. n-1, those a next
 * position attends to (its window before it), as [rows][head_dim] keys then values per head
 * (q8_0: rows of kv_row bytes in the v layout, keys too). */
static inline int ring_lo(const engine *e, int n) { return n - e->ring_reach > 0 ? n - e->ring_reach : 0; }

size_t engine_kv_snapshot_bytes(const engine *e, int n) {
    size_t total = 0;
    for (int l = 0; l < e->m.n_layers; l++)
        total += is_delta(e, l) ? 0
                 : is_conv(e, l) ? (size_t)n * e->conv_row_bytes
                               : (size_t)e->m.n_kv_heads * (is_ring(e, l) ? 2 * v_plane_bytes(e, n - ring_lo(e, n))
                                                                          : k_plane_bytes(e, n) + v_plane_bytes(e, n));
    return total;
}

/* Gather (to_ring = 0) or scatter (1) the rows of positions lo .. n-1 of one ring plane pair
 * and a [n - lo][head_dim] key buffer and value buffer. */
static void ring_rows(const engine *e, int slot, int l, int h, int lo, int n, char *keys, char *values, int to_ring) {
    const int hd = e->m.head_dim;
    const size_t elt = e->kv_elt, row = e->kv_row;
    char *kp = kv_plane(e, slot, l, 0, h), *vp = kv_plane(e, slot, l, 1, h);
    for (int p = lo; p < n; p++) {
        const int r = kv_row(e, l, p);
        char *kr = keys + (size_t)(p - lo) * row, *vr = values + (size_t)(p - lo) * row;
        if (e->kv_type == KV_Q8_0) kv_q8_key_row((uint8_t *)kp, (uint8_t *)kr, r, hd, to_ring);
        else for (int d = 0; d < hd; d++) {
            char *ring_elt = kp + key_index(r, d, hd) * elt;
            if (to_ring) memcpy(ring_elt, kr + d * elt, elt);
            else memcpy(kr + d * elt, ring_elt, elt);
        }
        if (to_ring) memcpy(vp + (size_t)r * row, vr, row);
        else memcpy(vr, vp + (size_t)r * row, row);
    }
}

/* Zero the lanes of key positions n.. in the last (partial) block of a k plane copy. */
static void clear_tail_lanes(const engine *e, char *kplane, int n) {
    if (n % KEY_LANES == 0) return;
    if (e->kv_type == KV_Q8_0) { /* per group: the lanes' scales, then per quad the lanes' 4 bytes */
        for (int g = 0; g < e->m.head_dim / KV_Q8_BLOCK; g++) {
            char *grp = kplane + kv_q8_key_group(n, g, e->m.head_dim);
            memset(grp + 2 * (n % KEY_LANES), 0, 2 * (KEY_LANES - n % KEY_LANES));
            for (int j = 0; j < KV_Q8_BLOCK; j += 4)
                memset(grp + kv_q8_key_byte(n % KEY_LANES, j), 0, 4 * (KEY_LANES - n % KEY_LANES));
        }
        return;
    }
    char *block = kplane + (size_t)(n / KEY_LANES) * KEY_LANES * e->m.head_dim * e->kv_elt;
    for (int d = 0; d < e->m.head_dim; d++)
        memset(block + ((size_t)d * KEY_LANES + n % KEY_LANES) * e->kv_elt, 0, (KEY_LANES - n % KEY_LANES) * e->kv_elt);
}

/* n bytes between a slot's memory and a snapshot buffer: out of the slot (to_slot = 0) or in. */
static inline void move_bytes(char *mem, char *buf, size_t n, int to_slot) {
    if (to_slot) memcpy(mem, buf, n);
    else memcpy(buf, mem, n);
}

/* Move a slot's first n tokens between its layers and `buf`, in engine_kv_snapshot_bytes's
 * layout (per layer: its conv rows; its ring rows, keys then values per head; or its k planes,
 * then its v planes): out of the slot (to_slot = 0: engine_kv_read, the stale lanes past n
 * cleared in the copy) or into it (1: engine_kv_write, which only reads buf). */
static void kv_transfer(const engine *e, int slot, int n, char *buf, int to_slot) {
    const size_t kb = k_plane_bytes(e, n), vb = v_plane_bytes(e, n);
    for (int l = 0; l < e->m.n_layers; l++) {
        if (is_conv(e, l)) {
            move_bytes(conv_row(e, slot, l, 0), buf, (size_t)n * e->conv_row_bytes, to_slot);
            buf += (size_t)n * e->conv_row_bytes;
            continue;
        }
        if (is_delta(e, l)) continue;
        if (is_ring(e, l)) {
            const int lo = ring_lo(e, n);
            const size_t rb = v_plane_bytes(e, n - lo);
            for (int h = 0; h < e->m.n_kv_heads; h++, buf += 2 * rb) ring_rows(e, slot, l, h, lo, n, buf, buf + rb, to_slot);
            continue;
        }
        for (int h = 0; h < e->m.n_kv_heads; h++, buf += kb) {
            move_bytes(kv_plane(e, slot, l, 0, h), buf, kb, to_slot);
            if (!to_slot) clear_tail_lanes(e, buf, n); /* stale lanes past n: not part of the snapshot */
        }
        for (int h = 0; h < e->m.n_kv_heads; h++, buf += vb) move_bytes(kv_plane(e, slot, l, 1, h), buf, vb, to_slot);
    }
}

void engine_kv_read(const engine *e, int slot, int n, void *dst) { kv_transfer(e, slot, n, dst, 0); }

void engine_kv_write(engine *e, int slot, int n, const void *src) { kv_transfer(e, slot, n, (char *)src, 1); }

void engine_kv_copy(engine *e, int src, int dst, int n) {
    if (src == dst) return;
    const size_t kb = k_plane_bytes(e, n), vb = v_plane_bytes(e, n);
    for (int l = 0; l < e->m.n_layers; l++) {
        if (is_conv(e, l)) {
            memcpy(conv_row(e, dst, l, 0), conv_row(e, src, l, 0), (size_t)n * e->conv_row_bytes);
            continue;
        }
        if (is_delta(e, l)) continue;
        /* a ring is copied whole: which of its rows are valid is the pool's bookkeeping */
        const size_t ck = is_ring(e, l) ? k_plane_bytes(e, e->ring_len) : kb;
        const size_t cv = is_ring(e, l) ? v_plane_bytes(e, e->ring_len) : vb;
        for (int h = 0; h < e->m.n_kv_heads; h++) {
            memcpy(kv_plane(e, dst, l, 0, h), kv_plane(e, src, l, 0, h), ck);
            memcpy(kv_plane(e, dst, l, 1, h), kv_plane(e, src, l, 1, h), cv);
        }
    }
}

/* ---- recurrent state (DeltaNet and Mamba2 layers) ------------------------------------------ */

size_t engine_state_bytes(const engine *e) { return sizeof(float) * e->rs_floats; }

void engine_state_read(const engine *e, int slot, int which, void *dst) {
    memcpy(dst, state_of(e, slot, which), engine_state_bytes(e));
}

void engine_state_write(engine *e, int slot, int which, const void *src) {
    memcpy(state_of(e, slot, which), src, engine_state_bytes(e));
}

void engine_state_copy(engine *e, int src, int which, int dst) {
    if (src == dst) return;
    memcpy(state_of(e, dst, which), state_of(e, src, which), engine_state_bytes(e));
}
