/* The attention block (llama, qwen2, qwen3, gemma3, the MoEs' and qwen35's and granite's
 * attention layers) in engine.c's phase sequence: the q, k, v matmuls; each row's biases, q/k
 * norms and rope, and its keys and values stored in the slot's planes or ring (qkv_row,
 * store_kv; the layout is engine_kv.c's); attention units over them (plan_attention: segment x
 * kv head x query tile, or one unit per key chunk and a merge when a step has few); the output
 * gate (qwen35) and the output matmul.
 */
#include <math.h>
#include <string.h>

#include "engine_internal.h"
#include "kv_q8.h"

/* Store one row's key and value of kv head h at position pos of a slot's planes. */
static void store_kv(engine *e, int slot, int layer, int h, int pos, const float *key, const float *value) {
    const int hd = e->m.head_dim;
    pos = kv_row(e, layer, pos);
    char *kp = kv_plane(e, slot, layer, 0, h), *vd = kv_plane(e, slot, layer, 1, h) + (size_t)pos * e->kv_row;
    if (e->kv_type == KV_Q8_0) { /* quantized as written: the key through a row buffer */
        uint8_t tmp[e->kv_row];
        kv_q8_quantize_row(tmp, key, hd);
        kv_q8_key_row((uint8_t *)kp, tmp, pos, hd, 1);
        kv_q8_quantize_row((uint8_t *)vd, value, hd);
    } else if (e->kv_f16) {
        uint16_t *kh = (uint16_t *)kp;
        uint16_t tmp[hd];
        e->kt->f32_to_f16(tmp, key, hd);
        for (int d = 0; d < hd; d++) kh[key_index(pos, d, hd)] = tmp[d];
        e->kt->f32_to_f16((uint16_t *)vd, value, hd);
    } else {
        float *kf = (float *)kp;
        for (int d = 0; d < hd; d++) kf[key_index(pos, d, hd)] = key[d];
        memcpy(vd, value, sizeof(float) * hd);
    }
}

static inline size_t part_floats(const engine *e, int n_q) {
    return (size_t)n_q * e->group * (e->m.head_dim + 2); /* acc [n_q][group*hd], ml [n_q*group][2] */
}

static void attention_phase(engine *e, int p, int layer, int ith) {
    const model_desc *m = &e->m;
    float *scratch = e->attn_scratch + (size_t)ith * e->attn_floats;
    const float scale = m->attn_scale;
    const int window = m->layers[layer].window;
    const int lda = e->group * m->head_dim;
    FOR_EACH_UNIT(e, p, e->n_units, u) {
        const attn_unit *au = &e->units[u];
        const step_seg *sg = &e->segs[au->seg];
        int row = sg->row0 + au->q0;
        int col = au->kv_head * lda;
        const float *q = e->q + (size_t)row * e->q_dim + col;
        const void *k = kv_plane(e, sg->slot, layer, 0, au->kv_head), *v = kv_plane(e, sg->slot, layer, 1, au->kv_head);
        const int ring = is_ring(e, layer) ? e->ring_len : 0;
        if (au->chunk < 0) {
            attention_rows_ring(e->kt, e->xb + (size_t)row * e->q_dim + col, e->q_dim, q, e->q_dim, k, v, e->kv_type,
                                sg->pos0 + au->q0, au->n_q, e->group, m->head_dim, scale, window, ring, scratch);
        } else {
            /* a ring: the chunk's keys sit shift positions lower (engine_kv.c) */
            const int shift = ring ? au->chunk * ATTN_CHUNK / ring * ring : 0;
            float *acc = e->parts + au->part, *ml = acc + (size_t)au->n_q * lda;
            e->kt->attention_chunk(acc, lda, ml, q, e->q_dim, k, v, e->kv_type, sg->pos0 + au->q0 - shift, au->n_q,
                                   e->group, m->head_dim, scale, window, au->chunk - shift / ATTN_CHUNK, scratch);
        }
    }
    phase_end(e, p, e->n_units);
}

