"""Incremental detokenization with stop strings.

Design: token ids map to raw bytes through `token_bytes`. Bytes accumulate until they form
complete UTF-8 characters (a trailing partial character is held back; invalid bytes become
U+FFFD). Decoded text then passes a stop-string filter: any suffix that could be the beginning
of a stop string is held back until the next token settles it, and a matched stop string ends
the stream with the text before it, so a stop string is matched across token boundaries and never
emitted.
"""

from __future__ import annotations

from collections.abc import Sequence


def _incomplete_tail_len(buf: bytes) -> int:
    """Length of a trailing, still incomplete UTF-8 sequence in `buf` (0..3)."""
    n = len(buf)
    for back in range(1, min(4, n) + 1):
        b = buf[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        if 0xF0 <= b <= 0xF4:
            need = 4
        elif 0xE0 <= b <= 0xEF:
            need = 3
        elif 0xC2 <= b <= 0xDF:
            need = 2
        else:  # ASCII, or a byte that never starts a valid sequence: decode it now
            need = 1
        return back if need > back else 0
    return 0


class Detokenizer:
    """Turns sampled token ids into released text for one request."""

    def __init__(self, token_bytes: Sequence[bytes], stop: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        self._stop = tuple(stop)
        self._max_stop = max((len(s) for s in self._stop), default=0)
        self._pending_bytes = b""  # bytes of an incomplete character
        self._pending_text = ""  # decoded text not yet released (possible stop-string start)
        self.stopped = False  # a stop string matched; nothing more will be released
        self.matched_stop: str | None = None  # the stop string that matched (earliest in the text)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it releases ('' when everything is held back)."""
        if self.stopped:
            return ""
        buf = self._pending_bytes + self._token_bytes[token_id]
        keep = _incomplete_tail_len(buf)
        self._pending_bytes = buf[len(buf) - keep :] if keep else b""
        self._pending_text += buf[: len(buf) - keep].decode("utf-8", errors="replace")
        return self._release()

    def _release(self) -> str:
        text = self._pending_text
        if not self._stop:
            self._pending_text = ""
            return text
        hits = [(i, s) for s in self._stop if (i := text.find(s)) >= 0]
        if hits:
            hit, self.matched_stop = min(hits, key=lambda h: h[0])
            self.stopped = True
            self._pending_text = ""
            self._pending_bytes = b""
            return text[:hit]
        hold = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), hold, -1):
                if text.endswith(s[:k]):
                    hold = k
                    break
        self._pending_text = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def flush(self) -> str:
        """Release everything held back (the stream ends without a stop-string match)."""
        if self.stopped:
            return ""
        text = self._pending_text + self._pending_bytes.decode("utf-8", errors="replace")
        self._pending_text = ""
        self._pending_bytes = b""
        return text
