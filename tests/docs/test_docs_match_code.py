"""Where a doc states a list or a count (modules, imports, capture rules, kernel variants,
subcommands, workloads, models, flags, plots), it equals the code's. (Flags, defaults and
metrics of docs/operations.md: tests/deploy/test_deploy_docs.py; architectures and tensor types
of docs/models.md: tests/engine/test_gguf_file.py.)"""

from __future__ import annotations

import argparse
import ast
import re
import shlex
from pathlib import Path

import pytest
from slotserve.bench.cli import BENCHMARKS
from slotserve.bench.loadtest import cli as loadtest_cli
from slotserve.bench.loadtest.plots import PLOT_FILES
from slotserve.bench.loadtest.workloads import PRESETS, SYNTHETIC_WORKLOADS
from slotserve.engine_ext.model_cache import DEFAULT_MODEL, MODELS
from slotserve.gateway.options import OPTIONS
from slotserve.scheduler.checkpoint_store import CaptureRule

from slotserve.cli import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PACKAGES = ("slotserve", "gateway", "metrics", "scheduler", "engine_ext", "bench")
SOURCE_SUFFIXES = (".py", ".pyx", ".pxd", ".pxi", ".pyi", ".c", ".h")
GENERATED = {"engine_ext/_engine.c"}  # written by Cython at build time
NUMBERS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
RULES = {r.value for r in CaptureRule}


def _text(name: str) -> str:
    return (REPO / name).read_text()


def _table(text: str, header: str) -> list[list[str]]:
    """The rows (cells, stripped) of the markdown table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _count(word: str) -> int:
    return NUMBERS[word.lower()]


# -- docs/structure.md ------------------------------------------------------------------------


def _expand(name: str) -> list[str]:
    m = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", name)
    return [m.group(1) + p + m.group(3) for p in m.group(2).split(",")] if m else [name]


def _source_files() -> list[str]:
    files = []
    for pkg in PACKAGES:
        for p in (REPO / pkg).rglob("*"):
            rel = p.relative_to(REPO).as_posix()
            if p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts and rel not in GENERATED:
                if p.name != "__init__.py":
                    files.append(rel)
    return sorted(files)


def test_structure_names_every_module_and_only_existing_ones():
    rows = _table(_text("docs/structure.md"), "| module |")
    named: set[str] = set()
    for first, *rest in rows:
        for span in _spans(first):
            for path in _expand(span):
                if path.endswith("/"):  # a folder row names its files in its description
                    assert (REPO / path).is_dir(), f"docs/structure.md names {path}, which does not exist"
                    named.update(f"{path}{s}" for s in _spans(" ".join(rest)) if (REPO / path / s).is_file())
                else:
                    assert (REPO / path).exists(), f"docs/structure.md names {path}, which does not exist"
                    named.add(path)
    missing = [f for f in _source_files() if f not in named]
    assert not missing, f"modules without a row in docs/structure.md: {missing}"


def _imports(pkg: str) -> set[str]:
    """The other packages `pkg`'s modules import (absolute or relative, at any depth)."""
    out = set()
    for path in (REPO / pkg).rglob("*.py"):
        inside = list(path.relative_to(REPO / pkg).parts[:-1])
        package = ["slotserve", *([] if pkg == "slotserve" else [pkg]), *inside]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - (node.level - 1)]
                names = (
                    [".".join([*base, node.module])]
                    if node.module
                    else [".".join([*base, a.name]) for a in node.names]
                )
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "slotserve" and len(parts) > 1 and parts[1] in PACKAGES:
                    out.add(parts[1])
    if pkg == "slotserve":  # subcommands are imported by name when they run (cli.COMMANDS)
        out.update(module.split(".")[1] for module, _ in COMMANDS.values() if module.count(".") > 1)
    out.discard(pkg)
    return out


def test_structure_import_table_is_the_code_s():
    rows = _table(_text("docs/structure.md"), "| package | imports")
    documented = {}
    for package, imports in rows:
        name = _spans(package)[0].rstrip("/")
        documented[name] = {s.rstrip("/") for s in _spans(imports) if s.endswith("/")}
    assert set(documented) == set(PACKAGES)
    for pkg in PACKAGES:
        assert documented[pkg] == _imports(pkg), f"{pkg}/: docs say {documented[pkg]}, code {_imports(pkg)}"
    assert not _imports("scheduler") and not _imports("engine_ext")  # the rule the layering rests on


