"""NumPy reference forward pass of a GGUF model, for checking the engine token by token.

Design: deliberately plain and independent of slotserve's loader. It reads the file with
gguf.GGUFReader, dequantizes every weight with gguf.quants.dequantize into matrices [n_out, n_in]
(float64 by default), and recomputes the whole causal forward pass for each call. One block
with each architecture's additions written out where they happen (llama.cpp's graphs):

    x = embd[tokens]                                      gemma3: * sqrt(dim) (float32)
    per layer: h = rmsnorm(x) * attn_norm; q,k,v = h @ Wq.T, h @ Wk.T, h @ Wv.T
               qwen2: + bq, bk, bv;   qwen3, gemma3: q, k = rmsnorm per head * q_norm, k_norm
               rope(q), rope(k), angle pos * base ** (-2i / head_dim) (/ rope_freqs[i]) on
                 pairs (2i, 2i+1) (llama) or (i, i + head_dim/2) (qwen2, qwen3, gemma3)
               causal softmax attention, kv head = q head // (n_heads / n_kv_heads);
                 gemma3: layers i with (i+1) % 6 != 0 see only keys t > pos - sliding_window
                 and use RoPE base 10000
               o = attn @ Wo.T;  gemma3: o = rmsnorm(o) * post_attention_norm;  x += o
               h = rmsnorm(x) * ffn_norm; f = (act(h @ Wg.T) * (h @ Wu.T)) @ Wd.T
                 act = silu, gemma3: gelu (tanh approximation); gemma3: f = rmsnorm(f) * post_ffw_norm
               x += f
    logits = (rmsnorm(x) * output_norm) @ (output or embd).T

lfm2 (llama.cpp's src/models/lfm2.cpp): the layers whose head_count_kv is 0 replace attention
by a short convolution, the others are qwen3's attention block (q/k norms, NEOX rope):

    h = rmsnorm(x) * attn_norm; b, c, u = thirds of h @ W_in.T   (in that order)
    v = b * u; y[t] = sum_i conv[:, i] * v[t - (L-1) + i]  (v before position 0 is zero)
    x += (c * y) @ W_out.T;   and the final norm is token_embd_norm
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "lfm2")


class ReferenceModel:
    """A GGUF (llama, qwen2, qwen3 or gemma3) evaluated with dequantized weights, in float64
    by default.

    dtype=np.float32 halves the memory and runs much faster on the real models, at float32
    rounding.
    """

    def __init__(self, path: str | Path, dtype: type = np.float64) -> None:
        self.dtype = np.dtype(dtype)
        reader = GGUFReader(path)
        meta = {
            name: f.contents()
            for name, f in reader.fields.items()
            if name
            not in (
                "tokenizer.ggml.tokens",
                "tokenizer.ggml.merges",
                "tokenizer.ggml.token_type",
                "tokenizer.ggml.scores",
            )
        }
        self.arch = arch = meta["general.architecture"]
        assert arch in ARCHS, arch
        self.n_layers = int(meta[f"{arch}.block_count"])
        self.dim = int(meta[f"{arch}.embedding_length"])
        self.n_heads = int(meta[f"{arch}.attention.head_count"])
        kv = meta.get(f"{arch}.attention.head_count_kv", self.n_heads)
        per_layer = list(kv) if isinstance(kv, (list, tuple)) else [int(kv)] * self.n_layers
        self.conv_layers = {i for i, c in enumerate(per_layer) if int(c) == 0}
        self.n_kv_heads = max(int(c) for c in per_layer)
        self.head_dim = int(meta.get(f"{arch}.attention.key_length", self.dim // self.n_heads))
        self.rope_base = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
        self.eps = float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5))
        self.window = int(meta.get(f"{arch}.attention.sliding_window", 0)) if arch == "gemma3" else 0
        self.w: dict[str, np.ndarray] = {}
        for t in reader.tensors:
            qtype = GGMLQuantizationType(int(t.tensor_type))
            values = dequantize(np.asarray(t.data), qtype).astype(self.dtype)
            # ggml shape (n_in, n_out) -> numpy [n_out, n_in]
            self.w[t.name] = values.reshape(tuple(int(d) for d in reversed(t.shape)))
        self.embd = self.w["token_embd.weight"]  # [n_vocab, dim]
        self.out = self.w.get("output.weight", self.embd)  # [n_vocab, dim]
        self.output_norm = self.w["token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight"]
        self.n_vocab = self.embd.shape[0]

    def _rmsnorm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def _is_local(self, layer: int) -> bool:
        """gemma3 with a sliding window: every layer but each sixth."""
        return self.window > 0 and (layer + 1) % 6 != 0

    def _rope(self, x: np.ndarray, base: float) -> np.ndarray:
        """x: [n, heads, head_dim], row i at position i."""
        n, hd = x.shape[0], self.head_dim
        inv_freq = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        if "rope_freqs.weight" in self.w:
            inv_freq = inv_freq / self.w["rope_freqs.weight"].astype(np.float64)
        angle = np.arange(n, dtype=np.float64)[:, None] * inv_freq[None, :]  # [n, head_dim/2]
        cos = np.cos(angle)[:, None, :].astype(self.dtype)
        sin = np.sin(angle)[:, None, :].astype(self.dtype)
        if self.arch == "llama":  # adjacent pairs
            a, b = x[..., 0::2], x[..., 1::2]
        else:  # NEOX: halves
            a, b = x[..., : hd // 2], x[..., hd // 2 :]
        ra, rb = a * cos - b * sin, a * sin + b * cos
        out = np.empty_like(x)
        if self.arch == "llama":
            out[..., 0::2], out[..., 1::2] = ra, rb
        else:
            out[..., : hd // 2], out[..., hd // 2 :] = ra, rb
        return out

    @staticmethod
    def _gelu_tanh(x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """[len(tokens), n_vocab] in self.dtype: row p is the next-token logits after tokens[:p+1]."""
        return self._final_hidden(tokens) @ self.out.T

    def _final_hidden(self, tokens: Sequence[int]) -> np.ndarray:
        """[len(tokens), dim]: the normalized hidden state that the output matrix reads."""
        ids = np.asarray(tokens, dtype=np.int64)
        n, hd = len(ids), self.head_dim
        group = self.n_heads // self.n_kv_heads
        gemma = self.arch == "gemma3"
        x = self.embd[ids]  # [n, dim]
        if gemma:
            x = x * self.dtype.type(np.float32(math.sqrt(self.dim)))
        pos = np.arange(n)
        causal = np.where(pos[None, :] > pos[:, None], -np.inf, 0.0).astype(self.dtype)  # [query, key]
        windowed = np.where(pos[:, None] - pos[None, :] >= self.window, -np.inf, causal).astype(self.dtype)
        for i in range(self.n_layers):
            w = lambda s, i=i: self.w[f"blk.{i}.{s}.weight"]  # noqa: E731
            h = self._rmsnorm(x, w("attn_norm"))
            if i in self.conv_layers:
                x = x + self._shortconv(h, w) @ w("shortconv.out_proj").T
                x = x + self._ffn(x, w, gemma)
                continue
            q, k, v = h @ w("attn_q").T, h @ w("attn_k").T, h @ w("attn_v").T
            if self.arch == "qwen2":
                q = q + self.w[f"blk.{i}.attn_q.bias"]
                k = k + self.w[f"blk.{i}.attn_k.bias"]
                v = v + self.w[f"blk.{i}.attn_v.bias"]
            q = q.reshape(n, self.n_heads, hd)
            k = k.reshape(n, self.n_kv_heads, hd)
            v = v.reshape(n, self.n_kv_heads, hd)
            if self.arch in ("qwen3", "gemma3", "lfm2"):
                q = self._rmsnorm(q, w("attn_q_norm"))
                k = self._rmsnorm(k, w("attn_k_norm"))
            local = self._is_local(i)
            base = 10000.0 if local else self.rope_base
            q, k = self._rope(q, base), self._rope(k, base)
            mask = windowed if local else causal
            attn = np.empty((n, self.n_heads, hd), dtype=self.dtype)
            for head in range(self.n_heads):
                kv = head // group
                scores = q[:, head] @ k[:, kv].T / math.sqrt(hd) + mask  # [n, n]
                scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
                attn[:, head] = (scores / scores.sum(axis=-1, keepdims=True)) @ v[:, kv]
            o = attn.reshape(n, -1) @ w("attn_output").T
            if gemma:
                o = self._rmsnorm(o, w("post_attention_norm"))
            x = x + o
            x = x + self._ffn(x, w, gemma)
        return self._rmsnorm(x, self.output_norm)

    def _ffn(self, x: np.ndarray, w, gemma: bool) -> np.ndarray:
        h = self._rmsnorm(x, w("ffn_norm"))
        gate = h @ w("ffn_gate").T
        act = self._gelu_tanh(gate) if gemma else gate / (1.0 + np.exp(-gate))
        f = (act * (h @ w("ffn_up").T)) @ w("ffn_down").T
        if gemma:
            f = self._rmsnorm(f, w("post_ffw_norm"))
        return f

    def _shortconv(self, h: np.ndarray, w) -> np.ndarray:
        """lfm2's convolution block before out_proj: c * conv(b * u), [n, dim]."""
        n, dim = h.shape
        b, c, u = np.split(h @ w("shortconv.in_proj").T, 3, axis=1)
        kernel = w("shortconv.conv")  # [dim, L]
        taps = kernel.shape[1]
        v = np.concatenate([np.zeros((taps - 1, dim), self.dtype), b * u])
        y = sum(kernel[:, i] * v[i : i + n] for i in range(taps))
        return c * y

    def greedy(self, tokens: Sequence[int], n: int) -> list[int]:
        """The n tokens greedy decoding appends to `tokens` (argmax, lowest id on ties)."""
        seq = list(tokens)
        out: list[int] = []
        for _ in range(n):
            nxt = int(np.argmax(self._final_hidden(seq)[-1] @ self.out.T))
            out.append(nxt)
            seq.append(nxt)
        return out
