/* More weight types: 5-bit blocks (Q5_0, Q5_1), K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), BF16.
 * Their block layouts and row groups are in blocks.h; this header declares their kernels, which
 * live in quant_k.c (portable), arch/x86_avx2_k.c (AVX2) and arch/x86_vnni.c (AVX512-VNNI), the
 * latter two on arch/x86_gemm_k.h's one body; quant_k_x8.c packs their row groups (x8_bytes_k,
 * pack_x8_k) and reads them back block by block for the portable kernels (quant_k_x8.h).
 *
 * Design: every block weight type multiplies the 8-bit activation blocks of 32 (act_rows) with
 * an integer dot product per block of 32. The K-quants' super-blocks of 256 hold sub-blocks of
 * 32 (Q4_K, Q5_K: one 6-bit scale and one 6-bit min each) or 16 (Q6_K: one int8 scale each), so
 * every activation block meets whole sub-blocks of one super-block:
 *
 *   Q4_K, Q5_K  block b = sub-block j = b % 8:   d*sc_j * ad_b * sum(q*aq) - dmin*m_j * as_b
 *   Q6_K, Q3_K  block b = sub-blocks 2j, 2j+1:   d * ad_b * (sc_2j * sum16(q*aq) + sc_2j+1 * sum16(q*aq))
 *   Q2_K        as Q3_K, minus dmin * ad_b * (m_2j * sum16(aq) + m_2j+1 * sum16(aq))  (per-16 sums
 *               of the activation's int8s: the block sum as covers 32)
 *   Q5_0        d * ad * sum((q - 16) * aq)     (q = 5-bit 0..31: the integer dot product of
 *               the signed quants, exact, so no correction by the block sum as)
 *   Q5_1        d * ad * sum(q*aq) + m * as
 *
 * BF16 weights multiply the float activation rows (act_rows.f), as F16 does.
 */
#ifndef SLOTSERVE_QUANT_K_H
#define SLOTSERVE_QUANT_K_H

#include "kernels.h" /* act_rows, gemm_weight; blocks.h's layouts */

void dequantize_row_bf16_generic(float *y, const void *x, int k);
void dequantize_row_q5_0_generic(float *y, const void *x, int k);
void dequantize_row_q5_1_generic(float *y, const void *x, int k);
void dequantize_row_q4_K_generic(float *y, const void *x, int k);
void dequantize_row_q5_K_generic(float *y, const void *x, int k);
void dequantize_row_q6_K_generic(float *y, const void *x, int k);
void dequantize_row_q2_K_generic(float *y, const void *x, int k);
void dequantize_row_q3_K_generic(float *y, const void *x, int k);
void dequantize_row_bf16_avx2(float *y, const void *x, int k);
void dequantize_row_q5_0_avx2(float *y, const void *x, int k);
void dequantize_row_q5_1_avx2(float *y, const void *x, int k);
void dequantize_row_q4_K_avx2(float *y, const void *x, int k);
void dequantize_row_q5_K_avx2(float *y, const void *x, int k);
void dequantize_row_q6_K_avx2(float *y, const void *x, int k);
void gemm_bf16_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_0_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_1_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q4_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q6_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q2_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q3_K_avx2(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
/* AVX512-VNNI matmuls (arch/x86_vnni.c); only called when the CPU has AVX512F/VL/BW/VNNI. */
void gemm_q5_0_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_1_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q4_K_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_K_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q6_K_vnni(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_bf16_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_0_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_1_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q4_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q5_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q6_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q2_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);
void gemm_q3_K_generic(float *y, int ldy, const gemm_weight *w, int o0, int o1, const act_rows *x, int n_rows, int accumulate);

#endif
