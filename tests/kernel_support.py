"""Helpers for kernel tests: tolerance checks that name the largest difference, and the float64
values of 8-bit activation blocks."""

from __future__ import annotations

import numpy as np


def assert_close(
    got: np.ndarray, want: np.ndarray, scale: np.ndarray | float, rtol: float, what: str
) -> None:
    """|got - want| <= rtol * scale elementwise; the message names the largest difference."""
    diff = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    bound = rtol * np.broadcast_to(np.asarray(scale, np.float64), diff.shape) + 1e-30
    worst = np.unravel_index(np.argmax(diff / bound), diff.shape)
    assert np.all(diff <= bound), (
        f"{what}: largest difference {diff.max():.3g} (at {worst}: {diff[worst]:.3g} > bound {bound[worst]:.3g})"
    )


def dequantized_activations(q: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """float64 [n, k] values of quantize_q8a's (qs, d, s)."""
    qs, d, _ = q
    n, k = qs.shape
    return (qs.reshape(n, k // 32, 32).astype(np.float64) * d[:, :, None]).reshape(n, k)


def assert_gemm_rows_independent(kt, t: int, raw: np.ndarray, n_out: int, x: np.ndarray, q) -> None:
    """Row independence (kernels.h NOTE) of kt.gemm on weight `raw` [n_out, k] (n_out > 40) and
    float32 rows x [n, k] with their quantize_q8a blocks q (None for a float weight): each row's
    outputs equal, bit for bit, the same row computed alone, the output sub-ranges 0..16, 16..40,
    40..n_out computed apart, and an accumulate into ones minus one."""
    together = kt.gemm(t, raw, n_out, x, quantized=q)
    for r in range(x.shape[0]):
        one = None if q is None else (q[0][r : r + 1], q[1][r : r + 1], q[2][r : r + 1])
        alone = kt.gemm(t, raw, n_out, x[r : r + 1].copy(), quantized=one)
        assert np.array_equal(alone[0], together[r]), f"row {r}"
    parts = np.zeros_like(together)
    for o0, o1 in ((0, 16), (16, 40), (40, n_out)):
        kt.gemm(t, raw, n_out, x, quantized=q, y=parts, o0=o0, o1=o1)
    assert np.array_equal(parts, together)
    acc = kt.gemm(t, raw, n_out, x, quantized=q, y=np.ones_like(together))
    assert np.array_equal(acc, together + np.float32(1.0))
