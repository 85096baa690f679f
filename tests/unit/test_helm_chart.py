"""deploy/helm/gearshift rendered by Helm's own template engine at several values sets, every
manifest validated against the Kubernetes API schemas of two minor versions, and the
properties the chart exists for checked: probes, GPUs, hooks, NetworkPolicies, restricted pods,
and every GEARSHIFT_* variable read by its daemon.

Helm comes from the helm-python-sdk package (Helm's Go SDK built as a C library; this
machine reaches no Go module proxy to build the helm CLI). Without it, or without
kubernetes-validate, these tests skip with the reason, and fail under
GEARSHIFT_REQUIRE_SERVICES=1 (CI installs both: .ci/run).
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gearshift.client.cli import build_parser
from gearshift.client.options import TLS_VARIABLES
from gearshift.common.auth import CA_VARIABLE, CERT_VARIABLE, KEY_VARIABLE
from gearshift.common.config import env_vars
from gearshift.common.db import tool_options
from gearshift.scheduler.config.configuration import parse
from gearshift.scheduler.config.settings import settings_of
from gearshift.scheduler.daemon import LEADER_HEALTH
from tools import crd

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gearshift"
# The oldest release the chart admits (Chart.yaml's kubeVersion: gRPC probes are GA there)
# and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.27.0", "1.37.0")
# Custom resources have no schema in kubernetes-validate: checked by the assertions below.
CUSTOM_KINDS = {"ServiceMonitor"}
DAEMONS = {
    "gearshift-brain": "gearshift.brain.daemon",
    "gearshift-scheduler": "gearshift.scheduler.daemon",
    "gearshift-shardmanager": "gearshift.shardmanager.daemon",
    "gearshift-worker": "gearshift.worker.daemon",
}
EXTERNAL = {
    "database": {"url": "postgresql://gearshift:secret@db.example:5432/gearshift"},
    "redis": {"url": "rediss://redis.example:6380/0"},
}
SECURED = {
    **EXTERNAL,
    "tls": {"enabled": True, "secretName": "gearshift-tls", "mutual": True},
    "auth": {
        "enabled": True,
        "existingSecret": "gearshift-tokens",
        "workerTokensSecret": "gearshift-worker-tokens",
    },
}
HOST_NETWORK = {
    "worker": {"hostNetwork": True},
    "networkPolicy": {"nodeCIDRs": ["10.0.0.0/16"]},
}
SQLITE = "sqlite:////tmp/scheduler.db"
MONITORED = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "networkPolicy": {
        "metricsFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ]
    },
}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "external": EXTERNAL,
    "secured": SECURED,
    "host-network": HOST_NETWORK,
    "monitored": MONITORED,
    "cpu-workers": {"worker": {"accelerator": "cpu", "deviceType": "v100", "gpusPerNode": 2}},
    "no-operator": {"operator": {"enabled": False}},
    "single": {
        "scheduler": {"replicas": 1},
        "brain": {"replicas": 1},
        "shardManager": {"replicas": 1},
    },
    "clients-restricted": {
        **EXTERNAL,
        "auth": {"enabled": True, "existingSecret": "gearshift-tokens"},
        "worker": {"enabled": False},
        "operator": {"namespaces": ["team-*"]},
        "networkPolicy": {"schedulerClientsFrom": [{"podSelector": {"matchLabels": {"a": "b"}}}]},
    },
}
# docs/operator/kubernetes-operator.md: what the operator's service account needs.
OPERATOR_RULES = {
    ("gearshift.dev", "gearshiftjobs"): {"get", "list", "watch", "patch"},
    ("gearshift.dev", "gearshiftjobs/status"): {"get", "list", "watch", "patch"},
    ("", "configmaps"): {"list", "watch"},
    ("", "events"): {"create"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "namespaces"): {"list", "watch"},
}


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        reason = f"{name} is not installed ({exc}): pip install -e '.[helm]'"
        if os.environ.get("GEARSHIFT_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason} (GEARSHIFT_REQUIRE_SERVICES=1)")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def helm() -> Any:
    return _module("helm_python")


@pytest.fixture(scope="module")
def kubernetes_validate() -> Any:
    return _module("kubernetes_validate")


def render(helm: Any, values: dict[str, Any], *, upgrade: bool = False) -> list[dict[str, Any]]:
    """`helm template gs deploy/helm/gearshift --namespace gearshift`: every object rendered,
    the values first checked against values.schema.json as `helm install` does."""
    chart = helm.Chart.load(str(CHART))
    chart.validate_schema(values)
    files = chart.render(
        values, name="gs", namespace="gearshift", is_install=not upgrade, is_upgrade=upgrade
    )
    return [
        doc
        for text in files.values()
        if text.strip()
        for doc in yaml.safe_load_all(text)
        if doc is not None
    ]


@pytest.fixture(scope="module")
def rendered(helm: Any) -> dict[str, list[dict[str, Any]]]:
    return {name: render(helm, values) for name, values in VALUE_SETS.items()}


def _component(obj: dict[str, Any]) -> str:
    component: str = obj["metadata"]["labels"]["app.kubernetes.io/component"]
    return component


def _one(objects: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and _component(o) == component]
    assert len(found) == 1, f"{len(found)} {kind} of {component}"
    return found[0]


def _workloads(objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    return (o for o in objects if o["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"})


def _containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_kubernetes(
    rendered: dict[str, list[dict[str, Any]]], kubernetes_validate: Any, version: str
) -> None:
    # Each distinct object once: most are the same in every values set, and each check
    # loads the version's definitions anew (~40 ms).
    distinct: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, objects in rendered.items():
        for obj in objects:
            if obj["kind"] not in CUSTOM_KINDS:
                distinct.setdefault(json.dumps(obj, sort_keys=True), (name, obj))
    for name, obj in distinct.values():
        where = f"{name}: {obj['kind']} {obj['metadata']['name']} on Kubernetes {version}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_helm_lint_is_clean(helm: Any, version: str) -> None:
    """`helm lint --strict --kube-version`: nothing above "info" at any values set."""
    for name, values in VALUE_SETS.items():
        report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{version}")
        findings = [m for m in report["messages"] if m["severity"] > 1]
        assert not findings and not report["errors"], (name, findings, report["errors"])


def test_the_control_plane_runs_as_deployments_with_grpc_probes(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["defaults"]
    ports = {"scheduler": 50051, "brain": 50052, "shardmanager": 50053}
    for component, port in ports.items():
        deployment = _one(objects, "Deployment", component)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        for probe in ("startupProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": port}, (component, probe)
        ready = {"port": port, **({"service": LEADER_HEALTH} if component == "scheduler" else {})}
        assert container["readinessProbe"]["grpc"] == ready, component
        assert container["resources"]["requests"], component
        service = _one(objects, "Service", component)
        assert service["spec"]["selector"].items() <= (
            deployment["spec"]["template"]["metadata"]["labels"].items()
        )
    assert _one(objects, "Deployment", "brain")["spec"]["replicas"] == 2
    assert _one(objects, "Deployment", "shardmanager")["spec"]["replicas"] == 2


def test_the_scheduler_runs_a_leader_and_a_standby(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Two schedulers, each advertising its pod IP; only the leader is ready (behind the
    Service); every pod replaced at once on an update, since a standby is never ready."""
    objects = rendered["defaults"]
    deployment = _one(objects, "Deployment", "scheduler")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": "100%"},
    }
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = _env(container)
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["GEARSHIFT_ADVERTISE_ADDRESS"]["value"] == "$(POD_IP):50051"
    names = [e["name"] for e in container["env"]]
    assert names.index("POD_IP") < names.index("GEARSHIFT_ADVERTISE_ADDRESS"), "$(...) order"
    assert container["readinessProbe"]["periodSeconds"] <= 2, "a new leader ready within ~2 s"
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert (
        spread["labelSelector"]["matchLabels"]
        == _selector("scheduler")["podSelector"]["matchLabels"]
    )
    # A budget for the interchangeable replicas only: a standby is never ready, so one for
    # the scheduler would block evicting its leader for good.
    budgets = {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]
        for o in objects
        if o["kind"] == "PodDisruptionBudget"
    }
    assert budgets == {
        c: {
            "maxUnavailable": 1,
            "selector": {"matchLabels": _selector(c)["podSelector"]["matchLabels"]},
        }
        for c in ("brain", "shardmanager")
    }
    # One scheduler: it stops before its successor starts; one replica needs no budget.
    single = rendered["single"]
    alone = _one(single, "Deployment", "scheduler")["spec"]
    assert alone["strategy"] == {"type": "Recreate"}
    assert "topologySpreadConstraints" not in alone["template"]["spec"]
    assert not [o for o in single if o["kind"] == "PodDisruptionBudget"]


