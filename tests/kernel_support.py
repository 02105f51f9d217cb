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
