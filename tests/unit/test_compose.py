"""docker-compose.yml, checked statically (no Docker engine here): services, health checks,
dependencies, and that every GEARSHIFT_* variable is one the daemon actually reads."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from gearshift.common.config import env_vars

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


def test_checkpoints_are_shared(services: dict[str, Any]) -> None:
    root = services["scheduler"]["environment"]["GEARSHIFT_CHECKPOINT_ROOT"]
    for name, service in services.items():
        if _daemon(service) == "gearshift-worker":
            assert f"checkpoints:{root}" in service["volumes"], name


def test_gpu_worker_is_documented_with_a_device_reservation() -> None:
    text = COMPOSE.read_text()
    assert "# worker-gpu:" in text
    assert "#           - driver: nvidia" in text
    assert "50051" in text.split("services:")[0], "ports documented in the header"
