"""The scheduler's configuration file: defaults (the union), plugin arguments, and bad files
refused with the key path and the line, before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from gearshift.common.config import parse_config
from gearshift.scheduler.config.cli import render_defaults, render_plugins
from gearshift.scheduler.config.configuration import (
    ConfigurationError,
    HeartbeatConfig,
    parse,
    validate,
)
from gearshift.scheduler.config.settings import settings_of
from gearshift.scheduler.daemon import OPTIONS, PROG, main, relays_of
from gearshift.scheduler.plugins.gavel.elastic_rounds import ElasticRounds
from gearshift.scheduler.plugins.registry import Can, Point, names, plugins
from gearshift.scheduler.plugins.rubick.guarantees import Guarantees
from gearshift.scheduler.plugins.stages import allocator_for
from gearshift.scheduler.service import SchedulerSettings
from gearshift.scheduler.types import LasShares


def settings(data: dict[str, Any] | None = None) -> SchedulerSettings:
    return settings_of(validate(data or {}))


def profile(**points: Any) -> dict[str, Any]:
    return {"profile": points}


def test_the_default_is_the_union() -> None:
    default = settings()
    assert (default.policy, default.elastic) == ("las", True)  # an elastic objective
    assert default.collocation == "deeppool"  # DeepPool's collocation on idle devices
    assert default.execution_plans == "rubick"  # Rubick's plan choice where a spec allows it
    assert (default.plan_min_gain, default.plan_profile) == (0.05, True)
    assert default.plans == "dlrover" and default.plan_interval == 60.0  # DLRover's plans
    assert default.tenants_file == ""  # guarantees, once tenants are configured
    assert default.stragglers.reports == 3
    # The round bounds that held 1,000 workers (bench/load.py).
    assert (default.max_starts_per_round, default.max_moves_per_round) == (200, 100)
    assert default.preempt_exempt_seconds == 60.0 and default.event_rounds == "free-devices"
    assert default.min_recompute_seconds == 30.0 and default.recompute_in_background
    assert default.decision_process  # every default plugin can decide in the child
    assert default.prices["v100"] == 2.48  # Gavel's public cloud prices
    # LAS guarantees 80% of the fair level and gives the rest by Sia's normalized goodput
    assert (default.las.fair_share, default.las.surplus) == (0.8, "speedup")
    assert validate({}).config.heartbeats.relays == 1


def test_plugin_arguments_reach_the_settings() -> None:
    custom = settings(
        {
            "round": {"seconds": 2},
            "profile": {
                "allocate": {
                    "name": "hierarchical",
                    "args": {"weights": {"research": 1, "product": 2}, "policies": {"a": "fifo"}},
                },
                "collocate": {"name": "none"},
                "plans": {"name": "none"},
            },
        }
    )
    assert custom.policy == "hierarchical" and custom.round_seconds == 2.0
    assert custom.tenant_weights == {"research": 1.0, "product": 2.0}
    assert custom.tenant_policies == {"a": "fifo"}
    assert custom.collocation == "none" and custom.plans == "none"
    cost = settings(profile(allocate={"name": "min_total_cost", "args": {"prices": {"v100": 3}}}))
    assert cost.prices["v100"] == 3.0 and cost.prices["k80"] == 0.45
    las = settings(
        profile(allocate={"name": "las", "args": {"fairShare": 1, "surplus": "shortest"}})
    )
    assert (las.las.fair_share, las.las.surplus) == (1.0, "shortest")
    assert (
        settings(profile(allocate={"name": "finish_time_fairness"})).las == LasShares()
    )  # LAS's alone
    rigid = settings(profile(allocate={"name": "fifo"}))
    assert not rigid.elastic and not rigid.recompute_in_background


def test_rubicks_plan_choice_is_on_by_default_and_can_be_off() -> None:
    args = {"minGain": 0.2, "profile": False}
    tuned = settings(profile(executionPlans={"name": "rubick", "args": args}))
    assert tuned.execution_plans == "rubick"
    assert (tuned.plan_min_gain, tuned.plan_profile) == (0.2, False)
    assert settings(profile(executionPlans={"name": "none"})).execution_plans == "none"
    # Rubick's allocators choose each job's plan themselves: the stage stays off beside them.
    assert settings(profile(allocate={"name": "rubick"})).execution_plans == "none"
    assert "executionPlans:\n    name: rubick" in render_defaults()


def test_the_registry_names_every_allocator_once() -> None:
    allocators = names(Point.ALLOCATE)
    assert len(allocators) == len(set(allocators))
    for name in ("las", "easyscale", "yarn_cs", "rubick", "rubick_n", "fifo"):
        assert name in allocators
    assert Can.ADMITS_TENANTS in next(p for p in plugins(Point.ALLOCATE) if p.name == "rubick").can(
        None
    )
    listing = render_plugins()
    for point in Point:
        assert f"{point.key}:" in listing
    assert "### `deeppool`" in render_plugins(markdown=True)


def test_the_defaults_file_is_valid_and_commented() -> None:
    text = render_defaults()
    loaded = parse(text, "defaults")
    assert settings_of(loaded) == settings()
    keys = [line for line in text.splitlines() if ":" in line and not line.lstrip().startswith("#")]
    commented = sum(1 for line in text.splitlines() if line.lstrip().startswith("#"))
    assert commented >= len(keys) - 2  # apiVersion and kind excepted
    assert yaml.safe_load(text)["profile"]["allocate"]["name"] == "las"


BAD = """\
apiVersion: gearshift.dev/v1alpha1
kind: SchedulerConfiguration
round:
  seconds: fast
  maxStart: 3
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            BAD,
            ["4: round.seconds: Input should be a valid number", "5: round.maxStart: unknown key"],
        ),
        ("kind: Pod\n", ["1: kind: Input should be 'SchedulerConfiguration'"]),
        ("round:\n  seconds: 0\n", ["2: round.seconds: Input should be greater than 0"]),
        (
            "heartbeats:\n  intervalSeconds: 5\n  timeoutSeconds: 2\n",
            ["3: heartbeats.timeoutSeconds: must exceed heartbeats.intervalSeconds"],
        ),
        (
            "profile:\n  allocate:\n    name: nope\n",
            ["3: profile.allocate.name: unknown allocate plugin 'nope'; one of: allox, easyscale"],
        ),
        (
            "profile:\n  allocate:\n    name: fifo\n    args:\n      elastic: true\n",
            ["4: profile.allocate.args: 'fifo' has no elastic form"],
        ),
        (
            "profile:\n  collocate:\n    name: deeppool\n    args:\n      ampLimit: 0.5\n",
            ["5: profile.collocate.args.ampLimit: Input should be greater than or equal to 1"],
        ),
        (
            "profile:\n  allocate:\n    name: las\n    args:\n      speed: 3\n",
            ["5: profile.allocate.args.speed: unknown key"],
        ),
        (
            "profile:\n  allocate:\n    name: las\n    args: {fairShare: 1.5}\n",
            ["4: profile.allocate.args.fairShare: Input should be less than or equal to 1"],
        ),
        (
            "profile:\n  allocate:\n    name: las\n    args: {surplus: fastest}\n",
            ["4: profile.allocate.args.surplus: Input should be 'speedup' or 'shortest'"],
        ),
        (
            "profile:\n  allocate:\n    name: las_packed\n",
            ["2: profile.allocate.args: 'las_packed' shares devices (space sharing) and elastic"],
        ),
        (
            "profile:\n  allocate:\n    name: las_packed\n    args: {elastic: false}\n",
            [
                "profile.collocate.name: deeppool cannot collocate beside profile.allocate "
                "las_packed"
            ],
        ),
        (
            "profile:\n  allocate: {name: rubick}\n  executionPlans: {name: rubick}\n",
            ["3: profile.executionPlans.name: rubick cannot choose plans beside profile.allocate"],
        ),
        (
            "profile:\n  executionPlans:\n    args: {minGain: -1}\n",
            ["3: profile.executionPlans.args.minGain: Input should be greater than or equal"],
        ),
        ("round: [1, 2\n", ["(yaml)"]),
        ("- 1\n", ["(top): must be a mapping"]),
    ],
)
def test_bad_files_name_the_key_and_line(text: str, expected: list[str]) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse(text, "f.yaml")
    message = str(caught.value)
    for part in expected:
        assert part in message, message


