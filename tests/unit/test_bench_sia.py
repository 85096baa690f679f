"""bench/sia.py on the miniature artifact (tests/data/sia) and an artifact result written here:
one table, our rows pooled beside the artifact's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sia import main
from bench.sia_artifact import RESULT_KEYS

DATA = Path(__file__).resolve().parents[1] / "data" / "sia"
WORKLOAD = "tiny/workload-1"


def artifact_result(folder: Path, policy: str, avg_h: float) -> None:
    jobs = [
        {
            "name": f"toy-{i}",
            "submit_s": 0.0,
            "jct_s": avg_h * 3600,
            "gpu_seconds": 60.0,
            "restarts": 1,
        }
        for i in range(3)
    ]
    result = {
        "policy": policy,
        "workload": WORKLOAD,
        "fixed_bsz": True,
        "n_jobs": 3,
        "avg_jct_h": avg_h,
        "p99_jct_h": avg_h,
        "makespan_h": avg_h,
        "gpu_hours_per_job": 60.0 / 3600,
        "restarts_per_job": 1.0,
        "jobs": jobs,
        "command": "stand-in",
        "wall_s": 1.0,
        "date": "2026-11-29T00:00:00Z",
    }
    assert set(result) == set(RESULT_KEYS)
    (folder / f"{policy}-fixed-tiny_workload-1.json").write_text(json.dumps(result))


def test_one_table_ours_beside_the_artifacts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    artifact_result(tmp_path, "sia", 0.01)
    common = ["--sia-data", str(DATA), "--workloads", WORKLOAD, "--rounds", "60"]
    policies = ["--policies", "default profile,rigid LAS"]
    assert main([*common, *policies, "--artifact-results", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["policy"]: r for r in out["rows"]}
    assert set(rows) == {"default profile", "rigid LAS", "sia (artifact)"}
    for row in rows.values():
        assert row["n_jobs"] == 3 and row["avg_jct_h"] > 0
    # Every job pays its first start (the toy model's 40 s) at least.
    assert rows["rigid LAS"]["avg_jct_h"] * 3600 > 40.0
    assert out["avg_jct_h_by_model"]["rigid LAS @ 60 s"]["toy"]["sia_h"] == pytest.approx(0.01)
    assert main([*common, "--policies", "elastic LAS"]) == 0
    table = capsys.readouterr().out
    assert "elastic LAS" in table and "AVG JCT h" in table
