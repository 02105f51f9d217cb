"""Split GGUF files: one model in N files named `PREFIX-00001-of-0000N.gguf` (llama.cpp's
`gguf-split` layout and the Hub's convention for large quantizations).

Each part is a GGUF of its own: the first holds every metadata key and some tensors, the others
only `split.*` keys and their tensors; `split.no` (0-based) and `split.count` say which part a
file is. slotserve reads the parts in place (engine_ext/gguf_file.py maps each one and joins their
tensor tables): nothing is copied or joined on disk.
"""

from __future__ import annotations

import re
from pathlib import Path

SPLIT_COUNT_KEY = "split.count"
SPLIT_NO_KEY = "split.no"
SPLIT_TENSORS_KEY = "split.tensors.count"
_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_name(name: str) -> tuple[str, int, int] | None:
    """(prefix, part number from 1, part count) of a split file name, or None for a plain one."""
    m = _SPLIT_NAME.match(name)
    if m is None:
        return None
    no, count = int(m["no"]), int(m["count"])
    if not 1 <= no <= count:
        return None
    return m["prefix"], no, count


def part_name(prefix: str, no: int, count: int) -> str:
    """The file name of part `no` (from 1) of `count`: PREFIX-0000no-of-0000count.gguf."""
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def part_names(name: str) -> list[str]:
    """Every part's file name, in order, when `name` is one part of a split; else [name]."""
    parsed = split_name(name)
    if parsed is None:
        return [name]
    prefix, _, count = parsed
    return [part_name(prefix, i, count) for i in range(1, count + 1)]


def part_paths(path: Path, metadata: dict[str, object]) -> list[Path]:
    """The paths of every part of the model whose first file is `path` (its metadata read), in
    order; [path] when the file is not split. ValueError naming the fix when the file is not
    the first part, the metadata disagrees with the name, or a part is missing."""
    count = metadata.get(SPLIT_COUNT_KEY)
    if count is None or count == 1:
        return [path]
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"{path}: {SPLIT_COUNT_KEY} is {count!r}, not a part count")
    no = metadata.get(SPLIT_NO_KEY, 0)
    parsed = split_name(path.name)
    if parsed is None or parsed[2] != count:
        raise ValueError(
            f"{path}: a split GGUF ({count} parts) must keep its name PREFIX-00001-of-{count:05d}.gguf "
            f"so its other parts can be found"
        )
    if no != 0 or parsed[1] != 1:
        raise ValueError(
            f"{path}: is part {parsed[1]} of {count}; pass the first part, {part_name(parsed[0], 1, count)}"
        )
    paths = [path.parent / part_name(parsed[0], i, count) for i in range(1, count + 1)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"{path}: split GGUF of {count} parts, missing {', '.join(missing)} beside it")
    return paths
