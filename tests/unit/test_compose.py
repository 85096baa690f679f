"""docker-compose.yml: rendered by the compose tool when one is installed, validated against
the Compose specification's schema, and checked statically: services, health checks,
dependencies, every GEARSHIFT_* variable read by its daemon, Prometheus scraping every
daemon, the Grafana dashboard's queries naming metrics that exist."""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gearshift.common.config import env_vars
from gearshift.scheduler.config.configuration import load
from gearshift.scheduler.config.settings import settings_of

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DAEMONS = {
    "gearshift-brain": "gearshift.brain.daemon",
    "gearshift-scheduler": "gearshift.scheduler.daemon",
    "gearshift-shardmanager": "gearshift.shardmanager.daemon",
    "gearshift-worker": "gearshift.worker.daemon",
}


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text())["services"])


def _daemon(service: dict[str, Any]) -> str:
    """The Gearshift console script a service runs ("" for postgres and redis)."""
    command = service.get("command") or [""]
    return str(command[0])


def test_expected_services(services: dict[str, Any]) -> None:
    assert {"postgres", "redis", "migrate", "brain", "shardmanager", "scheduler"} <= set(services)
    workers = [s for s in services.values() if _daemon(s) == "gearshift-worker"]
    labels = {w["environment"]["GEARSHIFT_DEVICES"].split(":")[0] for w in workers}
    assert len(workers) >= 2 and len(labels) >= 2, "two CPU workers of different type labels"


def test_health_checks(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if name == "migrate":
            continue
        assert "healthcheck" in service, f"{name} has no health check"
        assert service["healthcheck"]["test"][0] == "CMD"


def _needs(service: dict[str, Any], other: str, condition: str) -> bool:
    return bool(service.get("depends_on", {}).get(other, {}).get("condition") == condition)


def test_dependencies_wait_for_health_and_migration(services: dict[str, Any]) -> None:
    assert _needs(services["migrate"], "postgres", "service_healthy")
    for name in ("brain", "scheduler"):
        assert _needs(services[name], "migrate", "service_completed_successfully"), name
    assert _needs(services["shardmanager"], "redis", "service_healthy")
    assert _needs(services["scheduler"], "brain", "service_healthy")
    assert _needs(services["scheduler"], "shardmanager", "service_healthy")
    for name, service in services.items():
        if _daemon(service) == "gearshift-worker":
            assert _needs(service, "scheduler", "service_healthy"), name


def test_every_variable_is_read_by_its_daemon(services: dict[str, Any]) -> None:
    for name, service in services.items():
        command = service.get("command") or []
        if not command or command[0] not in DAEMONS:
            continue
        options = importlib.import_module(DAEMONS[command[0]]).OPTIONS
        given = {k for k in service.get("environment", {}) if k.startswith("GEARSHIFT_")}
        unknown = given - env_vars(options)
        assert not unknown, f"{name}: {sorted(unknown)} are not read by {command[0]}"


def test_the_scheduler_file_is_mounted_and_valid(services: dict[str, Any]) -> None:
    scheduler = services["scheduler"]
    path = scheduler["environment"]["GEARSHIFT_CONFIG"]
    assert f"./deploy/scheduler.yaml:{path}:ro" in scheduler["volumes"]
    settings = settings_of(load(ROOT / "deploy" / "scheduler.yaml"))
    assert (settings.brain_address, settings.shard_manager_address) == (
        "brain:50052",
        "shardmanager:50053",
    )


def test_checkpoints_are_shared(services: dict[str, Any]) -> None:
    root = settings_of(load(ROOT / "deploy" / "scheduler.yaml")).checkpoint_root
    for name, service in services.items():
        if _daemon(service) == "gearshift-worker":
            assert f"checkpoints:{root}" in service["volumes"], name


def test_gpu_worker_is_documented_with_a_device_reservation() -> None:
    text = COMPOSE.read_text()
    assert "# worker-gpu:" in text
    assert "#           - driver: nvidia" in text
    assert "50051" in text.split("services:")[0], "ports documented in the header"


def _compose_tool() -> list[str] | None:
    """`docker compose` (the v2 plugin) or `docker-compose`, whichever is installed."""
    if shutil.which("docker"):
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, check=False
        )
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_the_compose_tool_renders_it() -> None:
    tool = _compose_tool()
    if tool is None:
        pytest.skip("no compose tool on PATH (docker compose, docker-compose)")
    result = subprocess.run(
        [*tool, "--file", str(COMPOSE), "--profile", "grafana", "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


def test_valid_against_the_compose_specification() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(COMPOSE)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def _metrics_port(service: dict[str, Any]) -> str:
    return str(service["environment"]["GEARSHIFT_METRICS_LISTEN"]).rpartition(":")[2]


def test_prometheus_scrapes_every_daemon(services: dict[str, Any]) -> None:
    daemons = {n: s for n, s in services.items() if _daemon(s) in DAEMONS and n != "migrate"}
    expected = {f"{name}:{_metrics_port(s)}" for name, s in daemons.items()}
    mounts = {m.split(":")[1]: m.split(":")[0] for m in services["prometheus"]["volumes"]}
    config = yaml.safe_load((ROOT / mounts["/etc/prometheus/prometheus.yml"]).read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    assert targets == expected


def test_mounted_files_exist(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is missing"


def test_dashboard_service_reads_its_variables(
    services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gearshift.client.dashboard.options import add_options

    service = services["dashboard"]
    assert service["command"][:2] == ["gearshift", "dashboard"]
    for key, value in service["environment"].items():
        monkeypatch.setenv(key, value)
    parser = argparse.ArgumentParser()
    add_options(parser)
    args = parser.parse_args(service["command"][2:])
    assert args.address == service["environment"]["GEARSHIFT_SCHEDULER"]
    assert args.brain == service["environment"]["GEARSHIFT_BRAIN"]
    assert args.listen.endswith(":" + service["ports"][0].split(":")[1])


def _known_metrics() -> set[str]:
    """Every metric family Gearshift's daemons serve (the scrape-time ones included)."""
    from prometheus_client import REGISTRY

    import gearshift.brain.metrics
    import gearshift.common.metrics
    import gearshift.shardmanager.metrics
    import gearshift.worker.metrics  # noqa: F401 - registers its metrics
    from gearshift.scheduler.metrics import cluster_metrics
    from gearshift.v1 import scheduler_pb2

    names = {m.name for m in REGISTRY.collect()}
    names |= {m.name for m in cluster_metrics(scheduler_pb2.ClusterState(), {})}
    return {n for n in names if n.startswith("gearshift_")}


def test_grafana_queries_name_metrics_that_exist() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/gearshift-dashboard.json").read_text())
    known = _known_metrics()
    used: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for name in re.findall(r"gearshift_[a-z_]+", target["expr"]):
                used.add(re.sub(r"_(total|bucket|count|sum)$", "", name))
    assert used, "the dashboard queries no Gearshift metric"
    assert used <= known, f"unknown metrics: {sorted(used - known)}"
    for name in (
        "gearshift_rpc_handled", "gearshift_rpc_duration_seconds", "gearshift_jobs",
        "gearshift_devices_allocated", "gearshift_scheduler_round_duration_seconds",
        "gearshift_scheduler_rescales", "gearshift_shard_transitions",
        "gearshift_brain_samples_ingested",
    ):  # fmt: skip
        assert name in used, f"no panel shows {name}"
