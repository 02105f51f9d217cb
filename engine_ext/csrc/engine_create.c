/* engine_create and engine_destroy: every buffer of an engine allocated once, at start-up
 * (struct engine, engine_internal.h, gives each one's shape), the KV layout's sizes and offsets
 * (engine_kv.c), the rope tables; and the engine's small queries.
 */
#define _GNU_SOURCE /* mmap flags, madvise */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "engine_internal.h"
#include "kv_q8.h"

void *xalloc(size_t n, int *ok) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) *ok = 0;
    return p;
}

/* Large, long-lived buffers (KV, packed weights) come zeroed from the OS, asking for
 * transparent huge pages: both are streamed every step, and 2 MiB pages spare the TLB.
 * populate: fault every page in now (KV: the memory is really committed at start-up, and the
 * first steps on a fresh slot do not pay for zeroing pages). */
void *big_alloc(size_t n, int populate) {
#ifdef __linux__
    if (n >= (1u << 21)) {
        void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        madvise(p, n, MADV_HUGEPAGE); /* a hint; failure is harmless */
        if (populate) {
#ifdef MADV_POPULATE_WRITE
            if (madvise(p, n, MADV_POPULATE_WRITE) != 0) {
                if (errno != EINVAL) { /* out of memory: fail here rather than later */
                    munmap(p, n);
                    return NULL;
                }
#else
            {
#endif
                for (size_t i = 0; i < n; i += 4096) ((volatile char *)p)[i] = 0; /* kernels < 5.14 */
            }
        }
        return p;
    }
#endif
    (void)populate;
    return calloc(n ? n : 1, 1);
}

void big_free(void *p, size_t n) {
    if (!p) return;
#ifdef __linux__
    if (n >= (1u << 21)) {
        munmap(p, n);
        return;
    }
#endif
    free(p);
}

engine *engine_create(const model_desc *m, const kernel_table *kt, int num_slots, int ctx_len,
                      int kv_type, int max_tokens, int n_threads, int swa_ring, int rollback, int *status) {
    *status = ENGINE_EINVAL;
    if (!m || !kt || num_slots < 1 || ctx_len < 1 || max_tokens < 1 || n_threads < 1 || rollback < 0 || !model_ok(m) ||
        kv_type < KV_F32 || kv_type > KV_Q8_0 || (kv_type == KV_Q8_0 && m->head_dim % KV_Q8_BLOCK))
        return NULL;
    *status = ENGINE_ENOMEM;
    engine *e = calloc(1, sizeof(*e));
    if (!e) return NULL;
    int ok = 1;
    e->m = *m;
    e->layers = xalloc(sizeof(layer_weights) * m->n_layers, &ok);
    if (ok) memcpy(e->layers, m->layers, sizeof(layer_weights) * m->n_layers);
    e->m.layers = e->layers;
    if (ok) {
        e->tp = threadpool_create(n_threads); /* packing already runs on it */
        if (!e->tp) ok = 0;
    }
    if (ok && m->n_expert) ok = moe_slices(e);
    if (ok) ok = pack_weights(e);
    if (ok && m->n_expert) ok = moe_create(e, max_tokens);
    e->kt = kt;
    e->num_slots = num_slots;
    e->ctx_len = ctx_len;
    e->ctx_pad = (ctx_len + KEY_LANES - 1) / KEY_LANES * KEY_LANES;
    e->kv_type = kv_type;
    e->kv_f16 = kv_type != KV_F32;
    e->max_tokens = max_tokens;
    e->q_dim = m->n_heads * m->head_dim;
    e->kv_dim = m->n_kv_heads * m->head_dim;
    e->group = m->n_heads / m->n_kv_heads;
    int max_k = m->dim > e->q_dim ? m->dim : e->q_dim;
    e->max_k = max_k > m->ffn_dim ? max_k : m->ffn_dim;
    e->key_dim = m->ssm_k_heads * m->ssm_d;
    e->value_dim = m->ssm_v_heads * m->ssm_d;
    e->conv_dim = 2 * e->key_dim + e->value_dim;
    if (m->mamba_heads) { /* Mamba2: the conv runs over x, B, C; the out matmul reads inner channels */
        e->value_dim = m->mamba_inner;
        e->conv_dim = m->mamba_inner + 2 * m->mamba_groups * m->mamba_state;
    }
    if (e->value_dim > e->max_k) e->max_k = e->value_dim;
    e->kv_elt = e->kv_f16 ? 2 : 4;
    e->kv_row = kv_type == KV_Q8_0 ? kv_q8_row_bytes(m->head_dim) : (size_t)m->head_dim * e->kv_elt;
    int max_window = 0;
    for (int l = 0; l < m->n_layers; l++) max_window = m->layers[l].window > max_window ? m->layers[l].window : max_window;
    if (swa_ring && max_window > 0) {
        long ring = ((long)max_window + max_tokens - 1 + ATTN_CHUNK - 1) / ATTN_CHUNK * ATTN_CHUNK;
        if (ring < e->ctx_pad) { /* else a ring saves nothing: full planes */
            e->ring_len = (int)ring;
            e->ring_reach = max_window - 1;
        }
    }
    e->plane_rows = xalloc(sizeof(int) * m->n_layers, &ok);
    e->layer_off = xalloc(sizeof(size_t) * m->n_layers, &ok);
    e->conv_row_bytes = (size_t)m->dim * e->kv_elt;
    if (ok)
        for (int l = 0; l < m->n_layers; l++) {
            e->plane_rows[l] = e->ring_len && m->layers[l].window > 0 ? e->ring_len : e->ctx_pad;
            e->layer_off[l] = e->slot_bytes;
            if (!is_state_layer(&m->layers[l]))
                e->slot_bytes += is_conv_layer(&m->layers[l]) ? (size_t)e->ctx_pad * e->conv_row_bytes
                                                              : 2 * (size_t)m->n_kv_heads * e->plane_rows[l] * e->kv_row;
        }
    if (m->conv_len) { /* the kernels read the taps of 8 channels at once: [conv_len][dim] */
        e->conv_taps = xalloc(sizeof(float) * m->n_layers * m->conv_len * m->dim, &ok);
        e->bcx = xalloc(sizeof(float) * max_tokens * 3 * m->dim, &ok);
        for (int l = 0; ok && l < m->n_layers; l++) {
            if (!is_conv_layer(&m->layers[l])) continue;
            float *taps = e->conv_taps + (size_t)l * m->conv_len * m->dim;
            for (int c = 0; c < m->dim; c++)
                for (int i = 0; i < m->conv_len; i++) taps[(size_t)i * m->dim + c] = m->layers[l].conv_w[(size_t)c * m->conv_len + i];
        }
    }
    if (ok && e->conv_dim) ok = delta_create(e, m, max_tokens, n_threads, rollback);
    e->kv_bytes = (size_t)num_slots * e->slot_bytes;
    if (ok) e->kv = big_alloc(e->kv_bytes, 1);
    if (!e->kv) ok = 0;
    /* one rope table per distinct layer base (gemma3: local 10000 and global layers) */
    e->layer_rope = xalloc(sizeof(int) * m->n_layers, &ok);
    e->inv_freq = xalloc(sizeof(double) * (m->head_dim / 2) * m->n_layers, &ok);
    if (ok)
        for (int l = 0; l < m->n_layers; l++) {
            int t = 0;
            while (t < l && m->layers[t].rope_base != m->layers[l].rope_base) t++;
            if (t < l) {
                e->layer_rope[l] = e->layer_rope[t];
                continue;
            }
            e->layer_rope[l] = e->n_rope;
            double *f = e->inv_freq + (size_t)e->n_rope++ * (m->head_dim / 2);
            const int rd = m->rope_dim ? m->rope_dim : m->head_dim;
            for (int i = 0; i < m->head_dim / 2; i++) {
                f[i] = i < rd / 2 ? pow(m->layers[l].rope_base, -2.0 * i / rd) : 0.0;
                if (m->rope_freqs) f[i] /= m->rope_freqs[i];
            }
        }

    size_t T = (size_t)max_tokens;
    e->x = xalloc(sizeof(float) * T * m->dim, &ok);
    e->xb = xalloc(sizeof(float) * T * e->max_k, &ok);
    e->q = xalloc(sizeof(float) * T * e->q_dim, &ok);
    e->k = xalloc(sizeof(float) * T * e->kv_dim, &ok);
    e->v = xalloc(sizeof(float) * T * e->kv_dim, &ok);
    e->gate = xalloc(sizeof(float) * T * m->ffn_dim, &ok);
    e->up = xalloc(sizeof(float) * T * m->ffn_dim, &ok);
    e->proj = xalloc(sizeof(float) * T * m->dim, &ok);
    if (m->q_gate) {
        e->qg = xalloc(sizeof(float) * T * 2 * e->q_dim, &ok);
        e->qgate = xalloc(sizeof(float) * T * e->q_dim, &ok);
    }
    e->aqs = xalloc(T * e->max_k, &ok);
    e->ad = xalloc(sizeof(float) * T * (e->max_k / QK + 1), &ok);
    e->as = xalloc(sizeof(float) * T * (e->max_k / QK + 1), &ok);
    e->rope_cs = xalloc(sizeof(float) * T * m->head_dim * (e->n_rope ? e->n_rope : 1), &ok);
    e->tokens = xalloc(sizeof(int32_t) * T, &ok);
    e->row_pos = xalloc(sizeof(int) * T, &ok);
    e->row_slot = xalloc(sizeof(int) * T, &ok);
    e->segs = xalloc(sizeof(step_seg) * T, &ok);
    int q_tile = ATTN_MAX_ROWS / e->group;
    /* each segment of n rows makes n_kv * ceil(n / q_tile) units; sum over segments <= this */
    e->max_units = m->n_kv_heads * (max_tokens / q_tile + max_tokens);
    e->units = xalloc(sizeof(attn_unit) * e->max_units, &ok);
    e->merges = xalloc(sizeof(attn_unit) * e->max_units, &ok);
    e->parts = xalloc(sizeof(float) * PART_FLOATS, &ok);
    e->logit_src = xalloc(sizeof(int) * T, &ok);
    e->attn_floats = (attn_scratch_floats(ctx_len, m->head_dim) + 15) & ~(size_t)15;
    e->attn_scratch = xalloc(sizeof(float) * e->attn_floats * n_threads, &ok);
    e->n_phases = PHASES_PER_LAYER * m->n_layers + PHASES_EXTRA;
    e->sync = xalloc(sizeof(phase_sync) * (e->n_phases + PHASES_PER_LAYER), &ok);
    if (!ok) {
        engine_destroy(e);
        return NULL;
    }
    *status = ENGINE_OK;
    return e;
}

void engine_destroy(engine *e) {
    if (!e) return;
    threadpool_destroy(e->tp);
    big_free(e->packed, e->packed_bytes);
    big_free(e->kv, e->kv_bytes);
    big_free(e->rstate, sizeof(float) * e->rs_floats * e->num_slots * (e->rollback + 1));
    void *moe_bufs[] = {e->experts, e->mlogits, e->mn_active, e->msel, e->mpair_of, e->mw, e->mshg, e->moff, e->mactive,
                        e->mpair_row, e->mx, e->mqs, e->md, e->ms, e->mgate, e->mup, e->mout};
    for (size_t i = 0; i < sizeof(moe_bufs) / sizeof(moe_bufs[0]); i++) free(moe_bufs[i]);
    void *ssm_bufs[] = {e->rs_off, e->ssm_taps, e->ones, e->sqkv, e->sconv, e->sz, e->sb, e->sa, e->ssm_scratch, e->qg, e->qgate};
    for (size_t i = 0; i < sizeof(ssm_bufs) / sizeof(ssm_bufs[0]); i++) free(ssm_bufs[i]);
    void *bufs[] = {e->layers, e->plane_rows, e->layer_off, e->layer_rope, e->inv_freq, e->x, e->xb, e->q, e->k, e->v, e->gate, e->up, e->proj,
                    e->conv_taps, e->bcx,
                    e->aqs, e->ad, e->as, e->rope_cs, e->tokens, e->row_pos, e->row_slot, e->segs,
                    e->units, e->merges, e->parts, e->logit_src, e->attn_scratch, (void *)e->sync};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
    free(e);
}

size_t engine_kv_bytes(const engine *e) { return e->kv_bytes; }
int engine_ring_len(const engine *e) { return e->ring_len; }
int engine_n_threads(const engine *e) { return threadpool_size(e->tp); }

int engine_workers_busy(engine *e) { return threadpool_busy(e->tp); }
int engine_moe_active(const engine *e, int layer) {
    return e->mn_active && layer >= 0 && layer < e->m.n_layers && is_moe_layer(&e->layers[layer]) ? e->mn_active[layer] : 0;
}