def test_with_tls_the_probes_call_over_tls(rendered: dict[str, list[dict[str, Any]]]) -> None:
    # The kubelet's gRPC probe speaks plaintext only.
    for workload in _workloads(rendered["secured"]):
        if workload["kind"] == "Job" or _component(workload) == "operator":
            continue  # the operator has kopf's HTTP liveness probe (see below)
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        command = container["readinessProbe"]["exec"]["command"]
        assert command[:2] == ["gearshift", "health"]
        asked = build_parser().parse_args(command[1:]).service
        component = _component(workload)
        assert asked == (LEADER_HEALTH if component == "scheduler" else ""), component
        assert "--service" not in container["livenessProbe"]["exec"]["command"]
        env = _env(container)
        assert env["GEARSHIFT_TLS_CA"]["value"] == "/etc/gearshift/tls/ca.crt"
        assert env["GEARSHIFT_TLS_CLIENT_CA"]["value"] == "/etc/gearshift/tls/ca.crt"


def test_workers_are_a_daemonset_on_gpu_nodes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    worker = _one(rendered["defaults"], "DaemonSet", "worker")
    spec = worker["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    volumes = {v["name"]: v for v in spec["volumes"]}
    shm = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert len(shm) == 1
    assert volumes[shm[0]["name"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    env = _env(container)
    assert env["GEARSHIFT_DEVICES"]["value"] == "a100:8"
    assert env["GEARSHIFT_ACCELERATOR"]["value"] == "cuda"
    assert env["GEARSHIFT_SCHEDULER"]["value"] == "gs-gearshift-scheduler:50051"
    assert env["GEARSHIFT_WORKER_ID"]["value"] == "$(NODE_NAME)"
    assert "hostNetwork" not in spec

    cpu = _one(rendered["cpu-workers"], "DaemonSet", "worker")
    (cpu_container,) = cpu["spec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in cpu_container["resources"].get("limits", {})
    assert _env(cpu_container)["GEARSHIFT_DEVICES"]["value"] == "v100:2"

    host = _one(rendered["host-network"], "DaemonSet", "worker")["spec"]["template"]["spec"]
    assert host["hostNetwork"] is True
    assert host["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_migrations_run_as_a_hook_job(helm: Any, rendered: dict[str, list[dict[str, Any]]]) -> None:
    external = rendered["external"]
    job = _one(external, "Job", "migrations")
    hooks = job["metadata"]["annotations"]
    assert hooks["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["gearshift-scheduler", "migrate"]
    assert "GEARSHIFT_DATABASE_URL" in env_vars(tool_options(""))
    # The URL's Secret exists before the Job that reads it.
    secret = _one(external, "Secret", "database")
    assert "pre-install" in secret["metadata"]["annotations"]["helm.sh/hook"]
    assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        hooks["helm.sh/hook-weight"]
    )
    assert secret["stringData"]["url"] == EXTERNAL["database"]["url"]
    # No daemon migrates: two replicas would race.
    for component in ("scheduler", "brain"):
        (daemon,) = _one(external, "Deployment", component)["spec"]["template"]["spec"][
            "containers"
        ]
        assert _env(daemon)["GEARSHIFT_MIGRATE_ON_START"]["value"] == "false"
    # The trial database is a release resource: the Job runs after install, waiting for it.
    trial = _one(rendered["defaults"], "Job", "migrations")
    assert trial["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"
    assert [c["name"] for c in trial["spec"]["template"]["spec"]["initContainers"]] == [
        "wait-for-postgres"
    ]


def test_storage_is_external_by_url_or_trial_statefulsets(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    def statefulsets(name: str) -> set[str]:
        return {
            o["metadata"]["labels"]["app.kubernetes.io/component"]
            for o in rendered[name]
            if o["kind"] == "StatefulSet"
        }

    assert statefulsets("defaults") == {"postgres", "redis-trial"}
    assert statefulsets("external") == set()
    redis = _one(rendered["external"], "Secret", "redis")
    assert redis["stringData"]["url"] == EXTERNAL["redis"]["url"]
    (manager,) = _one(rendered["external"], "Deployment", "shardmanager")["spec"]["template"][
        "spec"
    ]["containers"]
    assert _env(manager)["GEARSHIFT_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "gs-gearshift-redis",
        "key": "url",
    }


def test_tokens_and_tls_come_from_secrets(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["secured"]
    for component in ("scheduler", "brain", "shardmanager"):
        pod = _one(objects, "Deployment", component)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = _env(container)
        assert env["GEARSHIFT_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "gearshift-tokens",
            "key": "service-token",
        }
        assert env["GEARSHIFT_JOB_KEY_FILE"]["value"] == "/etc/gearshift/auth/job.key"
        secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert secrets == {"gearshift-tokens", "gearshift-tls"}, component
    worker = _one(objects, "DaemonSet", "worker")["spec"]["template"]["spec"]
    auth = next(v for v in worker["volumes"] if v["name"] == "auth")
    assert auth["secret"]["items"] == [{"key": "tokens", "path": "tokens"}], "no job key"
    (container,) = worker["containers"]
    assert "GEARSHIFT_JOB_KEY_FILE" not in _env(container)
    assert "/etc/gearshift/worker-token/$NODE_NAME" in container["command"][2]


def test_bad_values_are_refused_naming_the_key(helm: Any) -> None:
    refused: dict[str, dict[str, Any]] = {
        "additional properties 'gpuz' not allowed": {"worker": {"gpuz": 1}},
        "/worker/accelerator": {"worker": {"accelerator": "tpu"}},
        "auth.enabled needs auth.existingSecret": {"auth": {"enabled": True}},
        "tls.enabled needs tls.secretName": {"tls": {"enabled": True}},
        "give url or existingSecret, not both": {
            "database": {"url": "postgresql://x/y", "existingSecret": "db"}
        },
        "scheduler.replicas 2 on SQLite: SQLite has no leader lock": {
            "scheduler": {"extraEnv": [{"name": "GEARSHIFT_DATABASE_URL", "value": SQLITE}]}
        },
    }
    for message, values in refused.items():
        with pytest.raises(helm.errors.HelmError, match=re.escape(message)):
            render(helm, values)
    # One scheduler on SQLite is what it can do.
    env = [{"name": "GEARSHIFT_DATABASE_URL", "value": SQLITE}]
    assert render(helm, {"scheduler": {"replicas": 1, "extraEnv": env}})


def _policy(objects: list[dict[str, Any]], component: str) -> dict[str, Any]:
    return _one(objects, "NetworkPolicy", component)


def _selector(component: str) -> dict[str, Any]:
    labels = {
        "app.kubernetes.io/name": "gearshift",
        "app.kubernetes.io/instance": "gs",
        "app.kubernetes.io/component": component,
    }
    return {"podSelector": {"matchLabels": labels}}


def test_only_the_scheduler_reaches_the_agents(rendered: dict[str, list[dict[str, Any]]]) -> None:
    policy = _policy(rendered["defaults"], "worker")
    assert policy["spec"]["podSelector"] == _selector("worker")["podSelector"]
    reaching_agent = []
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            if port["port"] <= 50054 <= port.get("endPort", port["port"]):
                reaching_agent += rule["from"]
    assert reaching_agent == [_selector("scheduler")]
    # A job's processes on other workers reach every other port (rendezvous, gloo, NCCL).
    peers = [r for r in policy["spec"]["ingress"] if r["from"] == [_selector("worker")]]
    assert [(p["port"], p["endPort"]) for p in peers[0]["ports"]] == [(1, 50053), (50055, 65535)]
    # Host-network workers are outside any policy: none is rendered for them.
    kinds = {(o["kind"], o["metadata"]["name"]) for o in rendered["host-network"]}
    assert ("NetworkPolicy", "gs-gearshift-worker") not in kinds


def test_only_training_pods_reach_the_shard_manager(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    (rule,) = _policy(rendered["defaults"], "shardmanager")["spec"]["ingress"]
    assert rule["from"] == [_selector("worker")]
    assert rule["ports"] == [{"protocol": "TCP", "port": 50053}]
    # Host network: the nodes' addresses stand for the workers.
    (host_rule,) = _policy(rendered["host-network"], "shardmanager")["spec"]["ingress"]
    assert host_rule["from"] == [{"ipBlock": {"cidr": "10.0.0.0/16"}}]
    brain = _policy(rendered["defaults"], "brain")["spec"]["ingress"]
    assert brain[0]["from"] == [_selector("scheduler"), _selector("worker")]
    postgres = _policy(rendered["defaults"], "postgres")["spec"]["ingress"]
    assert postgres[0]["from"] == [_selector(c) for c in ("scheduler", "brain", "migrations")]


def test_pods_run_restricted_but_host_network_workers(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """The restricted Pod Security Standard's checks on every pod the chart makes."""
    for name, objects in rendered.items():
        for workload in _workloads(objects):
            where = f"{name}: {workload['kind']} {workload['metadata']['name']}"
            pod = workload["spec"]["template"]["spec"]
            if pod.get("hostNetwork"):
                assert name == "host-network", where
                continue
            assert not any("hostPath" in v for v in pod.get("volumes", [])), where
            assert pod["securityContext"]["runAsNonRoot"] is True, where
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
            for container in _containers(workload):
                context = container["securityContext"]
                assert context["allowPrivilegeEscalation"] is False, where
                assert context["capabilities"]["drop"] == ["ALL"], where
                assert not context.get("privileged"), where
                assert "ports" not in container or all(
                    "hostPort" not in p for p in container["ports"]
                ), where


def test_every_variable_is_read_by_its_daemon(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, objects in rendered.items():
        for workload in _workloads(objects):
            for container in _containers(workload):
                command = container.get("command", [])
                script = next((d for d in DAEMONS if d in " ".join(command)), "")
                if not script:
                    continue
                module = importlib.import_module(DAEMONS[script])
                options = tool_options("") if "migrate" in command else module.OPTIONS
                given = {k for k in _env(container) if k.startswith("GEARSHIFT_")}
                unknown = given - env_vars(options)
                assert not unknown, f"{name} {script}: {sorted(unknown)} not read by {script}"


def test_the_scheduler_configuration_is_valid_and_points_at_the_services(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["defaults"]
    config_map = _one(objects, "ConfigMap", "scheduler")
    settings = settings_of(parse(config_map["data"]["scheduler.yaml"], "the chart's ConfigMap"))
    assert settings.brain_address == "gs-gearshift-brain:50052"
    assert settings.shard_manager_address == "gs-gearshift-shardmanager:50053"
    assert settings.checkpoint_root == "/var/lib/gearshift/checkpoints"
    raw = yaml.safe_load(config_map["data"]["scheduler.yaml"])
    assert raw["heartbeats"] == {"relays": 1, "relayPort": 50060}
    assert raw["round"]["seconds"] == 30  # the values' own key, merged in
    ports = {p["name"]: p["port"] for p in _one(objects, "Service", "scheduler")["spec"]["ports"]}
    assert ports["relay-0"] == 50060, "workers reach the relay through the scheduler's Service"


def test_the_scheduler_and_operator_alone_have_api_access(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["defaults"]
    role = _one(objects, "Role", "scheduler")
    assert {g for rule in role["rules"] for g in rule["apiGroups"]} == {"coordination.k8s.io", ""}
    binding = _one(objects, "RoleBinding", "scheduler")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gs-gearshift-scheduler", "namespace": "gearshift"}
    ]
    for workload in _workloads(objects):
        pod = workload["spec"]["template"]["spec"]
        component = workload["metadata"]["labels"]["app.kubernetes.io/component"]
        if component in {"scheduler", "operator"}:
            assert pod["serviceAccountName"] == f"gs-gearshift-{component}"
        else:
            assert pod["automountServiceAccountToken"] is False, workload["metadata"]["name"]


def test_the_service_monitor_is_optional_and_scrapes_every_daemon(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    assert not [o for o in rendered["defaults"] if o["kind"] == "ServiceMonitor"]
    objects = rendered["monitored"]
    monitor = next(o for o in objects if o["kind"] == "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "interval": "30s"}]
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    scraped = {
        o["metadata"]["labels"]["app.kubernetes.io/component"]
        for o in objects
        if o["kind"] == "Service" and wanted <= o["metadata"]["labels"].items()
    }
    assert scraped == {"scheduler", "brain", "shardmanager", "worker"}
    metrics_rule = _policy(objects, "shardmanager")["spec"]["ingress"][-1]
    assert metrics_rule["ports"] == [{"protocol": "TCP", "port": 9100}]


def test_the_operator_runs_with_exactly_its_rbac(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["defaults"]
    deployment = _one(objects, "Deployment", "operator")
    assert deployment["spec"]["replicas"] == 1, "kopf runs standalone"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == [
        "gearshift-operator",
        "--scheduler",
        "gs-gearshift-scheduler:50051",
        "--poll-seconds",
        "5",
        "--liveness",
        "http://0.0.0.0:8080/healthz",
    ]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert container["resources"]["requests"]
    role = _one(objects, "ClusterRole", "operator")
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == OPERATOR_RULES
    binding = _one(objects, "ClusterRoleBinding", "operator")
    assert (
        binding["roleRef"]["name"] == role["metadata"]["name"] == "gearshift-gs-gearshift-operator"
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gs-gearshift-operator", "namespace": "gearshift"}
    ]
    # With auth, the service token; some namespaces only, when asked.
    restricted = _one(rendered["clients-restricted"], "Deployment", "operator")
    (scoped,) = restricted["spec"]["template"]["spec"]["containers"]
    assert scoped["command"][-2:] == ["--namespace", "team-*"]
    assert _env(scoped)["GEARSHIFT_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "gearshift-tokens",
        "key": "service-token",
    }


def test_operator_enabled_false_drops_it(rendered: dict[str, list[dict[str, Any]]]) -> None:
    components = {_component(o) for o in rendered["no-operator"]}
    assert "operator" not in components


def test_with_tls_the_operator_calls_the_scheduler_over_tls(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    pod = _one(rendered["secured"], "Deployment", "operator")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "gearshift-tls"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
    folder = Path(mount["mountPath"])
    assert mount["readOnly"]
    # The variables the operator reads (environment_tls), at the Secret's files.
    tls = {k: v["value"] for k, v in _env(container).items() if k.startswith("GEARSHIFT_TLS")}
    assert tls == {
        CA_VARIABLE: str(folder / "ca.crt"),
        CERT_VARIABLE: str(folder / "tls.crt"),
        KEY_VARIABLE: str(folder / "tls.key"),
    }
    assert set(tls) == set(TLS_VARIABLES)
    # Without TLS: none of it.
    plain = _one(rendered["defaults"], "Deployment", "operator")["spec"]["template"]["spec"]
    assert not [v for v in plain["volumes"] if v["name"] == "tls"]
    assert not [k for k in _env(plain["containers"][0]) if k.startswith("GEARSHIFT_TLS")]


def test_the_operator_reaches_restricted_scheduler_clients(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    (api, *_rest) = _policy(rendered["clients-restricted"], "scheduler")["spec"]["ingress"]
    assert api["ports"] == [{"protocol": "TCP", "port": 50051}]
    assert api["from"] == [{"podSelector": {"matchLabels": {"a": "b"}}}, _selector("operator")]
    (open_api, *_rest) = _policy(rendered["defaults"], "scheduler")["spec"]["ingress"]
    assert "from" not in open_api, "no clients listed: anyone, the operator too"


def test_the_crd_is_the_charts_and_the_generated_one(helm: Any) -> None:
    """Helm installs crds/ before the templates; its copy is tools/crd.py's (make reference)."""
    crds = [
        doc
        for file in helm.Chart.load(str(CHART)).crds
        for doc in yaml.safe_load_all(file["data"])
        if doc is not None
    ]
    assert [c["metadata"]["name"] for c in crds] == ["gearshiftjobs.gearshift.dev"]
    assert crds[0] == crd.crd()


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_crd_is_valid_kubernetes(kubernetes_validate: Any, version: str) -> None:
    kubernetes_validate.validate(crd.crd(), version, strict=True)
