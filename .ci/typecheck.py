"""mypy over the package as Python imports it (`slotserve.*`), with [tool.mypy] in pyproject.toml.

The folders become subpackages through pyproject.toml's package-dir mapping (scheduler/ is
`slotserve.scheduler`), which mypy does not read, and the editable install's import hook is not
something mypy follows. So this script lays the same mapping out as symlinks under
build/typecheck/slotserve/, runs mypy there, and prints its messages with the real paths.

    .venv/bin/python .ci/typecheck.py [mypy options]      (Python 3.11+: tomllib)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
TREE = REPO / "build" / "typecheck"


def main() -> int:
    mapping = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(TREE, ignore_errors=True)
    root = TREE / "slotserve"
    root.mkdir(parents=True)
    for entry in (REPO / mapping["slotserve"]).iterdir():  # slotserve/*.py
        if entry.name != "__pycache__":
            (root / entry.name).symlink_to(entry)
    renames = {}  # shown path prefix -> real path prefix
    for package, folder in mapping.items():
        if package != "slotserve":
            link = root / package.removeprefix("slotserve.").replace(".", "/")
            link.symlink_to(REPO / folder, target_is_directory=True)
            renames[f"{link.relative_to(REPO)}/"] = f"{folder}/"
    renames[f"{root.relative_to(REPO)}/"] = f"{mapping['slotserve']}/"
    pattern = re.compile("|".join(re.escape(k) for k in renames))
    mypy = Path(sys.executable).parent / "mypy"
    proc = subprocess.run([str(mypy), *sys.argv[1:]], cwd=REPO, capture_output=True, text=True)
    for stream, text in ((sys.stdout, proc.stdout), (sys.stderr, proc.stderr)):
        stream.write(pattern.sub(lambda m: renames[m.group(0)], text))
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
