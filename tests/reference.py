"""NumPy reference forward pass of a llama GGUF, for checking the engine token by token.

Design: deliberately plain and independent of slotserve's loader. It reads the file with
gguf.GGUFReader, dequantizes every weight with gguf.quants.dequantize into matrices [n_out, n_in]
(float64 by default), and recomputes the whole causal forward pass for each call:

    x = embd[tokens]
    per layer: h = rmsnorm(x) * attn_norm; q,k,v = h @ Wq.T, h @ Wk.T, h @ Wv.T
               rope(q), rope(k) on adjacent pairs (2i, 2i+1), angle pos * base ** (-2i / head_dim)
               causal softmax attention, kv head = q head // (n_heads / n_kv_heads)
               x += attn @ Wo.T
               h = rmsnorm(x) * ffn_norm; x += (silu(h @ Wg.T) * (h @ Wu.T)) @ Wd.T
    logits = (rmsnorm(x) * output_norm) @ (output or embd).T
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize


class ReferenceLlama:
    """A llama GGUF evaluated with dequantized weights, in float64 by default.

    dtype=np.float32 halves the memory and runs much faster on the real model (135M parameters
    -> 540 MB), at float32 rounding.
    """

    def __init__(self, path: str | Path, dtype: type = np.float64) -> None:
        self.dtype = np.dtype(dtype)
        reader = GGUFReader(path)
        meta = {
            name: f.contents()
            for name, f in reader.fields.items()
            if name not in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")
        }
        assert meta["general.architecture"] == "llama"
        self.n_layers = int(meta["llama.block_count"])
        self.dim = int(meta["llama.embedding_length"])
        self.n_heads = int(meta["llama.attention.head_count"])
        self.n_kv_heads = int(meta.get("llama.attention.head_count_kv", self.n_heads))
        self.head_dim = self.dim // self.n_heads
        self.rope_base = float(meta.get("llama.rope.freq_base", 10000.0))
        self.eps = float(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5))
        self.w: dict[str, np.ndarray] = {}
        for t in reader.tensors:
            qtype = GGMLQuantizationType(int(t.tensor_type))
            values = dequantize(np.asarray(t.data), qtype).astype(self.dtype)
            # ggml shape (n_in, n_out) -> numpy [n_out, n_in]
            self.w[t.name] = values.reshape(tuple(int(d) for d in reversed(t.shape)))
        self.embd = self.w["token_embd.weight"]  # [n_vocab, dim]
        self.out = self.w.get("output.weight", self.embd)  # [n_vocab, dim]
        self.n_vocab = self.embd.shape[0]

    def _rmsnorm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def _rope(self, x: np.ndarray) -> np.ndarray:
        """x: [n, heads, head_dim], row i at position i; rotate pairs (2j, 2j+1)."""
        n = x.shape[0]
        inv_freq = self.rope_base ** (-np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)
        angle = np.arange(n, dtype=np.float64)[:, None] * inv_freq[None, :]  # [n, head_dim/2]
        cos = np.cos(angle)[:, None, :].astype(self.dtype)
        sin = np.sin(angle)[:, None, :].astype(self.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """[len(tokens), n_vocab] in self.dtype: row p is the next-token logits after tokens[:p+1]."""
        return self._final_hidden(tokens) @ self.out.T

    def _final_hidden(self, tokens: Sequence[int]) -> np.ndarray:
        """[len(tokens), dim]: the normalized hidden state that the output matrix reads."""
        ids = np.asarray(tokens, dtype=np.int64)
        n, hd = len(ids), self.head_dim
        group = self.n_heads // self.n_kv_heads
        x = self.embd[ids]  # [n, dim]
        causal = np.triu(np.full((n, n), -np.inf, dtype=self.dtype), k=1)  # [n, n]: -inf above the diagonal
        for i in range(self.n_layers):
            w = lambda s, i=i: self.w[f"blk.{i}.{s}.weight"]  # noqa: E731
            h = self._rmsnorm(x, w("attn_norm"))
            q = self._rope((h @ w("attn_q").T).reshape(n, self.n_heads, hd))
            k = self._rope((h @ w("attn_k").T).reshape(n, self.n_kv_heads, hd))
            v = (h @ w("attn_v").T).reshape(n, self.n_kv_heads, hd)
            attn = np.empty((n, self.n_heads, hd), dtype=self.dtype)
            for head in range(self.n_heads):
                kv = head // group
                scores = q[:, head] @ k[:, kv].T / math.sqrt(hd) + causal  # [n, n]
                scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
                attn[:, head] = (scores / scores.sum(axis=-1, keepdims=True)) @ v[:, kv]
            x = x + attn.reshape(n, -1) @ w("attn_output").T
            h = self._rmsnorm(x, w("ffn_norm"))
            gate = h @ w("ffn_gate").T
            x = x + (gate / (1.0 + np.exp(-gate)) * (h @ w("ffn_up").T)) @ w("ffn_down").T
        return self._rmsnorm(x, self.w["output_norm.weight"])

    def greedy(self, tokens: Sequence[int], n: int) -> list[int]:
        """The n tokens greedy decoding appends to `tokens` (argmax, lowest id on ties)."""
        seq = list(tokens)
        out: list[int] = []
        for _ in range(n):
            nxt = int(np.argmax(self._final_hidden(seq)[-1] @ self.out.T))
            out.append(nxt)
            seq.append(nxt)
        return out
