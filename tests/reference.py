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

qwen3moe and qwen2moe (src/models/qwen3moe.cpp, qwen2moe.cpp, llama-graph.cpp build_moe_ffn):
qwen3's and qwen2's attention blocks, and the FFN a mixture of experts (`_moe`):

    p = softmax(h @ router.T); the k = expert_used_count largest, ties to the lower index;
    qwen3moe: their weights / their sum; f = sum_i w_i * down_i(silu(gate_i h) * up_i h)
    qwen2moe: f += sigmoid(h . ffn_gate_inp_shexp) * shared expert FFN (ffn_*_shexp)

olmoe (src/models/olmoe.cpp): qwen3moe's block without renormalising the chosen weights, its q
and k norms taken over the whole projection (q_norm [n_heads * head_dim]) before the heads.

lfm2 (llama.cpp's src/models/lfm2.cpp): the layers whose head_count_kv is 0 replace attention
by a short convolution, the others are qwen3's attention block (q/k norms, NEOX rope):

    h = rmsnorm(x) * attn_norm; b, c, u = thirds of h @ W_in.T   (in that order)
    v = b * u; y[t] = sum_i conv[:, i] * v[t - (L-1) + i]  (v before position 0 is zero)
    x += (c * y) @ W_out.T;   and the final norm is token_embd_norm

qwen35 (Qwen3.5 dense, llama.cpp's src/models/qwen35.cpp) has its own block (`_qwen35_hidden`):
layers with (i + 1) % full_attention_interval != 0 are Gated DeltaNet, the others gated
attention, and the FFN reads post_attention_norm:

    DeltaNet: qkv = h @ Wqkv.T, z = h @ Wgate.T, beta = sigmoid(h @ Wbeta.T),
              g = softplus(h @ Walpha.T + dt_bias) * ssm_a        (ssm_a = -exp(A_log))
              c = silu(causal depthwise conv of qkv over ssm.conv_kernel positions, zeros before 0)
              q, k, v = c split [k heads * d | k heads * d | v heads * d]; q, k /= sqrt(|.|^2 + eps)
              v head h reads k head h % k_heads (llama.cpp tiles them)
              per token, per v head: S = exp(g) S; S += beta (v - S k) k^T; o = S q / sqrt(d)
              o = rmsnorm(o per head) * ssm_norm * silu(z);  x += o @ Wout.T
    attention: q|gate = h @ Wq.T (per head: d query values, then d gate values); q, k normed
              per head; NEOX rope on the first rope.dimension_count dims only, angle
              pos * base ** (-2i / rope_dim); softmax attention; o = attn * sigmoid(gate)

granitehybrid (IBM Granite 4.0 H, llama.cpp's src/models/granite-hybrid.cpp, mamba-base.cpp) has
its own block too (`_granite_hidden`; with experts, qwen3moe's `_moe` plus a shared expert added
without a gate): layers whose head_count_kv is 0 are Mamba2, the others
llama attention (adjacent-pair rope only when rope.scaling.finetuned, its default; scale
attention.scale), x = embd * embedding_scale, every block's output * residual_scale before its
residual add, logits / logit_scale:

    Mamba2: z | xBC | dt = h @ W_in.T  ([inner | inner + 2 G N | H]); c = silu(causal depthwise
            conv of xBC over ssm.conv_kernel positions (zeros before 0) + conv bias);
            x, B, C = c split [H heads x P | G groups x N | G groups x N]; head h reads group
            h // (H / G); dt = softplus(dt + dt_bias); per token, per head:
            S = exp(dt * A) S + dt x B^T (S [P][N], A = ssm_a = -exp(A_log)); y = S C
            y = (y + D x) * silu(z); y = rmsnorm per group of inner / G channels * ssm_norm
            out = y @ W_out.T
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

ARCHS = (
    "llama",
    "qwen2",
    "qwen3",
    "gemma3",
    "lfm2",
    "qwen35",
    "qwen3moe",
    "qwen2moe",
    "olmoe",
    "granitehybrid",
)


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
        if arch in ("qwen3moe", "qwen2moe", "olmoe") or meta.get(f"{arch}.expert_count", 0):
            self.n_expert_used = int(meta[f"{arch}.expert_used_count"])
        if arch == "qwen35":
            self.rope_dim = int(meta[f"{arch}.rope.dimension_count"])
            self.interval = int(meta.get(f"{arch}.full_attention_interval", 4))
            self.ssm = {
                k: int(meta[f"{arch}.ssm.{k}"])
                for k in ("conv_kernel", "state_size", "group_count", "time_step_rank")
            }
        self.logit_scale = 1.0
        if arch == "granitehybrid":
            self.ssm = {
                k: int(meta[f"{arch}.ssm.{k}"])
                for k in ("conv_kernel", "state_size", "group_count", "time_step_rank", "inner_size")
            }
            self.scales = {
                k: float(meta.get(f"{arch}.{k}", 0.0)) or 1.0
                for k in ("embedding_scale", "residual_scale", "logit_scale")
            }
            self.attn_scale = float(meta.get(f"{arch}.attention.scale", 0.0))
            self.rope_on = bool(meta.get(f"{arch}.rope.scaling.finetuned", True))
            self.logit_scale = self.scales["logit_scale"]
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
        adjacent = self.arch in ("llama", "granitehybrid")
        if adjacent:  # adjacent pairs
            a, b = x[..., 0::2], x[..., 1::2]
        else:  # NEOX: halves
            a, b = x[..., : hd // 2], x[..., hd // 2 :]
        ra, rb = a * cos - b * sin, a * sin + b * cos
        out = np.empty_like(x)
        if adjacent:
            out[..., 0::2], out[..., 1::2] = ra, rb
        else:
            out[..., : hd // 2], out[..., hd // 2 :] = ra, rb
        return out

    @staticmethod
    def _gelu_tanh(x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """[len(tokens), n_vocab] in self.dtype: row p is the next-token logits after tokens[:p+1]."""
        return self._final_hidden(tokens) @ self.out.T / self.logit_scale

    def _final_hidden(self, tokens: Sequence[int]) -> np.ndarray:
        """[len(tokens), dim]: the normalized hidden state that the output matrix reads."""
        if self.arch == "qwen35":
            return self._qwen35_hidden(tokens)
        if self.arch == "granitehybrid":
            return self._granite_hidden(tokens)
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
            if self.arch in ("qwen2", "qwen2moe"):
                q = q + self.w[f"blk.{i}.attn_q.bias"]
                k = k + self.w[f"blk.{i}.attn_k.bias"]
                v = v + self.w[f"blk.{i}.attn_v.bias"]
            if self.arch == "olmoe":  # olmoe.cpp: the norms over the whole projection, before the heads
                q = self._rmsnorm(q, w("attn_q_norm"))
                k = self._rmsnorm(k, w("attn_k_norm"))
            q = q.reshape(n, self.n_heads, hd)
            k = k.reshape(n, self.n_kv_heads, hd)
            v = v.reshape(n, self.n_kv_heads, hd)
            if self.arch in ("qwen3", "gemma3", "lfm2", "qwen3moe"):
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
        if self.arch in ("qwen3moe", "qwen2moe", "olmoe"):
            return self._moe(h, w)
        gate = h @ w("ffn_gate").T
        act = self._gelu_tanh(gate) if gemma else gate / (1.0 + np.exp(-gate))
        f = (act * (h @ w("ffn_up").T)) @ w("ffn_down").T
        if gemma:
            f = self._rmsnorm(f, w("post_ffw_norm"))
        return f

    def _moe(self, h: np.ndarray, w) -> np.ndarray:
        """llama.cpp's build_moe_ffn with softmax gating, row by row: p = softmax(h @ router.T);
        the expert_used_count largest (ties: the lower expert index); qwen3moe divides their
        weights by their sum; f = sum over ranks of p * down_e(silu(gate_e h) * up_e h);
        qwen2moe adds the shared expert's FFN times sigmoid(h . ffn_gate_inp_shexp)."""
        k = self.n_expert_used
        logits = h @ w("ffn_gate_inp").T  # [n, n_expert]
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p = p / p.sum(axis=-1, keepdims=True)
        gate, up, down = w("ffn_gate_exps"), w("ffn_up_exps"), w("ffn_down_exps")  # [E, F, dim], [E, dim, F]
        out = np.zeros_like(h)
        for r in range(h.shape[0]):
            chosen = np.argsort(-logits[r], kind="stable")[:k]  # stable: lower index first on ties
            weights = p[r, chosen]
            if self.arch in ("qwen3moe", "granitehybrid"):
                weights = weights / max(weights.sum(), 6.103515625e-5)
            for x, wt in zip(chosen, weights):
                out[r] += wt * ((self._silu(gate[x] @ h[r]) * (up[x] @ h[r])) @ down[x].T)
        if self.arch == "qwen2moe":
            shared = (self._silu(h @ w("ffn_gate_shexp").T) * (h @ w("ffn_up_shexp").T)) @ w(
                "ffn_down_shexp"
            ).T
            out = out + shared / (1.0 + np.exp(-(h @ w("ffn_gate_inp_shexp"))))[:, None]
        return out

    def _shortconv(self, h: np.ndarray, w) -> np.ndarray:
        """lfm2's convolution block before out_proj: c * conv(b * u), [n, dim]."""
        n, dim = h.shape
        b, c, u = np.split(h @ w("shortconv.in_proj").T, 3, axis=1)
        kernel = w("shortconv.conv")  # [dim, L]
        taps = kernel.shape[1]
        v = np.concatenate([np.zeros((taps - 1, dim), self.dtype), b * u])
        y = sum(kernel[:, i] * v[i : i + n] for i in range(taps))
        return c * y

    @staticmethod
    def _silu(x: np.ndarray) -> np.ndarray:
        return x / (1.0 + np.exp(-x))

    def _qwen35_hidden(self, tokens: Sequence[int]) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64)
        n, hd, rd = len(ids), self.head_dim, self.rope_dim
        x = self.embd[ids]
        pos = np.arange(n)
        causal = np.where(pos[None, :] > pos[:, None], -np.inf, 0.0).astype(self.dtype)
        taps, d = self.ssm["conv_kernel"], self.ssm["state_size"]
        hk, hv = self.ssm["group_count"], self.ssm["time_step_rank"]
        for i in range(self.n_layers):
            w = lambda s, i=i: self.w[f"blk.{i}.{s}"]  # noqa: E731
            h = self._rmsnorm(x, w("attn_norm.weight"))
            if (i + 1) % self.interval != 0:
                qkv = h @ w("attn_qkv.weight").T  # [n, conv_dim]
                z = (h @ w("attn_gate.weight").T).reshape(n, hv, d)
                beta = 1.0 / (1.0 + np.exp(-(h @ w("ssm_beta.weight").T)))  # [n, hv]
                a = h @ w("ssm_alpha.weight").T + w("ssm_dt.bias")
                g = np.where(a > 20.0, a, np.log1p(np.exp(np.minimum(a, 20.0)))) * w("ssm_a")
                kernel = w("ssm_conv1d.weight")  # [conv_dim, taps]
                padded = np.concatenate([np.zeros((taps - 1, qkv.shape[1]), self.dtype), qkv])
                conv = sum(padded[j : j + n] * kernel[:, j] for j in range(taps))
                c = self._silu(conv)
                q = c[:, : hk * d].reshape(n, hk, d)
                k = c[:, hk * d : 2 * hk * d].reshape(n, hk, d)
                v = c[:, 2 * hk * d :].reshape(n, hv, d)
                q = q / np.sqrt((q * q).sum(-1, keepdims=True) + self.eps)
                k = k / np.sqrt((k * k).sum(-1, keepdims=True) + self.eps)
                state = np.zeros((hv, d, d), self.dtype)  # [head][v index][k index]
                o = np.empty((n, hv, d), self.dtype)
                for t in range(n):
                    for head in range(hv):
                        kh, qh = k[t, head % hk], q[t, head % hk]
                        s = state[head] * np.exp(g[t, head])
                        delta = (v[t, head] - s @ kh) * beta[t, head]
                        s = s + np.outer(delta, kh)
                        state[head] = s
                        o[t, head] = (s @ qh) / math.sqrt(d)
                o = self._rmsnorm(o, w("ssm_norm.weight")) * self._silu(z)
                x = x + o.reshape(n, hv * d) @ w("ssm_out.weight").T
            else:
                qg = (h @ w("attn_q.weight").T).reshape(n, self.n_heads, 2 * hd)
                q, gate = qg[..., :hd], qg[..., hd:].reshape(n, self.n_heads * hd)
                k = (h @ w("attn_k.weight").T).reshape(n, self.n_kv_heads, hd)
                v = (h @ w("attn_v.weight").T).reshape(n, self.n_kv_heads, hd)
                q = self._rmsnorm(q, w("attn_q_norm.weight"))
                k = self._rmsnorm(k, w("attn_k_norm.weight"))
                inv_freq = self.rope_base ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)
                angle = pos[:, None].astype(np.float64) * inv_freq[None, :]
                cos = np.cos(angle)[:, None, :].astype(self.dtype)
                sin = np.sin(angle)[:, None, :].astype(self.dtype)

                def rope(t: np.ndarray, cos: np.ndarray = cos, sin: np.ndarray = sin) -> np.ndarray:
                    out = t.copy()
                    a, b = t[..., : rd // 2], t[..., rd // 2 : rd]
                    out[..., : rd // 2], out[..., rd // 2 : rd] = a * cos - b * sin, a * sin + b * cos
                    return out

                q, k = rope(q), rope(k)
                group = self.n_heads // self.n_kv_heads
                attn = np.empty((n, self.n_heads, hd), dtype=self.dtype)
                for head in range(self.n_heads):
                    kv = head // group
                    scores = q[:, head] @ k[:, kv].T / math.sqrt(hd) + causal
                    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
                    attn[:, head] = (scores / scores.sum(axis=-1, keepdims=True)) @ v[:, kv]
                o = attn.reshape(n, -1) / (1.0 + np.exp(-gate))
                x = x + o @ w("attn_output.weight").T
            h = self._rmsnorm(x, w("post_attention_norm.weight"))
            gate_f = h @ w("ffn_gate.weight").T
            x = x + (self._silu(gate_f) * (h @ w("ffn_up.weight").T)) @ w("ffn_down.weight").T
        return self._rmsnorm(x, self.w["output_norm.weight"])

    def _granite_hidden(self, tokens: Sequence[int]) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64)
        n, hd, sc = len(ids), self.head_dim, self.scales
        x = self.embd[ids] * sc["embedding_scale"]
        pos = np.arange(n)
        causal = np.where(pos[None, :] > pos[:, None], -np.inf, 0.0).astype(self.dtype)
        taps, N, G, H, inner = (
            self.ssm[k] for k in ("conv_kernel", "state_size", "group_count", "time_step_rank", "inner_size")
        )
        P = inner // H
        for i in range(self.n_layers):
            w = lambda s, i=i: self.w[f"blk.{i}.{s}"]  # noqa: E731
            h = self._rmsnorm(x, w("attn_norm.weight"))
            if i in self.conv_layers:  # head_count_kv 0: Mamba2
                zxbcdt = h @ w("ssm_in.weight").T
                z, xbc, dt = (
                    zxbcdt[:, :inner],
                    zxbcdt[:, inner : 2 * inner + 2 * G * N],
                    zxbcdt[:, 2 * inner + 2 * G * N :],
                )
                kernel = w("ssm_conv1d.weight")  # [conv_dim, taps]
                padded = np.concatenate([np.zeros((taps - 1, xbc.shape[1]), self.dtype), xbc])
                c = self._silu(
                    sum(padded[j : j + n] * kernel[:, j] for j in range(taps)) + w("ssm_conv1d.bias")
                )
                xs = c[:, :inner].reshape(n, H, P)
                B = c[:, inner : inner + G * N].reshape(n, G, N)
                C = c[:, inner + G * N :].reshape(n, G, N)
                v = dt + w("ssm_dt.bias")
                sp = np.where(v > 20.0, v, np.log1p(np.exp(np.minimum(v, 20.0))))  # [n, H]
                dA = np.exp(sp * w("ssm_a").reshape(H))
                state = np.zeros((H, P, N), self.dtype)
                y = np.empty((n, H, P), self.dtype)
                for t in range(n):
                    for head in range(H):
                        g = head // (H // G)
                        state[head] = state[head] * dA[t, head] + np.outer(xs[t, head] * sp[t, head], B[t, g])
                        y[t, head] = state[head] @ C[t, g]
                y = (y + xs * w("ssm_d").reshape(H)[None, :, None]) * self._silu(z.reshape(n, H, P))
                y = self._rmsnorm(y.reshape(n, G, inner // G), w("ssm_norm.weight").reshape(G, inner // G))
                out = y.reshape(n, inner) @ w("ssm_out.weight").T
            else:
                q = (h @ w("attn_q.weight").T).reshape(n, self.n_heads, hd)
                k = (h @ w("attn_k.weight").T).reshape(n, self.n_kv_heads, hd)
                v = (h @ w("attn_v.weight").T).reshape(n, self.n_kv_heads, hd)
                if self.rope_on:
                    q, k = self._rope(q, self.rope_base), self._rope(k, self.rope_base)
                group = self.n_heads // self.n_kv_heads
                attn = np.empty((n, self.n_heads, hd), dtype=self.dtype)
                scale = self.attn_scale or 1.0 / math.sqrt(hd)
                for head in range(self.n_heads):
                    scores = q[:, head] @ k[:, head // group].T * scale + causal
                    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
                    attn[:, head] = (scores / scores.sum(axis=-1, keepdims=True)) @ v[:, head // group]
                out = attn.reshape(n, -1) @ w("attn_output.weight").T
            x = x + out * sc["residual_scale"]
            hf = self._rmsnorm(x, w("ffn_norm.weight"))
            if f"blk.{i}.ffn_gate_inp.weight" in self.w:  # experts (renormalised), + the shared one ungated
                f = self._moe(hf, lambda s, i=i: self.w[f"blk.{i}.{s}.weight"])
                if f"blk.{i}.ffn_gate_shexp.weight" in self.w:
                    shexp = self._silu(hf @ w("ffn_gate_shexp.weight").T) * (hf @ w("ffn_up_shexp.weight").T)
                    f = f + shexp @ w("ffn_down_shexp.weight").T
            else:
                f = (self._silu(hf @ w("ffn_gate.weight").T) * (hf @ w("ffn_up.weight").T)) @ w(
                    "ffn_down.weight"
                ).T
            x = x + f * sc["residual_scale"]
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
