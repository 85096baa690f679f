"""The scheduler daemon's flags: parsed into settings, bad values refused naming the flag."""

from __future__ import annotations

from typing import cast

import pytest

from gearshift.common.config import parse_config
from gearshift.scheduler.daemon import OPTIONS, PROG, relays_of, settings_from
from gearshift.scheduler.elastic_rounds import ElasticRounds
from gearshift.scheduler.service import SchedulerSettings
from gearshift.scheduler.stages import allocator_for


def settings(*argv: str) -> SchedulerSettings:
    return settings_from(parse_config(PROG, "", OPTIONS, list(argv), environ={}))


def test_defaults_and_flags() -> None:
    default = settings()
    assert (default.policy, default.round_seconds, default.heartbeat_timeout) == (
        "easyscale",
        360.0,
        30.0,
    )
    custom = settings(
        "--policy",
        "hierarchical",
        "--round-seconds",
        "2",
        "--tenant-weights",
        "research=1,product=2",
        "--tenant-policies",
        "research=fifo",
    )
    assert custom.policy == "hierarchical" and custom.round_seconds == 2.0
    assert custom.tenant_weights == {"research": 1.0, "product": 2.0}
    assert custom.tenant_policies == {"research": "fifo"}
    assert not custom.elastic and not default.elastic
    assert default.prices["v100"] == 2.48  # Gavel's public cloud prices
    elastic = settings("--policy", "las", "--elastic", "--prices", "v100=3", "--hysteresis", "0.3")
    assert elastic.elastic and elastic.hysteresis == 0.3 and elastic.prices["v100"] == 3.0
    assert default.preempt_exempt_seconds == 0.0
    assert settings("--preempt-exempt-seconds", "60").preempt_exempt_seconds == 60.0
    assert default.max_moves_per_round == 0
    assert settings("--max-moves-per-round", "100").max_moves_per_round == 100
    assert default.event_rounds == "always"
    assert settings("--event-rounds", "free-devices").event_rounds == "free-devices"
    with pytest.raises(SystemExit):  # argparse names the flag and its choices
        settings("--event-rounds", "sometimes")


def test_rubick_policies_are_accepted() -> None:
    for name in ("rubick", "rubick_e", "rubick_r", "rubick_n"):
        assert settings("--policy", name).policy == name


def test_environment_fallback() -> None:
    config = parse_config(PROG, "", OPTIONS, [], environ={"GEARSHIFT_POLICY": "las"})
    assert settings_from(config).policy == "las"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--round-seconds", "0"], "--round-seconds must be > 0"),
        (["--heartbeat-timeout", "1", "--heartbeat-interval", "2"], "--heartbeat-timeout must"),
        (["--tenant-weights", "a"], "--tenant-weights: 'a' is not NAME=VALUE"),
        (["--tenant-weights", "a=-1"], "--tenant-weights: weight of 'a' must be > 0"),
        (["--tenant-policies", "a=lifo"], "--tenant-policies: 'lifo' is not fairness or fifo"),
        (["--rendezvous-port-base", "80"], "--rendezvous-port-base must be between"),
        (["--policy", "fifo", "--elastic"], "--policy: 'fifo' has no elastic form"),
        (["--policy", "rubick", "--elastic"], "--policy: rubick decides devices itself"),
        (["--prices", "v100=free"], "--prices: 'v100=free' is not TYPE=DOLLARS_PER_HOUR"),
        (["--hysteresis", "-1"], "--hysteresis must be >= 0"),
        (["--preempt-exempt-seconds", "-1"], "--preempt-exempt-seconds must be >= 0"),
        (["--max-moves-per-round", "-1"], "--max-moves-per-round must be >= 0"),
        (["--max-starts-per-round", "-1"], "--max-starts-per-round must be >= 0"),
        (["--policy", "rubick", "--decision-process"], "--decision-process: --policy rubick"),
        (["--straggler-margin", "0"], "--straggler-margin must be > 0"),
        (["--straggler-reports", "0"], "--straggler-reports must be >= 1"),
        (["--straggler-clear-seconds", "-5"], "--straggler-clear-seconds must be > 0"),
        (["--heartbeat-relays", "-1"], "--heartbeat-relays must be 0 to 64"),
        (["--gil-switch-ms", "0"], "--gil-switch-ms must be > 0 and at most 100"),
        (["--heartbeat-relays", "2", "--heartbeat-relay-port", "65535"], "must leave a port"),
        (["--recompute-in-background"], "--recompute-in-background: only with --elastic"),
        (
            ["--policy", "easyscale", "--elastic", "--recompute-in-background"],
            "--policy easyscale --elastic solves none",
        ),
    ],
)
def test_bad_settings_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings(*argv)


def test_recompute_in_background_reaches_the_elastic_allocator() -> None:
    chosen = settings("--policy", "las", "--elastic", "--recompute-in-background")
    allocator = allocator_for(chosen)
    assert isinstance(allocator, ElasticRounds) and allocator.in_background
    assert not cast(
        ElasticRounds, allocator_for(settings("--policy", "las", "--elastic"))
    ).in_background


def test_unknown_policy_is_refused_by_the_parser() -> None:
    with pytest.raises(SystemExit):
        settings("--policy", "nope")


def test_relays_under_tls_need_the_ca_that_they_call_the_scheduler_with() -> None:
    config = parse_config(
        PROG, "", OPTIONS, ["--heartbeat-relays", "1", "--tls-cert", "c", "--tls-key", "k"], {}
    )
    with pytest.raises(ValueError, match="--heartbeat-relays with TLS needs --tls-ca"):
        relays_of(config)
    config = parse_config(PROG, "", OPTIONS, ["--heartbeat-relays", "2", "--token", "t"], {})
    relays = relays_of(config)
    assert relays.count == 2 and relays.env["GEARSHIFT_TOKEN"] == "t"
    relays.stop()  # never started: nothing to stop
