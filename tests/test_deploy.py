"""deploy/: the Kubernetes manifests validate against the Kubernetes schemas, and name only
images, ports, commands and flags that exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
KUBERNETES = "1.30.0"


def documents() -> list[dict[str, Any]]:
    import yaml

    docs = []
    for path in MANIFESTS:
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d is not None)
    return docs


def containers() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(the pod spec, the container) for every container of every Deployment."""
    return [
        (doc["spec"]["template"]["spec"], c)
        for doc in documents()
        if doc["kind"] == "Deployment"
        for c in doc["spec"]["template"]["spec"]["containers"]
    ]


def test_the_manifests_validate_against_the_kubernetes_schemas() -> None:
    import kubernetes_validate

    assert MANIFESTS, "no manifests under deploy/k8s"
    kinds = set()
    for doc in documents():
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        kinds.add(doc["kind"])
    assert {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler"} <= kinds


def pod_template(container: dict[str, Any]) -> dict[str, Any]:
    (template,) = [
        d["spec"]["template"]
        for d in documents()
        if d["kind"] == "Deployment" and container in d["spec"]["template"]["spec"]["containers"]
    ]
    return template


def test_each_stage_scales_on_a_metric_its_workers_export() -> None:
    from bls.transport import worker_metrics

    source = Path(worker_metrics.__file__).read_text()
    workers = {
        d["metadata"]["name"]
        for d in documents()
        if d["kind"] == "Deployment"
        and d["spec"]["template"]["spec"]["containers"][0].get("args", [""])[0] == "worker"
    }
    scaled = {}
    for doc in documents():
        if doc["kind"] != "HorizontalPodAutoscaler":
            continue
        target = doc["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment"
        (metric,) = doc["spec"]["metrics"]
        scaled[target["name"]] = metric["pods"]["metric"]["name"]
    assert set(scaled) == workers
    for name in scaled.values():
        assert f'"{name}"' in source, name


def test_bls_containers_run_commands_and_flags_that_exist() -> None:
    from bls.cli import _parser

    image = re.search(r"docker build -t (\S+) \.", (ROOT / "Dockerfile").read_text())
    assert image is not None
    assert 'ENTRYPOINT ["bls"]' in (ROOT / "Dockerfile").read_text()
    seen = 0
    for pod, container in containers():
        if container["image"] != image.group(1):
            continue
        seen += 1
        args = container["args"]
        parsed = _parser().parse_args(args)  # an unknown flag or command exits here
        ports = {p["containerPort"] for p in container["ports"]}
        if parsed.command == "serve":
            assert ports == {parsed.port}
            assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": parsed.port}
            assert Path(ROOT / parsed.script).is_file()
        else:
            assert parsed.command == "worker"
            assert ports == {int(parsed.listen.rpartition(":")[2]), parsed.metrics_port}
            assert parsed.advertise.endswith(f":{parsed.listen.rpartition(':')[2]}")
            assert parsed.metrics_host == "0.0.0.0"  # reachable by the scraper
            annotations = pod_template(container)["metadata"]["annotations"]
            assert annotations["prometheus.io/port"] == str(parsed.metrics_port)
        assert parsed.discovery == "etcd://etcd:2379"
        # Kubernetes waits longer than the drain before it kills the pod.
        assert pod["terminationGracePeriodSeconds"] > parsed.grace
    assert seen == 4  # the frontend and the ensemble's three stages


def test_the_frontends_config_binds_every_stage_the_example_uses() -> None:
    import tomllib

    from bls.scriptfile import ScriptFile

    (config_map,) = [d for d in documents() if d["kind"] == "ConfigMap"]
    stages = tomllib.loads(config_map["data"]["bls.toml"])["stages"]
    uses = {u.name for u in ScriptFile(ROOT / "examples/ensemble/ensemble.py").uses}
    assert set(stages) == uses
    assert all("discover" in table for table in stages.values())


@pytest.mark.skipif(
    shutil.which("etcd") is None and not os.environ.get("BLS_REQUIRE_ETCD"),
    reason="etcd is not installed",
)
def test_the_etcd_container_uses_flags_etcd_has() -> None:
    etcd = shutil.which("etcd")
    assert etcd is not None
    flags = subprocess.run([etcd, "--help"], capture_output=True, text=True).stdout
    flags += subprocess.run([etcd, "--help"], capture_output=True, text=True).stderr
    (container,) = [c for _, c in containers() if c["name"] == "etcd"]
    assert container["command"][0] == "etcd"
    for arg in container["command"][1:]:
        assert arg.split("=")[0] in flags, arg
