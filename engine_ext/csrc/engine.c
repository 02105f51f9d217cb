/* The decoder forward pass over a pool of KV slots: llama, qwen2, qwen3, gemma3, lfm2, qwen35,
 * granitehybrid and the MoEs, one phase sequence whose optional parts (biases, q/k norms,
 * post-norms, sliding windows, short convolutions, gated attention, Gated DeltaNet and Mamba2
 * layers, the granite scales) are switched by the model description (engine.h).
 *
 * Design: a forward call is cut into steps of at most max_tokens rows; a step holds segments
 * (consecutive tokens of one slot) from any number of slots, so one step streams every weight
 * matrix once for all of its rows. The threads of the pool walk the step's phases together;
 * a phase is a list of units that any thread grabs, and it ends when all its units are done
 * (a late or descheduled thread finds them taken; threadpool.h):
 *
 *   embed (* scale) + rope angles of each rope table (rows)
 *   per layer: norm+quantize (rows) | q,k,v matmuls (output rows, dynamic)
 *              | biases, q/k norms, rope, KV store (rows) | attention (segment x kv head x query
 *              tile, or per key chunk + merge when there are few) | quantize (rows)
 *              | output matmul (+= residual) | [post-norm += residual] | norm+quantize
 *              | gate,up matmuls | act(gate)*up + quantize (rows) | down matmul (+= residual)
 *              | [post-norm += residual]
 *   logits: final norm+quantize of the requested rows only | output matmul (vocab, dynamic)
 *
 * A mixture-of-experts layer (qwen3moe, qwen2moe) walks its own FFN phases (moe_block: router,
 * top-k, rows grouped by expert, each chosen expert's matmuls once for all its rows); a dense
 * layer walks MOE_EXTRA_PHASES empty ones in their place.
 *
 * Every layer walks the same PHASES_PER_LAYER phases (a phase an architecture lacks is an empty
 * slot in the sequence), and a step checks that it walked exactly the phases it counted.
 *
 * Which thread computes a row or an output never changes the arithmetic (kernels.h NOTE), so
 * results do not depend on the thread count or on dynamic scheduling.
 *
 * With a residual_scale (granite), an attention, Mamba2 or dense FFN block's output matmul
 * writes proj, and the next norm phase (the next block's, or the logits') first adds
 * proj * scale to the residual stream row by row: no phase of its own (MoE blocks add into x in
 * their last phase); the logits of a step are multiplied by 1 / logit_scale.
 *
 * This file drives a forward call: engine_forward cuts it into steps and plans each (segments,
 * attention units), and step_worker is one thread's walk of a step's phases. Each kind of block
 * walks its phases in its own file; where a slot's KV and states live is engine_kv.c
 * (engine_internal.h lists the files).
 */
#include <math.h>
#include <string.h>

#include "engine_internal.h"

static void step_worker(void *ctx, int ith, int nth) {
    engine *e = ctx;
    const model_desc *m = &e->m;
    const kernel_table *kt = e->kt;
    const int T = e->n_rows, dim = m->dim, hd = m->head_dim, nu = n_row_units(T);
    int p = 0; /* phase index: every thread walks the same sequence */

    /* embed rows (scaled); rope angles of each row's position in every rope table */
    const size_t embd_row = ggml_row_bytes(m->token_embd.type, dim);
    FOR_EACH_UNIT(e, p, nu, u) {
        int r0, r1;
        unit_rows(u, T, &r0, &r1);
        for (int r = r0; r < r1; r++) {
            float *xr = e->x + (size_t)r * dim;
            kt->dequantize_row[m->token_embd.type](xr, (const char *)m->token_embd.rows + (size_t)e->tokens[r] * embd_row, dim);
            if (m->embed_scale != 1.0f)
                for (int i = 0; i < dim; i++) xr[i] *= m->embed_scale;
            for (int t = 0; t < e->n_rope; t++) {
                float *cs = e->rope_cs + ((size_t)t * e->max_tokens + r) * hd;
                const double *f = e->inv_freq + (size_t)t * (hd / 2);
                for (int i = 0; i < hd / 2; i++) {
                    double theta = (double)e->row_pos[r] * f[i];
                    cs[2 * i] = (float)cos(theta);
                    cs[2 * i + 1] = (float)sin(theta);
                }
            }
        }
    }
    phase_end(e, p++, nu);

    for (int l = 0; l < m->n_layers; l++) {
        const layer_weights *L = &m->layers[l];
        p = is_conv_layer(L)    ? conv_block(e, L, l, p, nth)
            : is_delta_layer(L) ? delta_block(e, L, l, p, ith, nth)
            : is_mamba_layer(L) ? mamba_block(e, L, l, p, nth)
                                : attention_block(e, L, l, p, ith, nth);
        if (p < 0) return; /* test hook: every thread leaves at the same point */
        p = is_moe_layer(L) ? moe_block(e, L, l, p, nth) : ffn_block(e, L, p, nth);
        /* NOTE: the phase count is checked at every layer's end, while the spare counters past
         * n_phases still absorb a miscount; every thread takes the same branch and leaves. */
        if (p != 1 + (l + 1) * PHASES_PER_LAYER) {
            if (ith == 0) e->phases_run = -1;
            return;
        }
    }

    /* logits of the requested rows only */
    const int nl = e->n_logits, nlu = n_row_units(nl);
    FOR_EACH_UNIT(e, p, nlu, u) {
        int i0, i1;
        unit_rows(u, nl, &i0, &i1);
        for (int i = i0; i < i1; i++) {
            if (proj_before_layer(e, m->n_layers)) add_scaled_proj(e, e->logit_src[i]);
            kt->rmsnorm(e->xb + (size_t)i * dim, e->x + (size_t)e->logit_src[i] * dim, m->output_norm, dim, m->rms_eps);
            if (is_block_type(m->output.type)) quantize_row(e, e->xb, dim, i);
        }
    }
    phase_end(e, p++, nlu);
    if (nl > 0) {
        mm_job job = {&m->output, e->logits_out, m->n_vocab, 0};
        act_rows in = input_view(e, e->xb, dim);
        matmul_phase(e, p, &job, 1, &in, nl, nth);
    }
    p++;
    if (ith == 0) e->phases_run = p;
}

