"""slotserve: an LLM inference server that never recomputes what it already computed."""

from importlib import metadata

try:  # the one version is pyproject.toml's, as installed
    __version__ = metadata.version("slotserve")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"
