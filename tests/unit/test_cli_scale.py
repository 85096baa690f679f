"""`gearshift scale` (also spelled `gearshift job scale`): its arguments, before any call."""

from __future__ import annotations

import pytest

from gearshift.client import cli


def test_scale_parses_counts_cores_and_auto() -> None:
    args = cli.build_parser().parse_args(["scale", "job-1", "--ps", "3", "--workers", "4"])
    assert (args.job_id, args.ps, args.workers, args.auto) == ("job-1", 3, 4, False)
    assert (args.ps_cores, args.worker_cores) == (0.0, 0.0)
    auto = cli.build_parser().parse_args(["scale", "job-1", "--auto"])
    assert auto.auto and auto.ps is None


@pytest.mark.parametrize(
    "argv",
    [
        ["job", "scale", "job-1", "--ps", "3"],  # workers missing
        ["job", "scale", "job-1", "--auto", "--ps", "3", "--workers", "4"],
        ["scale", "job-1"],
    ],
)
def test_scale_refuses_incomplete_or_mixed_requests(argv: list[str]) -> None:
    with pytest.raises(SystemExit, match="gearshift scale"):
        cli.main([*argv, "--address", "127.0.0.1:1"])