def test_structure_names_every_test_folder():
    row = next(line for line in _text("docs/structure.md").splitlines() if line.startswith("| `tests/` |"))
    listed = re.search(r"one folder per package tested \(([^)]*)\), plus (.*)", row)
    assert listed is not None
    folders = {f.split(":")[0].strip() for f in listed.group(1).split(",")}
    folders |= set(re.findall(r"`(\w+)/`", listed.group(2)))
    on_disk = {p.name for p in (REPO / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == on_disk


def test_structure_names_every_subcommand_and_benchmark():
    text = _text("docs/structure.md")
    for name in COMMANDS:
        assert f"`slotserve {name}" in text, f"slotserve {name} has no row in docs/structure.md"
    for name in BENCHMARKS:
        assert f"`slotserve bench {name}`" in text, f"slotserve bench {name} has no row in docs/structure.md"


def test_kernel_variants_listed_are_the_engine_s():
    from slotserve.engine_ext import _engine

    variants = set(_engine.KERNEL_NAMES)
    row = next(
        line for line in _text("docs/structure.md").splitlines() if "`engine_ext/csrc/dispatch.c`" in line
    )
    assert set(_spans(row.split("|")[2])) == variants
    row = next(
        line for line in _text("docs/operations.md").splitlines() if line.startswith("| `SLOTSERVE_KERNELS`")
    )
    assert set(re.findall(r"`(\w+)`", row.split("|")[3].split("(")[0])) == variants


def test_architectures_listed_are_the_loader_s():
    from slotserve.engine_ext.model_config import ARCHITECTURES

    row = next(
        line for line in _text("docs/structure.md").splitlines() if "`engine_ext/model_config.py`" in line
    )
    listed = re.search(r"`ModelConfig` for ([^(]*) \(`ARCHITECTURES`\)", row)
    assert listed is not None and {a.strip() for a in listed.group(1).split(",")} == set(ARCHITECTURES)


# -- capture rules ----------------------------------------------------------------------------


def test_capture_rule_tables_and_counts_are_the_code_s():
    arch = _text("docs/architecture.md")
    assert {r[0].strip("`") for r in _table(arch, "| rule | when | why |")} == RULES
    m = re.search(r"(\w+) rules capture them", arch)
    assert m is not None and _count(m.group(1)) == len(CaptureRule), "docs/architecture.md: rule count"
    sched = _text("docs/scheduler.md")
    assert {r[0].strip("`") for r in _table(sched, "| rule | when |")} == RULES
    row = next(
        line for line in _text("docs/structure.md").splitlines() if "`scheduler/checkpoint_policy.py`" in line
    )
    listed = re.search(r"`CaptureRule`: ([^)]*)\)", row)
    assert listed is not None and {s.strip() for s in listed.group(1).split(",")} == RULES


# -- models -----------------------------------------------------------------------------------


def test_known_models_and_their_chunk_counts_are_the_code_s():
    rows = _table(_text("docs/models.md"), "| short name |")
    assert {_spans(r[0])[0] for r in rows} == set(MODELS)
    for r in rows:
        name = _spans(r[0])[0]
        assert ("(default)" in r[0]) == (name == DEFAULT_MODEL.name)
        m = re.search(r"(\w+) (?:chunk )?wheels?\b", r[2])
        assert m is not None and _count(m.group(1)) == len(MODELS[name].parts), f"{name}: wheel count"
    readme = _text("README.md")
    row = next(line for line in readme.splitlines() if line.startswith("| `--model NAME`"))
    assert set(re.findall(r"`([\w.-]+)`", row.split("(`slotserve pull --list`:")[1].split(")")[0])) == set(
        MODELS
    )


# -- README -----------------------------------------------------------------------------------


def test_readme_flags_exist():
    flags = {f for o in OPTIONS for f in o.flags}
    rows = _table(_text("README.md"), "| flag | default | what |")
    assert len(rows) > 20
    for first, *_ in rows:
        for flag in re.findall(r"(--[a-z0-9-]+)", first):
            assert flag in flags, f"README.md lists {flag}, which slotserve serve does not have"


def test_strict_type_check_scope_is_stated_as_configured():
    import tomllib

    overrides = tomllib.loads(_text("pyproject.toml"))["tool"]["mypy"]["overrides"]
    strict = sorted(
        m.removeprefix("slotserve.").removesuffix(".*")
        for o in overrides
        if o.get("disallow_untyped_defs")
        for m in o["module"]
    )
    for doc in ("README.md", "docs/structure.md"):
        m = re.search(r"strict on ((?:`\w+/`(?:,\s+|\s+and\s+)?)+)", _text(doc))
        assert m is not None, f"{doc} does not say where the type check is strict"
        assert sorted(re.findall(r"`(\w+)/`", m.group(1))) == strict, f"{doc}: strict on {m.group(1)}"


# -- docs/loadtest.md -------------------------------------------------------------------------


def _loadtest_run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    loadtest_cli.configure(parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def test_loadtest_workloads_and_flags_are_the_code_s():
    text = _text("docs/loadtest.md")
    table = _table(text, "| flag | meaning |")
    rows = {r[0].split()[0].strip("`,"): r for r in table}
    run = _loadtest_run_parser()
    flags = {s for a in run._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    documented = {f for r in table for f in re.findall(r"`(--[a-z0-9-]+)", r[0])}
    assert documented == flags, f"docs/loadtest.md flags table: {documented ^ flags} differ"
    workloads = set(_spans(rows["--workload"][1]))
    assert workloads == {*SYNTHETIC_WORKLOADS, *PRESETS, "trace"} == set(loadtest_cli.WORKLOADS)
    section = text.split("## Workloads", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^- \*\*([\w-]+)\*\*", section, re.M)) >= set(SYNTHETIC_WORKLOADS)
    row = next(
        line for line in _text("docs/structure.md").splitlines() if "`bench/loadtest/workloads.py`" in line
    )
    listed = re.search(r"conversations \(([^)]*)\)", row)
    assert listed is not None and {w.strip() for w in listed.group(1).split(",")} == set(SYNTHETIC_WORKLOADS)
    m = re.search(r"write (\w+) PNG plots", text)
    assert m is not None and _count(m.group(1)) == len(PLOT_FILES)


# -- docs/benchmarks.md -----------------------------------------------------------------------


def _current_figures() -> str:
    text = _text("docs/benchmarks.md")
    return text.split("## Current figures, per model", 1)[1].split("\n# History", 1)[0]


def test_current_benchmark_figures_cover_every_known_model_and_synthetic_preset():
    headings = re.findall(r"^### .*\(`([\w.-]+)`", _current_figures(), re.M)
    assert set(MODELS) <= set(headings)
    from slotserve.bench.synthetic import PRESETS as SYNTHETIC

    synthetic = _current_figures().split("--synthetic`)", 1)[1]
    assert {r[0].strip("`") for r in _table(synthetic, "| preset |")} == set(SYNTHETIC)


def test_every_benchmark_kind_has_its_command_in_benchmarks_md():
    text = _text("docs/benchmarks.md")
    for kind in BENCHMARKS:
        assert f"slotserve bench {kind}" in text, f"docs/benchmarks.md never shows `slotserve bench {kind}`"


@pytest.mark.parametrize("command", sorted(set(re.findall(r"`(slotserve [^`]+)`", _current_figures()))))
def test_current_benchmark_commands_parse(command: str):
    """Every slotserve command of the current figures is one the CLI accepts as written."""
    argv = shlex.split(command)[1:]
    parser = build_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as exc:  # argparse: unknown flag, bad value, missing argument
        pytest.fail(f"`{command}` does not parse ({exc})")


# -- docs/api.md ------------------------------------------------------------------------------


def _route_key(method: str, path: str) -> tuple[str, str]:
    return method, re.sub(r"\{[^}]*\}", "{}", path)


def test_readme_endpoints_are_in_the_api_table():
    m = re.search(r"Besides\s+(.*?)\s+the server offers\s+(.*?): see `docs/api.md`", _text("README.md"), re.S)
    assert m is not None
    readme = set(re.findall(r"`(/[\w/]+)`", m.group(1) + m.group(2)))
    api = {
        span.split()[1] for r in _table(_text("docs/api.md"), "| method and path |") for span in _spans(r[0])
    }
    assert readme <= api and len(readme) >= 9


async def test_api_route_table_is_the_app_s_with_its_api_key_column():
    """Every route of the app is in docs/api.md's table (or, for routers' calls, named in its
    note and docs/operations.md), and the table's API key column is what the app enforces."""
    from gateway_support import running_app, scripted_runtime, serve_config
    from slotserve.gateway.app import create_app

    runtime, _ = scripted_runtime()
    app = create_app(runtime, serve_config(api_key="k"))
    served = {_route_key(m, r.path) for r in app.routes for m in (r.methods or ()) if m != "HEAD"}
    api = _text("docs/api.md")
    table = {}
    for first, key, _ in _table(api, "| method and path | API key |"):
        for span in _spans(first):
            method, path = span.split()
            table[(method, path)] = key == "yes"
    documented = {_route_key(*k) for k in table}
    assert documented <= served, f"docs/api.md lists routes the app does not have: {documented - served}"
    named = set(re.findall(r"`(?:(?:GET|POST) )?(/[\w/.{}-]+)`", api + _text("docs/operations.md")))
    for method, path in served - documented:  # the routers' calls: named in api.md's note and operations.md
        assert path in named, f"{method} {path} is not documented"
    async with running_app(app) as client:
        for (method, path), protected in table.items():
            r = await client.request(method, path.replace("{name}", "x"))
            assert (r.status_code == 401) == protected, (
                f"{method} {path}: {r.status_code}, docs say key {protected}"
            )