/* Fold split attention's partial states in chunk order (as attention_rows does) and finish. */
static void merge_phase(engine *e, int p) {
    const int lda = e->group * e->m.head_dim;
    FOR_EACH_UNIT(e, p, e->n_merges, u) {
        const attn_unit *mu = &e->merges[u];
        const step_seg *sg = &e->segs[mu->seg];
        const size_t step = part_floats(e, mu->n_q);
        float *acc = e->parts + mu->part, *ml = acc + (size_t)mu->n_q * lda;
        for (int c = 1; c < mu->n_parts; c++) {
            const float *pacc = acc + c * step, *pml = pacc + (size_t)mu->n_q * lda;
            e->kt->attention_fold(acc, lda, ml, pacc, lda, pml, mu->n_q, e->group, e->m.head_dim);
        }
        int row = sg->row0 + mu->q0;
        attention_finish(e->xb + (size_t)row * e->q_dim + mu->kv_head * lda, e->q_dim, acc, lda, ml, mu->n_q,
                         e->group, e->m.head_dim);
    }
    phase_end(e, p, e->n_merges);
}

/* One row's q, k, v after the matmuls: biases, per-head norms, rope, then the KV store. */
static void qkv_row(engine *e, const layer_weights *L, int l, int r) {
    const model_desc *m = &e->m;
    const kernel_table *kt = e->kt;
    const int hd = m->head_dim;
    float *q = e->q + (size_t)r * e->q_dim, *k = e->k + (size_t)r * e->kv_dim, *v = e->v + (size_t)r * e->kv_dim;
    if (m->q_gate) /* per head: hd queries, then hd gate values */
        for (int h = 0; h < m->n_heads; h++) {
            const float *src = e->qg + (size_t)r * 2 * e->q_dim + (size_t)h * 2 * hd;
            memcpy(q + h * hd, src, sizeof(float) * hd);
            memcpy(e->qgate + (size_t)r * e->q_dim + h * hd, src + hd, sizeof(float) * hd);
        }
    if (L->bq)
        for (int i = 0; i < e->q_dim; i++) q[i] += L->bq[i];
    if (L->bk)
        for (int i = 0; i < e->kv_dim; i++) k[i] += L->bk[i];
    if (L->bv)
        for (int i = 0; i < e->kv_dim; i++) v[i] += L->bv[i];
    if (L->q_norm && m->qk_norm_full) {
        kt->rmsnorm(q, q, L->q_norm, m->n_heads * hd, m->rms_eps);
        kt->rmsnorm(k, k, L->k_norm, m->n_kv_heads * hd, m->rms_eps);
    } else if (L->q_norm) {
        for (int h = 0; h < m->n_heads; h++) kt->rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, m->rms_eps);
        for (int h = 0; h < m->n_kv_heads; h++) kt->rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, m->rms_eps);
    }
    const float *cs = e->rope_cs + ((size_t)e->layer_rope[l] * e->max_tokens + r) * hd;
    if (m->no_rope) {
        /* granite 4.0 H: no positions in attention (the Mamba2 layers carry the order) */
    } else if (m->rope_dim && m->rope_dim < hd) { /* partial: the first rope_dim dims of each head */
        for (int h = 0; h < m->n_heads; h++) kt->rope_neox(q + h * hd, 1, m->rope_dim, cs);
        for (int h = 0; h < m->n_kv_heads; h++) kt->rope_neox(k + h * hd, 1, m->rope_dim, cs);
    } else if (m->rope_mode == ROPE_NEOX) {
        kt->rope_neox(q, m->n_heads, hd, cs);
        kt->rope_neox(k, m->n_kv_heads, hd, cs);
    } else {
        kt->rope(q, m->n_heads, hd, cs);
        kt->rope(k, m->n_kv_heads, hd, cs);
    }
    for (int h = 0; h < m->n_kv_heads; h++) store_kv(e, e->row_slot[r], l, h, e->row_pos[r], k + h * hd, v + h * hd);
}

/* The attention block of layer l: its 8 phases from p on (engine.c). Returns the next
 * phase, or -1 when the test hook fired (after the layer stored its KV rows). */
