/* Mixture-of-experts routing and the grouping of a step's rows by expert (moe.c); the MoE FFN
 * block that uses them is engine_ffn.c's moe_block. */
#ifndef SLOTSERVE_MOE_H
#define SLOTSERVE_MOE_H

/* One row's routing as llama.cpp computes it for the softmax gating of qwen3moe / qwen2moe:
 * p = softmax(logits[0..n)); sel = the k experts of largest p, largest first, ties to the
 * lower expert index; w[i] = p[sel[i]], divided by max(sum of the k, 6.103515625e-5) when
 * norm (qwen3moe). k <= n. Depends on the row's logits alone. */
void moe_route(const float *logits, int n, int k, int norm, int *sel, float *w);

/* The step's (row, rank) pairs grouped by expert: expert x owns pairs off[x] .. off[x+1]-1,
 * in row order; pair j is row pair_row[j], and row r's rank i is pair pair_of[r * k + i].
 * active[0 .. return) lists the experts with at least one pair, in index order.
 * off: [n_expert + 1]. */
int moe_group(const int *sel, int n_rows, int k, int n_expert, int *off, int *pair_row, int *pair_of, int *active);

#endif
