"""The engine: GGUF loading, tokenizer, C kernels and the SlotPool.

`SlotPool` and `kernel_variant` come from the compiled extension and are imported on first use,
so the pure-Python modules (gguf_file, tokenizer, chat) work without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["SlotPool", "kernel_variant"]

if TYPE_CHECKING:  # the type checker sees the names; at run time they load on first use
    from .pool import SlotPool, kernel_variant
else:

    def __getattr__(name: str) -> Any:
        if name in __all__:
            from . import pool

            return getattr(pool, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
