"""deploy/inference-extension: the manifests parse and agree with each other and with the code.

Checked: labels the InferencePool selects are the pool pods' labels; its target port is the port
slotserve listens on; its picker reference reaches the endpoint picker's gRPC port; the picker's
metric flags are the names `metrics.router_compat` exports; slotserve's flags and SLOTSERVE_*
variables are accepted by the real `slotserve serve` configuration; the llm-d overlay's KV-events
endpoint, topic and block size match the scheduler config it patches in.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from slotserve.gateway.config import ServeConfig
from slotserve.gateway.kv_events import KVEventsConfig
from slotserve.gateway.options import OPTIONS, add_arguments, config_from_args
from slotserve.metrics.router_compat import KV_CACHE_USAGE, NUM_REQUESTS_WAITING

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "inference-extension"
BASE = ROOT / "base"
LLMD = ROOT / "llm-d"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def all_docs(directory: Path) -> list[dict[str, Any]]:
    return [d for f in sorted(directory.glob("*.yaml")) if f.name != "kustomization.yaml" for d in docs(f)]


def find(items: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = [d for d in items if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind}/{name}, found {len(hits)}"
    return hits[0]


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def flag_values(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def serve_config(args: list[str], environ: dict[str, str]) -> ServeConfig:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return config_from_args(parser.parse_args(args), environ=environ)


def plugin_config(configmap: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(configmap["data"]["plugins.yaml"])


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return all_docs(BASE)


def test_every_file_parses_and_kustomizations_list_them():
    for directory in (BASE, LLMD):
        files = {f.name for f in directory.glob("*.yaml")}
        kust = docs(directory / "kustomization.yaml")[0]
        listed = set(kust.get("resources", [])) | {p["path"] for p in kust.get("patches", [])}
        local = {x for x in listed if not x.startswith("..")}
        assert local == files - {"kustomization.yaml"}, directory
        for f in files - {"kustomization.yaml"}:
            for d in docs(directory / f):
                assert {"apiVersion", "kind", "metadata"} <= d.keys(), f
                assert d["metadata"].get("name"), f


def test_inference_pool_selects_the_slotserve_pods_on_their_port(base):
    pool = find(base, "InferencePool", "slotserve")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    deployment = find(base, "Deployment", "slotserve-pool")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = pool["spec"]["selector"]["matchLabels"]
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    # no other workload in the set carries the pool's labels (the picker would route to it)
    for d in base:
        if d["kind"] == "Deployment" and d is not deployment:
            assert not selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    server = container(deployment, "slotserve")
    config = serve_config(server["args"], {})
    http = next(p for p in server["ports"] if p["name"] == "http")
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [http["containerPort"]] == [config.port]
    assert config.host == "0.0.0.0" and config.served_model_name == ("smollm2",)
    assert server["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert server["livenessProbe"]["httpGet"]["path"] == "/health"


def test_picker_reference_reaches_the_endpoint_picker(base):
    pool = find(base, "InferencePool", "slotserve")
    ref = pool["spec"]["endpointPickerRef"]
    service = find(base, "Service", ref["name"])
    port = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
    epp = find(base, "Deployment", ref["name"])
    assert service["spec"]["selector"].items() <= epp["spec"]["template"]["metadata"]["labels"].items()
    epp_container = container(epp, "epp")
    named = {p["name"]: p["containerPort"] for p in epp_container["ports"]}
    flags = flag_values(epp_container["args"])
    assert named[port["targetPort"]] == int(flags["grpc-port"])
    assert flags["pool-name"] == pool["metadata"]["name"]
    # the RBAC the picker runs under can read pods and the pool
    role = find(base, "Role", epp["spec"]["template"]["spec"]["serviceAccountName"])
    readable = {
        (g, r)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        if {"get", "watch", "list"} <= set(rule["verbs"])
    }
    assert {("", "pods"), ("inference.networking.k8s.io", "inferencepools")} <= readable


def test_picker_reads_the_metric_names_slotserve_exports(base):
    epp = container(find(base, "Deployment", "slotserve-epp"), "epp")
    flags = flag_values(epp["args"])
    assert flags["total-queued-requests-metric"] == NUM_REQUESTS_WAITING
    assert flags["kv-cache-usage-percentage-metric"] == KV_CACHE_USAGE
    # the config file the picker loads is the ConfigMap key it mounts
    mount = next(m for m in epp["volumeMounts"] if m["name"] == "config")
    volume = next(
        v
        for v in find(base, "Deployment", "slotserve-epp")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "config"
    )
    configmap = find(base, "ConfigMap", volume["configMap"]["name"])
    key = flags["config-file"].removeprefix(mount["mountPath"].rstrip("/") + "/")
    assert key in configmap["data"]


def test_plugin_config_is_consistent_and_sized_for_the_pool(base):
    config = plugin_config(find(base, "ConfigMap", "slotserve-epp-config"))
    assert config["kind"] == "EndpointPickerConfig"
    declared = {p.get("name", p["type"]) for p in config["plugins"]}
    for profile in config["schedulingProfiles"]:
        assert {p["pluginRef"] for p in profile["plugins"]} <= declared
    # slotserve's usage gauge counts idle conversations: it must not steer traffic away from them
    assert "kv-cache-utilization-scorer" not in declared
    prefix = next(p for p in config["plugins"] if p["type"] == "prefix-cache-scorer")["parameters"]
    server = serve_config(container(find(base, "Deployment", "slotserve-pool"), "slotserve")["args"], {})
    chars = server.batched_session * server.ctx_size * 4  # ~4 characters of prompt text per token
    assert prefix["lruCapacityPerServer"] == chars // prefix["hashBlockSize"]


def test_llmd_overlay_kv_events_agree_with_the_scheduler_config(base):
    patch = find(docs(LLMD / "slotserve-kv-events.yaml"), "Deployment", "slotserve-pool")
    env = {e["name"]: e.get("value") for e in container(patch, "slotserve")["env"]}
    overlay = docs(LLMD / "epp-kv-events.yaml")
    scorer = next(
        p
        for p in plugin_config(find(overlay, "ConfigMap", "slotserve-epp-config"))["plugins"]
        if p["type"] == "precise-prefix-cache-scorer"
    )["parameters"]
    kv = KVEventsConfig(
        endpoint=env["SLOTSERVE_KV_EVENTS_ENDPOINT"],
        topic=env["SLOTSERVE_KV_EVENTS_TOPIC"],
        block_size=int(env["SLOTSERVE_KV_EVENTS_BLOCK_SIZE"]),
    )
    assert not kv.binds  # pods connect; the scheduler binds
    host, port = kv.endpoint.removeprefix("tcp://").rsplit(":", 1)
    bind_port = scorer["kvEventsConfig"]["zmqEndpoint"].rsplit(":", 1)[1]
    assert port == bind_port
    service = find(overlay, "Service", host)
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    epp_ports = {p["containerPort"] for p in container(find(overlay, "Deployment", host), "epp")["ports"]}
    assert int(port) in epp_ports
    assert kv.topic.startswith(scorer["kvEventsConfig"]["topicFilter"])
    server = serve_config(container(find(base, "Deployment", "slotserve-pool"), "slotserve")["args"], {})
    assert kv.topic == f"kv@$(POD_IP)@{server.served_model_name[0]}"
    assert kv.block_size == scorer["indexerConfig"]["tokenProcessorConfig"]["blockSize"]


def test_every_slotserve_variable_is_a_serve_option():
    known = {o.env for o in OPTIONS}
    for directory in (BASE, LLMD):
        for d in all_docs(directory):
            if d["kind"] != "Deployment":
                continue
            for c in d["spec"]["template"]["spec"]["containers"]:
                names = {e["name"] for e in c.get("env", []) if e["name"].startswith("SLOTSERVE_")}
                assert names <= known, (
                    f"{directory.name}: {sorted(names - known)} are not slotserve serve options"
                )


def test_kustomize_builds_both_sets():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: the structural checks above still ran")
    for directory in (BASE, LLMD):
        out = subprocess.run(
            [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        kinds = {d["kind"] for d in yaml.safe_load_all(out.stdout) if d}
        assert {"InferencePool", "Deployment", "Service", "ConfigMap", "HTTPRoute"} <= kinds
