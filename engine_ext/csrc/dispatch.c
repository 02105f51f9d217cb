/* Kernel variant tables and their selection from cpuid.
 *
 * `kernels_select(NULL)` returns the best table this CPU runs; a name forces one ("scalar" is
 * the portable reference, also called "generic"). The engine resolves the SLOTSERVE_KERNELS
 * environment variable (auto | scalar | avx2 | avx512vnni) in Python and passes the name here.
 */
#include <string.h>

#include "kernels.h"
#include "quant_k.h"

/* Table entries of the quant_k.h types (kept together so both tables list the same types). */
#define K_DEQUANTIZE_GENERIC                                                                       \
    [GGML_TYPE_Q5_0] = dequantize_row_q5_0_generic, [GGML_TYPE_Q5_1] = dequantize_row_q5_1_generic, \
    [GGML_TYPE_Q4_K] = dequantize_row_q4_K_generic, [GGML_TYPE_Q5_K] = dequantize_row_q5_K_generic, \
    [GGML_TYPE_Q6_K] = dequantize_row_q6_K_generic, [GGML_TYPE_BF16] = dequantize_row_bf16_generic, \
    [GGML_TYPE_Q2_K] = dequantize_row_q2_K_generic, [GGML_TYPE_Q3_K] = dequantize_row_q3_K_generic,
#define K_GEMM_GENERIC                                                                             \
    [GGML_TYPE_Q5_0] = gemm_q5_0_generic, [GGML_TYPE_Q5_1] = gemm_q5_1_generic,                     \
    [GGML_TYPE_Q4_K] = gemm_q4_K_generic, [GGML_TYPE_Q5_K] = gemm_q5_K_generic,                     \
    [GGML_TYPE_Q6_K] = gemm_q6_K_generic, [GGML_TYPE_BF16] = gemm_bf16_generic,                     \
    [GGML_TYPE_Q2_K] = gemm_q2_K_generic, [GGML_TYPE_Q3_K] = gemm_q3_K_generic,
/* Row decoding is only the embedding lookup (one row per token): Q2_K and Q3_K stay portable. */
#define K_DEQUANTIZE_AVX2                                                                          \
    [GGML_TYPE_Q5_0] = dequantize_row_q5_0_avx2, [GGML_TYPE_Q5_1] = dequantize_row_q5_1_avx2,       \
    [GGML_TYPE_Q4_K] = dequantize_row_q4_K_avx2, [GGML_TYPE_Q5_K] = dequantize_row_q5_K_avx2,       \
    [GGML_TYPE_Q6_K] = dequantize_row_q6_K_avx2, [GGML_TYPE_BF16] = dequantize_row_bf16_avx2,       \
    [GGML_TYPE_Q2_K] = dequantize_row_q2_K_generic, [GGML_TYPE_Q3_K] = dequantize_row_q3_K_generic,

static const kernel_table generic_table = {
    .name = "scalar",
    .quantize_q8a = quantize_q8a_generic,
    .dequantize_row = {
        [GGML_TYPE_F32] = dequantize_row_f32_generic,
        [GGML_TYPE_F16] = dequantize_row_f16_generic,
        [GGML_TYPE_Q8_0] = dequantize_row_q8_0_generic,
        [GGML_TYPE_Q4_0] = dequantize_row_q4_0_generic,
        [GGML_TYPE_Q4_1] = dequantize_row_q4_1_generic,
        K_DEQUANTIZE_GENERIC
    },
    .gemm = {
        [GGML_TYPE_F32] = gemm_f32_generic,
        [GGML_TYPE_F16] = gemm_f16_generic,
        [GGML_TYPE_Q8_0] = gemm_q8_0_generic,
        [GGML_TYPE_Q4_0] = gemm_q4_0_generic,
        [GGML_TYPE_Q4_1] = gemm_q4_1_generic,
        K_GEMM_GENERIC
    },
    .attention_chunk = attention_chunk_generic,
    .attention_fold = attention_fold_generic,
    .rmsnorm = rmsnorm_generic,
    .rope = rope_generic,
    .rope_neox = rope_neox_generic,
    .silu_mul = silu_mul_generic,
    .gelu_tanh_mul = gelu_tanh_mul_generic,
    .exp = exp_generic,
    .f32_to_f16 = f32_to_f16_generic,
    .f16_to_f32 = f16_to_f32_generic,
    .shortconv = shortconv_generic,
    .ssm_conv = ssm_conv_generic,
    .l2norm = l2norm_generic,
    .gdn_step = gdn_step_generic,
    .gdn_steps = gdn_steps_generic,
    .gdn_gates = gdn_gates_generic,
    .mamba2_scan = mamba2_scan_generic,
};

#if defined(__x86_64__) || defined(__i386__)
/* What the x86 variants share: everything but the block-type matmuls, which each table names in
 * X86_GEMMS (so a variant's list of its own kernels is the whole of its difference). */