def test_the_decision_process_composes_with_rubick_and_tenants() -> None:
    """They ship what they keep to the child (round/hooks.KeepsDecisionState): auto takes
    the child, and true is no longer refused."""
    assert settings(profile(allocate={"name": "rubick"})).decision_process
    tenants = profile(tenants={"name": "guarantees", "args": {"file": "t"}})
    assert settings(tenants).decision_process
    both = {**profile(allocate={"name": "rubick"}), "round": {"decisionProcess": True}}
    assert settings(both).decision_process
    assert not settings({"round": {"decisionProcess": False}}).decision_process


def test_the_daemon_refuses_a_bad_file_with_exit_2_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text(BAD)
    database = tmp_path / "never.db"
    code = main(["--config", str(path), "--database-url", f"sqlite:///{database}"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{path}:4: round.seconds" in err and f"{path}:5: round.maxStart: unknown key" in err
    assert not database.exists()  # nothing started
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2


def test_help_lists_at_most_20_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gearshift.scheduler", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    options = [line for line in out.splitlines() if line.lstrip().startswith("-")]
    assert len(options) <= 20, options


def test_config_check_command(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(render_defaults())
    bad.write_text(BAD)
    module = [sys.executable, "-m", "gearshift.scheduler.config.cli"]
    ok = subprocess.run([*module, "check", str(good)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and "valid (allocate las" in ok.stdout
    refused = subprocess.run(
        [*module, "check", str(bad)], capture_output=True, text=True, check=False
    )
    assert refused.returncode == 2 and f"{bad}:5: round.maxStart: unknown key" in refused.stderr


def test_the_allocators_built_from_the_registry() -> None:
    chosen = allocator_for(settings())
    assert isinstance(chosen, ElasticRounds) and chosen.in_background
    plain = settings(profile(allocate={"name": "las", "args": {"recomputeInBackground": False}}))
    assert not cast(ElasticRounds, allocator_for(plain)).in_background


def test_tenants_wrap_the_allocator(tmp_path: Path) -> None:
    from gearshift.scheduler.plugins.rubick.tenants import TenantsFile

    quotas = tmp_path / "tenants.yaml"
    quotas.write_text("tenants:\n  a:\n    quota: {v100: 2}\n")
    chosen = settings(profile(tenants={"name": "guarantees", "args": {"file": str(quotas)}}))
    assert isinstance(allocator_for(chosen, TenantsFile(quotas)), Guarantees)


def test_relays_under_tls_need_the_ca_that_they_call_the_scheduler_with() -> None:
    config = parse_config(PROG, "", OPTIONS, ["--tls-cert", "c", "--tls-key", "k"], {})
    with pytest.raises(ValueError, match=r"heartbeats\.relays with TLS needs --tls-ca"):
        relays_of(config, HeartbeatConfig(relays=1))
    config = parse_config(PROG, "", OPTIONS, ["--token", "t"], {})
    relays = relays_of(config, HeartbeatConfig(relays=2))
    assert relays.count == 2 and relays.env["GEARSHIFT_TOKEN"] == "t"
    relays.stop()  # never started: nothing to stop


@pytest.mark.parametrize(
    ("path", "render"),
    [
        ("docs/reference/scheduler-plugins.md", lambda: render_plugins(markdown=True)),
        ("docs/reference/scheduler.yaml", render_defaults),
    ],
)
def test_the_generated_reference_is_current(path: str, render: Any) -> None:
    page = Path(__file__).resolve().parents[2] / path
    assert page.read_text() == render(), f"{path} is stale: run `make reference`"
