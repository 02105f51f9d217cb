"""A plain NumPy llama with a KV cache: the comparison figure and the output check of
`slotserve bench engine`.

Design: every weight dequantized once to float32 [n_out, n_in] (gguf.quants), then the usual
forward in matrix form: one call takes n tokens at positions start..start+n-1 (prefill or one
decode token), RoPE on adjacent pairs, causal GQA attention over the cache, SwiGLU.
No activation quantization: this is also the float reference the engine is checked against.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from slotserve.engine_ext.gguf_file import ModelFile


class NumpyLlama:
    def __init__(self, model: ModelFile, ctx_len: int) -> None:
        c = model.config
        self.c = c
        self.w: dict[str, np.ndarray] = {}
        for name, t in model.tensors.items():
            values = dequantize(
                t.data.reshape(t.shape[1] if len(t.shape) > 1 else 1, -1), GGMLQuantizationType(t.ggml_type)
            )
            self.w[name] = np.ascontiguousarray(values.reshape(tuple(reversed(t.shape))), dtype=np.float32)
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])
        half = np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim
        self.inv_freq = c.rope_base**-half  # [head_dim/2]
        kv = (c.n_layers, ctx_len, c.n_kv_heads, c.head_dim)
        self.k = np.zeros(kv, np.float32)  # [layer][pos][kv head][head_dim]
        self.v = np.zeros(kv, np.float32)
        self.len = 0

    def _norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.c.rms_eps) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x: [n, heads, head_dim]; rotate pairs (2i, 2i+1) by pos * inv_freq[i]."""
        ang = pos[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(ang)[:, None, :].astype(np.float32), np.sin(ang)[:, None, :].astype(np.float32)
        out = np.empty_like(x)
        out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
        out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
        return out

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """Append `tokens` to the cache; the logits [n_vocab] after the last one."""
        c, n, start = self.c, len(tokens), self.len
        hd, group = c.head_dim, c.n_heads // c.n_kv_heads
        pos = np.arange(start, start + n, dtype=np.float64)
        end = start + n
        mask = np.where(np.arange(end)[None, :] <= pos[:, None], 0.0, -np.inf).astype(np.float32)  # [n, end]
        x = self.w["token_embd.weight"][tokens]
        for i in range(c.n_layers):
            w = lambda s, i=i: self.w[f"blk.{i}.{s}.weight"]  # noqa: E731
            h = self._norm(x, w("attn_norm"))
            q = self._rope((h @ w("attn_q").T).reshape(n, c.n_heads, hd), pos)
            self.k[i, start:end] = self._rope((h @ w("attn_k").T).reshape(n, c.n_kv_heads, hd), pos)
            self.v[i, start:end] = (h @ w("attn_v").T).reshape(n, c.n_kv_heads, hd)
            k, v = self.k[i, :end], self.v[i, :end]  # [end, kv heads, head_dim]
            attn = np.empty((n, c.n_heads, hd), np.float32)
            for head in range(c.n_heads):
                s = q[:, head] @ k[:, head // group].T / np.float32(np.sqrt(hd)) + mask
                p = np.exp(s - s.max(axis=-1, keepdims=True))
                attn[:, head] = (p / p.sum(axis=-1, keepdims=True)) @ v[:, head // group]
            x = x + attn.reshape(n, -1) @ w("attn_output").T
            h = self._norm(x, w("ffn_norm"))
            g = h @ w("ffn_gate").T
            x = x + (g / (1.0 + np.exp(-g)) * (h @ w("ffn_up").T)) @ w("ffn_down").T
        self.len = end
        return self._norm(x[-1], self.w["output_norm.weight"]) @ self.out.T
