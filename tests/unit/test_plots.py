"""`gearshift simulate --plot DIR`: the simulator records devices in use over time, and the
plot functions write PNGs (opened here) for one or several results."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from gearshift.common.gavel import load_throughputs
from gearshift.scheduler.plugins.easyscale.elastic import make_elastic_policy
from gearshift.scheduler.plugins.gavel.policies import make_policy
from gearshift.scheduler.sim.plots import FILES, usage_figure, write_plots
from gearshift.scheduler.sim.simulator import (
    SimulationResult,
    isolated_reference,
    simulate,
    simulate_elastic,
)
from gearshift.scheduler.sim.trace import generate_workload

CLUSTER = {"v100": 8, "k80": 8}


def assert_real_png(path: Path, min_size: tuple[int, int] = (300, 200)) -> None:
    """A PNG of a real figure: big enough, and not one flat color."""
    assert path.exists() and path.stat().st_size > 0, path
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.width >= min_size[0] and image.height >= min_size[1], image.size
        colors = image.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colors is None or len(colors) > 20, f"{path} is nearly blank"


@pytest.fixture(scope="module")
def results(gavel_data: Path) -> list[SimulationResult]:
    table = load_throughputs(gavel_data / "simulation_throughputs.json")
    workload = generate_workload(table, 12, 4.0, seed=3)
    rigid = simulate(workload, CLUSTER, table, make_policy("max_min_fairness_perf", seed=0))
    elastic = simulate_elastic(workload, CLUSTER, table, make_elastic_policy("easyscale"))
    isolated = isolated_reference(workload, CLUSTER, table)
    return [rigid.with_isolated(isolated), elastic.with_isolated(isolated)]


def _integral(result: SimulationResult) -> float:
    usage = result.usage
    return sum(
        sum(counts.values()) * (after[0] - when)
        for (when, counts), after in itertools.pairwise(usage)
    )


def test_usage_is_recorded_within_capacity(results: list[SimulationResult]) -> None:
    for result in results:
        usage = result.usage
        assert len(usage) >= 3, result.policy
        times = [when for when, _ in usage]
        assert times == sorted(times)
        assert usage[-1][1] == {}, "nothing runs after the last job"
        assert any(counts for _, counts in usage)
        for _, counts in usage:
            assert set(counts) <= set(CLUSTER)
            assert all(0 < n <= CLUSTER[kind] for kind, n in counts.items())


def test_elastic_usage_integrates_to_the_busy_device_time(
    results: list[SimulationResult],
) -> None:
    elastic = results[1]
    busy = elastic.utilization * sum(CLUSTER.values()) * elastic.makespan
    assert _integral(elastic) == pytest.approx(busy, rel=1e-6)


def test_every_job_has_an_isolated_duration_for_its_slowdown(
    results: list[SimulationResult],
) -> None:
    for result in results:
        for job in result.jobs:
            assert job.isolated_seconds > 0
            assert job.ftf == pytest.approx(job.jct / job.isolated_seconds)


def test_several_results_plot_together(results: list[SimulationResult], tmp_path: Path) -> None:
    written = write_plots(results, tmp_path / "plots")
    assert [p.name for p in written] == list(FILES)
    for path in written:
        assert_real_png(path)
    assert len(usage_figure(results).axes) == 2, "one devices-over-time panel per policy"
    with pytest.raises(ValueError, match="no simulation result"):
        write_plots([], tmp_path / "none")


PROFILES = Path(__file__).resolve().parents[2] / "bench" / "profiles"


@pytest.mark.parametrize(
    "policy",
    [
        ["--config", str(PROFILES / "rigid-las.yaml")],
        ["--config", str(PROFILES / "easyscale.yaml")],
        ["--config", "default", "--config", str(PROFILES / "easyscale.yaml")],
    ],
)
def test_simulate_plot_flag_writes_pngs(
    gavel_data: Path, tmp_path: Path, policy: list[str]
) -> None:
    folder = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "gearshift.client.cli", "simulate", "--generate", "8",
         "--jobs-per-hour", "4", "--throughputs", str(gavel_data / "simulation_throughputs.json"),
         "--cluster", "v100=8,k80=8", *policy, "--plot", str(folder)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "plots: " in result.stdout
    for name in FILES:
        assert_real_png(folder / name)