#define X86_COMMON                                                                                 \
    .quantize_q8a = quantize_q8a_avx2,                                                             \
    .dequantize_row = {                                                                            \
        [GGML_TYPE_F32] = dequantize_row_f32_generic,                                              \
        [GGML_TYPE_F16] = dequantize_row_f16_avx2,                                                 \
        [GGML_TYPE_Q8_0] = dequantize_row_q8_0_avx2,                                               \
        [GGML_TYPE_Q4_0] = dequantize_row_q4_0_avx2,                                               \
        [GGML_TYPE_Q4_1] = dequantize_row_q4_1_avx2,                                               \
        K_DEQUANTIZE_AVX2                                                                          \
    },                                                                                             \
    .attention_chunk = attention_chunk_avx2_tiles, .attention_fold = attention_fold_avx2,                \
    .rmsnorm = rmsnorm_avx2, .rope = rope_avx2, .rope_neox = rope_neox_avx2,                       \
    .silu_mul = silu_mul_avx2, .gelu_tanh_mul = gelu_tanh_mul_avx2, .exp = exp_avx2,               \
    .f32_to_f16 = f32_to_f16_avx2, .f16_to_f32 = f16_to_f32_avx2,                                  \
    .shortconv = shortconv_avx2, .ssm_conv = ssm_conv_avx2, .l2norm = l2norm_avx2,                 \
    .gdn_step = gdn_step_avx2, .gdn_steps = gdn_steps_avx2, .gdn_gates = gdn_gates_avx2,           \
    .mamba2_scan = mamba2_scan_avx2
/* The matmul table of an x86 variant: float types on AVX2, block types as given. */
#define X86_GEMMS(q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K, q2_K, q3_K)                     \
    {                                                                                              \
        [GGML_TYPE_F32] = gemm_f32_avx2, [GGML_TYPE_F16] = gemm_f16_avx2,                          \
        [GGML_TYPE_BF16] = gemm_bf16_avx2, [GGML_TYPE_Q8_0] = q8_0, [GGML_TYPE_Q4_0] = q4_0,       \
        [GGML_TYPE_Q4_1] = q4_1, [GGML_TYPE_Q5_0] = q5_0, [GGML_TYPE_Q5_1] = q5_1,                 \
        [GGML_TYPE_Q4_K] = q4_K, [GGML_TYPE_Q5_K] = q5_K, [GGML_TYPE_Q6_K] = q6_K,                 \
        [GGML_TYPE_Q2_K] = q2_K, [GGML_TYPE_Q3_K] = q3_K,                                          \
    }

static const kernel_table avx2_table = {
    .name = "avx2",
    X86_COMMON,
    .gemm = X86_GEMMS(gemm_q8_0_avx2, gemm_q4_0_avx2, gemm_q4_1_avx2, gemm_q5_0_avx2, gemm_q5_1_avx2,
                      gemm_q4_K_avx2, gemm_q5_K_avx2, gemm_q6_K_avx2, gemm_q2_K_avx2, gemm_q3_K_avx2),
};

/* avx2 with the row-group matmuls of every block type but Q2_K and Q3_K on AVX512-VNNI
 * (arch/x86_vnni.c) and attention in query tiles (arch/x86_avx512_attn.c) */
static const kernel_table avx512vnni_table = {
    .name = "avx512vnni",
    X86_COMMON,
    .attention_chunk = attention_chunk_avx512, /* overrides X86_COMMON's: query tiles, same results */
    /* these too: the same results as AVX2's on 512-bit vectors */
    .gdn_step = gdn_step_avx512, .gdn_steps = gdn_steps_avx512, .ssm_conv = ssm_conv_avx512,
    .shortconv = shortconv_avx512, .silu_mul = silu_mul_avx512, .mamba2_scan = mamba2_scan_avx512,
    .gemm = X86_GEMMS(gemm_q8_0_vnni, gemm_q4_0_vnni, gemm_q4_1_vnni, gemm_q5_0_vnni, gemm_q5_1_vnni,
                      gemm_q4_K_vnni, gemm_q5_K_vnni, gemm_q6_K_vnni, gemm_q2_K_avx2, gemm_q3_K_avx2),
};
#endif

/* NOTE: __builtin_cpu_supports also checks that the OS saves the AVX-512 register state. */
int kernels_avx512vnni_supported(void) {
#if defined(__x86_64__) || defined(__i386__)
    return kernels_avx2_supported() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

int kernels_avx2_supported(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

const kernel_table *kernels_select(const char *name) {
    int want_auto = name == NULL || strcmp(name, "auto") == 0;
    if (!want_auto && (strcmp(name, "scalar") == 0 || strcmp(name, "generic") == 0)) return &generic_table;
#if defined(__x86_64__) || defined(__i386__)
    if ((want_auto || strcmp(name, "avx512vnni") == 0) && kernels_avx512vnni_supported()) return &avx512vnni_table;
    if ((want_auto || strcmp(name, "avx2") == 0) && kernels_avx2_supported()) return &avx2_table;
#endif
    return want_auto ? &generic_table : NULL;
}
