"""slotserve: an LLM inference server that never recomputes what it already computed."""

__version__ = "0.1.0"
