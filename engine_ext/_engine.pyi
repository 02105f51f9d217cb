# Type stub of the Cython extension built from _engine.pyx, for mypy: every name it exports is
# typed Any here (the .pyx holds the signatures; keeping a second copy in step is not worth it).
from typing import Any

def __getattr__(name: str) -> Any: ...
