"""A plain-Python SentencePiece ("llama" GGUF vocabulary) tokenizer following llama.cpp's
algorithm step by step, slow and obviously so: the reference engine_ext/tokenizer.py's
`tokenizers`-based SPM is compared with (tests/engine/test_tokenizer_spm.py), itself checked
against llama.cpp's own ids on the Gemma 3 cases.

    partition   special pieces split the text first, longest piece first, each occurrence
                left to right (CONTROL / UNKNOWN only when parse_special; USER_DEFINED always)
    fragment    each remaining text fragment: " " prefix if add_space_prefix, " " -> "▁",
                one symbol per character
    merge       repeatedly merge the adjacent pair whose concatenation is the highest-scoring
                piece (leftmost on equal scores) until no adjacent pair forms a piece
    output      each final symbol's id, or its UTF-8 bytes as <0xNN> pieces if it is no piece
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

CONTROL, UNKNOWN, USER_DEFINED = 3, 2, 4


class SpmReference:
    def __init__(
        self, pieces: Sequence[str], scores: Sequence[float], types: Sequence[int], *, add_space_prefix: bool
    ) -> None:
        self.pieces = list(pieces)
        self.scores = list(scores)
        self.types = list(types)
        self.add_space_prefix = add_space_prefix
        self.ids: dict[str, int] = {}
        for i, p in enumerate(pieces):
            self.ids.setdefault(p, i)

    def encode(self, text: str, *, parse_special: bool = True) -> list[int]:
        out: list[int] = []
        for fragment in self._partition(text, parse_special):
            if isinstance(fragment, int):
                out.append(fragment)
            else:
                out.extend(self._encode_fragment(fragment))
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        kinds = (CONTROL, UNKNOWN, USER_DEFINED) if parse_special else (USER_DEFINED,)
        specials = sorted(
            (i for i, t in enumerate(self.types) if t in kinds and self.pieces[i]),
            key=lambda i: -len(self.pieces[i].encode("utf-8")),
        )
        fragments: list[str | int] = [text] if text else []
        for sid in specials:
            piece = self.pieces[sid]
            split: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int):
                    split.append(fragment)
                    continue
                rest = fragment
                while (at := rest.find(piece)) >= 0:
                    if at:
                        split.append(rest[:at])
                    split.append(sid)
                    rest = rest[at + len(piece) :]
                if rest:
                    split.append(rest)
            fragments = split
        return fragments

    def _encode_fragment(self, text: str) -> list[int]:
        if self.add_space_prefix:
            text = " " + text
        symbols = list(text.replace(" ", "▁"))  # a merged symbol keeps the left slot, the right empties
        nxt = list(range(1, len(symbols))) + [-1]
        prv = list(range(-1, len(symbols) - 1))
        heap: list[tuple[float, int, int, str]] = []

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            merged = symbols[left] + symbols[right]
            pid = self.ids.get(merged)
            if pid is not None:
                heapq.heappush(heap, (-self.scores[pid], left, right, merged))

        for i in range(len(symbols) - 1):
            push(i, i + 1)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            if not symbols[left] or not symbols[right] or symbols[left] + symbols[right] != merged:
                continue  # stale: one side was merged since
            if nxt[left] != right:
                continue
            symbols[left], symbols[right] = merged, ""
            nxt[left] = nxt[right]
            if nxt[left] >= 0:
                prv[nxt[left]] = left
            push(prv[left], left)
            push(left, nxt[left])
        out: list[int] = []
        i = 0
        while i >= 0 and symbols:
            symbol = symbols[i]
            pid = self.ids.get(symbol)
            if pid is not None:
                out.append(pid)
            else:
                out.extend(self.ids[f"<0x{b:02X}>"] for b in symbol.encode("utf-8"))
            i = nxt[i]
        return out