int engine_forward(engine *e, const engine_item *items, int n_items, float *logits, int fault_layer) {
    for (int i = 0; i < n_items; i++) {
        const engine_item *it = &items[i];
        /* NOTE: n_tokens > ctx_len - start_pos, not start_pos + n_tokens > ctx_len: the sum can
         * overflow int and wrap into range. */
        if (it->slot < 0 || it->slot >= e->num_slots || it->n_tokens < 1 || it->start_pos < 0 ||
            it->start_pos > e->ctx_len || it->n_tokens > e->ctx_len - it->start_pos ||
            it->want_logits < 0 || it->want_logits > it->n_tokens)
            return ENGINE_EINVAL;
        for (int j = 0; j < it->n_tokens; j++)
            if (it->tokens[j] < 0 || it->tokens[j] >= e->m.n_vocab) return ENGINE_EINVAL;
    }
    int item = 0, offset = 0, logit_base = 0;
    int first_step = 1;
    while (item < n_items) {
        /* gather the next step: up to max_tokens rows, whole segments where they fit */
        e->n_rows = e->n_segs = e->n_logits = 0;
        while (item < n_items && e->n_rows < e->max_tokens) {
            const engine_item *it = &items[item];
            int take = it->n_tokens - offset;
            if (take > e->max_tokens - e->n_rows) take = e->max_tokens - e->n_rows;
            step_seg *sg = &e->segs[e->n_segs++];
            sg->slot = it->slot;
            sg->pos0 = it->start_pos + offset;
            sg->n = take;
            sg->row0 = e->n_rows;
            /* the item's last want_logits rows get logits rows, in order (a verified draft) */
            const int first_logit = it->n_tokens - it->want_logits;
            for (int j = 0; j < take; j++) {
                int r = e->n_rows + j;
                e->tokens[r] = it->tokens[offset + j];
                e->row_pos[r] = sg->pos0 + j;
                e->row_slot[r] = it->slot;
                if (offset + j >= first_logit) e->logit_src[e->n_logits++] = r;
            }
            e->n_rows += take;
            offset += take;
            if (offset == it->n_tokens) {
                item++;
                offset = 0;
            }
        }
        for (int s = 0; s < e->n_segs; s++) /* a slot's first token starts from a zero state */
            if (e->rs_floats && e->segs[s].pos0 == 0) memset(state_of(e, e->segs[s].slot, 0), 0, engine_state_bytes(e));
        plan_attention(e);
        e->logits_out = logits + (size_t)logit_base * e->m.n_vocab;
        e->fault_layer = first_step ? fault_layer : -1;
        for (int c = 0; c < e->n_phases + PHASES_PER_LAYER; c++) {
            atomic_store(&e->sync[c].next, 0);
            atomic_store(&e->sync[c].done, 0);
        }
        e->phases_run = 0;
        threadpool_run(e->tp, step_worker, e);
        /* NOTE: the caller's walk ends when every phase's units are done, but a worker that
         * lost the CPU may still be walking the step: it finds every unit taken, yet it reads
         * the step's fields to count each phase's units and bumps the phase counters. Waiting
         * only before the next step sufficed while engine_forward alone writes what a count
         * reads; a count read from anything changed between calls (a tunable, a slot's state)
         * could exceed the step's, and the worker would run a unit past the end (into the
         * returned logits) and wait forever for the rest. So no worker touches e once
         * engine_forward returns (tests/engine/test_engine_threads.py). */
        threadpool_wait_idle(e->tp);
        if (e->fault_layer >= 0 && e->fault_layer < e->m.n_layers) return ENGINE_EFAULT;
        /* thread 0 is this thread: it wrote phases_run at its walk's end */
        if (e->phases_run != e->n_phases) return ENGINE_EINTERNAL;
        if (e->m.logit_scale != 0.0f && e->m.logit_scale != 1.0f) { /* granite: logits / logit_scale, as 1 / s * logit */
            const float inv = 1.0f / e->m.logit_scale;
            float *lg = e->logits_out;
            for (size_t i = 0; i < (size_t)e->n_logits * e->m.n_vocab; i++) lg[i] *= inv;
        }
        logit_base += e->n_logits;
        first_step = 0;
    }
    return ENGINE_OK;
}