int attention_block(engine *e, const layer_weights *L, int l, int p, int ith, int nth) {
    const int T = e->n_rows, dim = e->m.dim, nu = n_row_units(T);
    norm_phase(e, p++, L->attn_norm,
               is_block_type(L->attn_q.type) || is_block_type(L->attn_k.type) || is_block_type(L->attn_v.type),
               proj_before_layer(e, l));
    {
        mm_job jobs[3] = {{&L->attn_q, e->m.q_gate ? e->qg : e->q, e->m.q_gate ? 2 * e->q_dim : e->q_dim, 0},
                          {&L->attn_k, e->k, e->kv_dim, 0},
                          {&L->attn_v, e->v, e->kv_dim, 0}};
        act_rows in = input_view(e, e->xb, dim);
        matmul_phase(e, p++, jobs, 3, &in, T, nth);
    }
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, T, &r0, &r1);
        for (int r = r0; r < r1; r++) qkv_row(e, L, l, r);
    }
    phase_end(e, p++, nu);
    if (l == e->fault_layer) return -1; /* test hook */
    attention_phase(e, p++, l, ith);
    merge_phase(e, p++);
    if (is_block_type(L->attn_output.type) || e->m.q_gate) {
        FOR_EACH_UNIT(e, p, nu, u) {
            int r0, r1;
            unit_rows(u, T, &r0, &r1);
            for (int r = r0; r < r1; r++) {
                if (e->m.q_gate) { /* attention output * sigmoid(gate) */
                    float *o = e->xb + (size_t)r * e->q_dim;
                    const float *g = e->qgate + (size_t)r * e->q_dim;
                    for (int i = 0; i < e->q_dim; i++) o[i] *= 1.0f / (1.0f + expf(-g[i]));
                }
                if (is_block_type(L->attn_output.type)) quantize_row(e, e->xb, e->q_dim, r);
            }
        }
        phase_end(e, p, nu);
    }
    p++;
    {
        /* without a post-norm the output adds straight into the residual stream */
        const int via = output_via_proj(e, L->post_attn_norm);
        mm_job job = {&L->attn_output, via ? e->proj : e->x, dim, !via};
        act_rows in = input_view(e, e->xb, e->q_dim);
        matmul_phase(e, p++, &job, 1, &in, T, nth);
    }
    block_residual_phase(e, p, L->post_attn_norm);
    p++;
    return p;
}

/* Fill the step's attention units: segment x kv head x query tile, latest tiles first (they
 * see the most keys) so dynamic scheduling ends balanced. With few units (decode), each unit
 * is split into one unit per key chunk plus a merge unit, so every thread streams KV. */
void plan_attention(engine *e) {
    const int q_tile = ATTN_MAX_ROWS / e->group, nth = threadpool_size(e->tp);
    e->n_units = e->n_merges = 0;
    for (int s = 0; s < e->n_segs; s++) {
        int n_tiles = (e->segs[s].n + q_tile - 1) / q_tile;
        for (int t = n_tiles - 1; t >= 0; t--)
            for (int h = 0; h < e->m.n_kv_heads; h++) {
                attn_unit *u = &e->units[e->n_units++];
                u->seg = s;
                u->kv_head = h;
                u->q0 = t * q_tile;
                u->n_q = e->segs[s].n - u->q0 < q_tile ? e->segs[s].n - u->q0 : q_tile;
                u->chunk = -1;
                u->n_parts = 0;
            }
    }
    if (e->n_units >= SPLIT_BELOW_UNITS * nth || nth == 1) return;
    /* split: count the parts first; keep whole units if they do not fit */
    size_t need = 0;
    int n_split = 0;
    for (int i = 0; i < e->n_units; i++) {
        const attn_unit *u = &e->units[i];
        int n_chunks = (e->segs[u->seg].pos0 + u->q0 + u->n_q + ATTN_CHUNK - 1) / ATTN_CHUNK;
        need += (size_t)n_chunks * part_floats(e, u->n_q);
        /* NOTE: one plan serves every layer: on sliding-window layers the units of chunks
         * before the window yield empty states at once (and the fold skips them). */
        n_split += n_chunks;
    }
    if (need > PART_FLOATS || n_split > e->max_units) return;
    int n_whole = e->n_units;
    memcpy(e->merges, e->units, sizeof(attn_unit) * n_whole);
    e->n_units = 0;
    size_t at = 0;
    for (int i = 0; i < n_whole; i++) {
        attn_unit *mu = &e->merges[i];
        int n_chunks = (e->segs[mu->seg].pos0 + mu->q0 + mu->n_q + ATTN_CHUNK - 1) / ATTN_CHUNK;
        mu->part = at;
        mu->n_parts = n_chunks;
        for (int c = 0; c < n_chunks; c++) {
            attn_unit *u = &e->units[e->n_units++];
            *u = *mu;
            u->chunk = c;
            u->part = at;
            at += part_floats(e, mu->n_q);
        }
    }
    e->n_merges = n_whole;
}
