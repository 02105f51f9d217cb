"""docs/operations.md stays in sync with the code: flags, defaults, variables, metrics."""

from __future__ import annotations

import enum
import re
from dataclasses import fields
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from slotserve.gateway import checkpoint_budget as cb
from slotserve.gateway.config import ServeConfig
from slotserve.gateway.options import OPTIONS
from slotserve.metrics import ServerMetrics
from slotserve.scheduler.config import SchedulerConfig
from slotserve.scheduler.stats import SchedulerStats, SlotLevel, SlotState

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = REPO / "docs" / "operations.md"
SOURCE_DIRS = ("slotserve", "engine_ext", "scheduler", "gateway", "metrics", "bench")


def flag_rows() -> dict[str, list[str]]:
    """First flag of each row of the flags table -> the row's cells."""
    rows = {}
    for line in OPERATIONS.read_text().splitlines():
        if line.startswith("| `--"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`").split()[0]] = cells
    return rows


def test_every_flag_and_variable_is_documented():
    text = OPERATIONS.read_text()
    rows = flag_rows()
    for opt in OPTIONS:
        assert opt.flags[0] in rows, f"{opt.flags[0]} has no row in the flags table"
        row = rows[opt.flags[0]]
        for alias in opt.flags[1:]:
            assert f"`{alias}`" in row[0], f"alias {alias} missing from the {opt.flags[0]} row"
        assert row[1] == f"`{opt.env}`", f"{opt.flags[0]}: variable {row[1]} != {opt.env}"
    documented = {flag for flag in rows}
    assert documented == {o.flags[0] for o in OPTIONS}, "the table documents flags that do not exist"
    for path in (p for d in SOURCE_DIRS for p in (REPO / d).rglob("*.py")):
        for name in set(re.findall(r"[\"'](SLOTSERVE_[A-Z0-9_]+)[\"']", path.read_text())):
            assert f"`{name}`" in text, f"{name} (used in {path.relative_to(REPO)}) is not documented"


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == ():  # an empty list option: the feature is off
        return "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, enum.Enum):  # a choice option: its value is what the flag takes
        return str(value.value)
    return str(value)


def test_documented_defaults_match_the_code():
    rows = flag_rows()
    scheduler_defaults = {f.name: f.default for f in fields(SchedulerConfig)}
    for f in fields(ServeConfig):
        opt = next(o for o in OPTIONS if o.field == f.name)
        default = f.default if f.default is not None else scheduler_defaults.get(f.name)
        if f.name == "checkpoint_memory_mb":  # sized from the machine at start, not the scheduler's
            default = (
                f"1/{cb.CHECKPOINT_SHARE} of available memory, {cb.CHECKPOINT_MIN_MB}..{cb.CHECKPOINT_MAX_MB}"
            )
        if default is None or f.name in ("served_model_name", "kv_disk_space_mb"):  # no default shown
            continue
        cell = rows[opt.flags[0]][2].strip("`")
        assert cell == _shown(default), f"{opt.flags[0]}: docs say {cell!r}, code says {_shown(default)!r}"


def test_every_exported_metric_is_documented():
    text = OPERATIONS.read_text()
    m = ServerMetrics()
    m.bind(lambda: SchedulerStats(0, 64, 0, (SlotLevel(0, SlotState.IDLE, 5),), 4096, 0, 0, 0, False))
    families = list(text_string_to_metric_families(m.render()[0].decode()))
    assert len(families) >= 30
    for fam in families:
        name = fam.name + ("_total" if fam.type == "counter" else "")
        assert f"`{name}`" in text, f"{name} is exported but not documented in docs/operations.md"


def test_every_label_value_is_documented():
    """Each label value a series exists for (every one is created at start-up from the enums of
    scheduler/stats.py) is named in its metric's row of docs/operations.md."""
    rows = {}
    for line in OPERATIONS.read_text().splitlines():
        if line.startswith("| `slotserve_"):
            rows[line.split("`")[1]] = line
    m = ServerMetrics()
    m.bind(lambda: SchedulerStats(0, 64, 0, (SlotLevel(0, SlotState.IDLE, 5),), 4096, 0, 0, 0, False))
    checked = 0
    for fam in text_string_to_metric_families(m.render()[0].decode()):
        name = fam.name + ("_total" if fam.type == "counter" else "")
        for sample in fam.samples:
            for label, value in sample.labels.items():
                if label in ("le", "slot", "version") or not name.startswith("slotserve_"):
                    continue  # buckets, slot numbers, the build version: not enumerations
                assert name in rows, f"{name} has no row in docs/operations.md"
                assert re.search(rf"\b{re.escape(value)}\b", rows[name]), (
                    f"{name}{{{label}={value!r}}} is exported but its row in docs/operations.md does not name {value}"
                )
                checked += 1
    assert checked > 100  # the checkpoint event x tier x rule grid alone is 2 x 4 x 6
