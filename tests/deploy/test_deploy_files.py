"""deploy/: the files parse, resolve, and agree with the code (flags, ports, paths, metric names).

Docker has no engine in CI, so the Dockerfile and compose file are checked by parsing: every
path they copy or mount exists, every flag is accepted by the real `slotserve serve` parser,
ports and probe paths match the gateway's routes.
"""

from __future__ import annotations

import argparse
import configparser
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from slotserve.gateway.config import ServeConfig
from slotserve.gateway.options import OPTIONS, add_arguments, config_from_args
from slotserve.metrics import ServerMetrics
from slotserve.scheduler.stats import SchedulerStats, SlotLevel, SlotState

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "slotserve.json"
RULES = DEPLOY / "prometheus" / "rules.yml"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
K8S = DEPLOY / "k8s"
UNIT = DEPLOY / "systemd" / "slotserve.service"
PORT = 8080


# ---------------------------------------------------------------- helpers


def serve_config(args: list[str]) -> ServeConfig:
    """Parse `args` with the real `slotserve serve` flags, ignoring the environment."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return config_from_args(parser.parse_args(args), environ={})


def exposed_sample_names() -> set[str]:
    m = ServerMetrics()
    m.bind(lambda: SchedulerStats(0, 64, 0, (SlotLevel(0, SlotState.IDLE, 5),), 4096, 0, 0, 0, False))
    text = m.render()[0].decode()
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def referenced_metric_names(text: str) -> set[str]:
    """`slotserve_*` names used in PromQL, recording-rule names (with colons) excluded."""
    return set(re.findall(r"(?<![:\w])slotserve_[a-z0-9_]+(?![:\w])", text))


def recording_rule_names(text: str) -> set[str]:
    return set(re.findall(r"\b[a-z_]+:slotserve_[a-z0-9_]+:[a-z0-9_]+\b", text))


def load_rules() -> dict:
    return yaml.safe_load(RULES.read_text())


def k8s_docs() -> dict[str, dict]:
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        docs[doc["kind"]] = doc
    return docs


def container(docs: dict[str, dict]) -> dict:
    (c,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    return c


def unit_exec_args() -> list[str]:
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(UNIT.read_text())
    exec_start = parser["Service"]["ExecStart"].replace("\\\n", " ").replace("\\", " ")
    words = shlex.split(exec_start)
    assert words[:2] == ["/opt/slotserve/bin/slotserve", "serve"], words
    return words[2:]


def flags_without_host(args: list[str]) -> list[str]:
    return [a for a in args if not a.startswith("--host")]


# ---------------------------------------------------------------- dashboard and rules


def test_dashboard_parses_and_lays_out_without_overlap():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] == "slotserve"
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "duplicate panel ids"
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
            assert p["datasource"]["uid"] == "${datasource}", p["title"]


def test_dashboard_shows_what_operators_need():
    dash = json.loads(DASHBOARD.read_text())
    exprs = {p["title"]: " ".join(t["expr"] for t in p.get("targets", [])) for p in dash["panels"]}
    everything = " ".join(exprs.values())
    assert "job:slotserve_reuse_hit_rate:ratio_rate5m" in everything
    assert "job_source:slotserve_reuse_ratio:ratio_rate5m" in everything  # reuse ratio by source
    ttft = exprs["Time to first token"]
    assert all(f"histogram_quantile({q}" in ttft for q in ("0.5", "0.95", "0.99"))
    assert "slotserve_generated_tokens_total" in everything  # tokens/s
    assert "sum by (state) (slotserve_slots" in everything
    assert "slotserve_queue_depth" in everything
    assert "sum by (event, tier) (rate(slotserve_checkpoints_total" in everything  # checkpoints by tier


def test_every_metric_referenced_by_dashboard_and_rules_is_exported():
    exposed = exposed_sample_names()
    for path in (DASHBOARD, RULES):
        referenced = referenced_metric_names(path.read_text())
        assert referenced, path
        missing = referenced - exposed
        assert not missing, f"{path.name} uses metrics /metrics does not export: {sorted(missing)}"


def test_every_recording_rule_the_dashboard_uses_is_defined():
    defined = {r["record"] for g in load_rules()["groups"] for r in g["rules"] if "record" in r}
    used = recording_rule_names(DASHBOARD.read_text())
    assert used and used <= defined, sorted(used - defined)


def test_prometheus_rule_resource_matches_the_rule_file():
    rule = k8s_docs()["PrometheusRule"]
    assert rule["spec"] == load_rules(), "regenerate deploy/k8s/prometheusrule.yaml from rules.yml"


# ---------------------------------------------------------------- Dockerfile


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_dockerfile_is_multi_stage_non_root_with_healthcheck():
    inst = dockerfile_instructions()
    stages = [rest for k, rest in inst if k == "FROM"]
    assert len(stages) >= 2 and " AS build" in stages[0], stages
    final = inst[max(i for i, (k, _) in enumerate(inst) if k == "FROM") :]
    users = [rest for k, rest in final if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the runtime stage must not run as root"
    health = [rest for k, rest in final if k == "HEALTHCHECK"]
    assert len(health) == 1 and "/health" in health[0] and "CMD" in health[0]
    assert ("EXPOSE", str(PORT)) in final
    entry = [json.loads(rest) for k, rest in final if k == "ENTRYPOINT"]
    assert entry == [["slotserve", "serve"]]
    env = " ".join(rest for k, rest in final if k == "ENV")
    assert f"SLOTSERVE_PORT={PORT}" in env and "SLOTSERVE_HOST=0.0.0.0" in env
    assert any(k == "COPY" and rest.startswith("--from=build") for k, rest in final)
    assert any(k == "RUN" and "slotserve pull" in rest for k, rest in final), "default model pulled at build"
    assert ("ARG", "PULL_MODEL=1") in final


def test_dockerfile_copies_every_package_and_its_ignore_file_lets_them_through():
    pyproject = (REPO / "pyproject.toml").read_text()
    package_dirs = set(re.findall(r'^"slotserve[.\w]*" = "(\w+)"$', pyproject, re.M))
    assert {"slotserve", "engine_ext", "scheduler", "gateway", "metrics", "bench"} <= package_dirs
    copied = set()
    for keyword, rest in dockerfile_instructions():
        if keyword == "COPY" and not rest.startswith("--from"):
            *sources, _dest = rest.split()
            for src in sources:
                assert (REPO / src).exists(), f"COPY {src}: not in the repository"
                copied.add(src.rstrip("/"))
    assert package_dirs <= copied, f"not copied into the image: {sorted(package_dirs - copied)}"
    assert {"pyproject.toml", "setup.py"} <= copied
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().split()
    for name in copied:
        assert f"!{name}" in ignore or f"!{name}/" in ignore, f"{name} excluded from the build context"


# ---------------------------------------------------------------- compose


def test_compose_resolves_services_mounts_and_flags():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert set(services) == {"slotserve", "prometheus", "grafana"}
    base = COMPOSE.parent
    declared_volumes = set(compose.get("volumes") or {})

    build = services["slotserve"]["build"]
    assert (base / build["context"]).resolve() == REPO
    assert (base / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE

    mounts: dict[str, dict[str, str]] = {}
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        mounts[name] = {}
        for volume in svc.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("."):
                assert (base / source).exists(), f"{name}: bind mount {source} does not exist"
                mounts[name][target] = str((base / source).resolve())
            else:
                assert source in declared_volumes, f"{name}: volume {source} is not declared"
                mounts[name][target] = source
        for dep in svc.get("depends_on", []):
            assert dep in services

    cfg = serve_config(services["slotserve"]["command"])
    assert cfg.port == PORT and cfg.host == "0.0.0.0"
    assert mounts["slotserve"][cfg.kv_disk_dir] == "kv-disk"
    assert services["slotserve"]["ports"] == [f"127.0.0.1:{PORT}:{PORT}"]

    # Prometheus: the config it mounts scrapes slotserve and loads the mounted rule file
    prom_mounts = mounts["prometheus"]
    prom_cfg = yaml.safe_load(Path(prom_mounts["/etc/prometheus/prometheus.yml"]).read_text())
    (rule_file,) = prom_cfg["rule_files"]
    assert prom_mounts[rule_file] == str(RULES)
    (job,) = prom_cfg["scrape_configs"]
    assert job["job_name"] == "slotserve" and job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"slotserve:{PORT}"]

    # Grafana: the provider's folder holds the mounted dashboard; the datasource points at Prometheus
    graf = mounts["grafana"]
    providers = yaml.safe_load(
        (Path(graf["/etc/grafana/provisioning/dashboards"]) / "slotserve.yml").read_text()
    )
    folder = providers["providers"][0]["options"]["path"]
    assert graf[f"{folder}/slotserve.json"] == str(DASHBOARD)
    sources = yaml.safe_load(
        (Path(graf["/etc/grafana/provisioning/datasources"]) / "prometheus.yml").read_text()
    )
    assert sources["datasources"][0]["type"] == "prometheus"
    assert sources["datasources"][0]["url"] == "http://prometheus:9090"


# ---------------------------------------------------------------- Kubernetes


def test_k8s_deployment_probes_ports_and_volume():
    docs = k8s_docs()
    assert {"Deployment", "Service", "ServiceMonitor", "PersistentVolumeClaim", "PrometheusRule"} <= set(docs)
    c = container(docs)
    cfg = serve_config(c["args"])
    assert cfg.port == PORT and cfg.host == "0.0.0.0"
    (port,) = c["ports"]
    assert port == {"name": "http", "containerPort": PORT, "protocol": "TCP"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["startupProbe"]["httpGet"]["path"] == "/health"

    pod = docs["Deployment"]["spec"]["template"]["spec"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == cfg.kv_disk_dir)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    pvc = docs["PersistentVolumeClaim"]
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    storage = pvc["spec"]["resources"]["requests"]["storage"]
    assert storage.endswith("Gi") and int(storage[:-2]) * 1024 > cfg.kv_disk_space_mb
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (
        pod["terminationGracePeriodSeconds"] > cfg.drain_grace_s + cfg.shutdown_timeout_s
    )  # the watchdog ends it first


def test_k8s_resources_are_sized_from_the_kv_memory():
    c = container(k8s_docs())
    cfg = serve_config(c["args"])
    limits = c["resources"]["limits"]
    assert limits["memory"].endswith("Gi")
    limit_mib = float(limits["memory"][:-2]) * 1024
    # default model (Qwen2.5-Coder-0.5B): 24 layers x (K + V) x 2 kv heads x 64 dims, float32 at worst
    kv_mib = cfg.batched_session * cfg.ctx_size * 24 * 2 * 2 * 64 * 4 / 2**20
    # the default budget is sized from the memory the process sees (the host's, in a pod)
    assert cfg.checkpoint_memory_mb is not None, "pin --checkpoint-memory-mb under a memory limit"
    needed = kv_mib + cfg.checkpoint_memory_mb + 469 + 256  # + model file + least runtime
    assert limit_mib >= needed, f"memory limit {limit_mib} MiB < {needed:.0f} MiB needed"
    assert c["resources"]["requests"]["memory"] == limits["memory"]
    assert cfg.threads == int(limits["cpu"]), "--threads should equal the cpu limit"


def test_k8s_service_and_servicemonitor_select_the_pods():
    docs = k8s_docs()
    pod_labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    svc = docs["Service"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] == "http" and port["name"] == "http"
    mon = docs["ServiceMonitor"]
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = mon["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"


def test_k8s_kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kust["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    kubectl = shutil.which("kubectl")
    if kubectl:  # extra check where kubectl exists: kustomize builds the set offline
        out = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert len(list(yaml.safe_load_all(out.stdout))) == len(on_disk)


# ---------------------------------------------------------------- systemd and consistency


def test_systemd_unit_runs_serve_with_the_deployment_flags():
    args = unit_exec_args()
    cfg = serve_config(args)
    assert cfg.host == "127.0.0.1" and cfg.port == PORT  # a host service stays on loopback
    k8s_args = container(k8s_docs())["args"]
    compose_args = yaml.safe_load(COMPOSE.read_text())["services"]["slotserve"]["command"]
    assert flags_without_host(args) == flags_without_host(k8s_args) == flags_without_host(compose_args)

    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str
    unit.read_string(UNIT.read_text())
    service = unit["Service"]
    assert service["User"] == "slotserve" and service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) > cfg.drain_grace_s + cfg.shutdown_timeout_s
    assert cfg.kv_disk_dir.startswith("/var/lib/" + service["StateDirectory"].split()[0])
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (the unit is still parsed by the test above)")
    text = UNIT.read_text().replace("/opt/slotserve/bin/slotserve", "/bin/true")
    (tmp_path / "slotserve.service").write_text(text)
    out = subprocess.run(
        [analyze, "verify", str(tmp_path / "slotserve.service")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_slotserve_variable_in_deploy_is_a_real_one():
    from slotserve.engine_ext.model_cache import HOME_ENV
    from slotserve.scheduler.config import REUSE_LOG_ENV

    known = {o.env for o in OPTIONS} | {HOME_ENV, REUSE_LOG_ENV}
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            used = set(re.findall(r"\bSLOTSERVE_[A-Z_]+\b", path.read_text()))
            assert used <= known, f"{path.relative_to(REPO)}: unknown {sorted(used - known)}"
