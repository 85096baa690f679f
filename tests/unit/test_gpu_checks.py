"""bench/gpu_checks.py's CPU side: arguments, the runs it plans, how it reads and compares
their output, the summary it writes, and its refusal to run without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.gpu_checks import (
    REPO,
    Deadline,
    Launch,
    RunResult,
    bitwise_plan,
    build_parser,
    compare_with,
    describe_ranks,
    digest_of,
    first_difference,
    import_path,
    junit_rows,
    launch_command,
    loss_steps,
    main,
    pack_logs,
    render,
    summary_of,
)


def test_parts_and_counts_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["out", "--parts", "memory, tests"])
    assert args.parts == ["tests", "memory"] and args.device == "cuda"
    parts = ["tests", "bitwise", "d2", "overhead", "memory", "multiplex", "inplace"]
    assert parser.parse_args(["out"]).parts == parts
    for bad, message in (
        (["--parts", "tests,gpus"], "give some of tests, bitwise, d2, overhead, memory"),
        (["--cnn-steps", "2"], "must be >= 3 (got 2)"),
        (["--deadline", "soon"], "'soon' is not a whole number"),
    ):
        with pytest.raises(SystemExit):
            parser.parse_args(["out", *bad])
        assert message in capsys.readouterr().err


def test_every_bitwise_run_ends_at_the_same_step_with_four_ests(tmp_path: Path) -> None:
    plan = bitwise_plan(150)
    assert list(plan) == ["1 x 4", "2 x 2", "4 x 1", "4 -> 2 -> 3 (2,1,1), resumed"]
    assert plan["4 -> 2 -> 3 (2,1,1), resumed"] == [
        Launch(4, 50),
        Launch(2, 100, resume=True),
        Launch(3, 150, "2,1,1", resume=True),
    ]
    assert {launches[-1].steps for launches in plan.values()} == {150}
    args = build_parser().parse_args(["out", "--python", "py"])
    cmd = launch_command(args, "m", tmp_path, 2, Launch(3, 150, "2,1,1", resume=True), "-x")
    text = " ".join(cmd)
    assert cmd[:3] == ["py", "-m", "gearshift.worker.run"]
    for part in ("--ests 4", "--procs 3", "--steps 150", "--device cuda", "--mapping 2,1,1"):
        assert part in text
    assert f"--stats-dir {tmp_path / 'stats-2'}" in text and cmd[-2:] == ["--resume", "-x"]


def write_losses(path: Path, rows: list[tuple[int, list[str]]]) -> None:
    path.write_text("".join(json.dumps({"step": s, "loss_bits": b}) + "\n" for s, b in rows))


def test_runs_are_compared_by_digest_and_every_ests_loss_bits(tmp_path: Path) -> None:
    # A resumed run writes steps again after its checkpoint: the last line of a step counts.
    write_losses(tmp_path / "a", [(1, ["a", "b"]), (2, ["c", "d"]), (3, ["e", "f"])])
    write_losses(
        tmp_path / "b", [(1, ["a", "b"]), (2, ["x", "y"]), (2, ["c", "d"]), (3, ["e", "f"])]
    )
    write_losses(tmp_path / "c", [(1, ["a", "b"]), (2, ["c", "z"]), (3, ["e", "f"])])
    a, b, c = (loss_steps(tmp_path / name) for name in "abc")
    assert b == a and first_difference(a, b) is None
    assert first_difference(a, c) == 2 and first_difference(a, a[:2]) == 3
    reference = RunResult("j", "1 x 4", True, 1.0, "d1", [], losses=a)
    same = RunResult("j", "2 x 2", True, 1.0, "d1", [], losses=b)
    other = RunResult("j", "4 x 1", True, 1.0, "d2", [], losses=c)
    broken = RunResult("j", "staged", False, 1.0, "", [], error="launch 2: exit 1")
    compare_with(reference, [reference, same, other, broken])
    assert [r.passed() for r in (reference, same, other, broken)] == [True, True, False, False]
    assert (other.same_digest, other.first_difference) == (False, 2)
    assert "losses" not in summary_of(other) and summary_of(same)["passed"] is True


def test_the_output_is_read_for_digests_and_each_ranks_device_and_backend() -> None:
    digest = "ab" * 32
    assert digest_of(f"step 1/2 loss 1.0\noutcome completed\ndigest sha256:{digest}\n") == digest
    assert digest_of("Traceback ...") == ""
    ranks = [
        {"rank": 0, "device": "cuda:0", "backend": "gloo"},
        {"rank": 1, "device": "cuda:0", "backend": "gloo"},
        {"rank": 2, "device": "cuda:1", "backend": "nccl"},
    ]
    assert describe_ranks(ranks) == "cuda:0/gloo x2, cuda:1/nccl"


def test_junit_reports_become_rows(tmp_path: Path) -> None:
    report = tmp_path / "t.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.a" name="test_ok" time="1.5"/>'
        '<testcase classname="tests.a" name="test_bad" time="2">'
        '<failure message="assert 1 == 2">long text</failure></testcase>'
        '<testcase classname="tests.b" name="test_gpu" time="0">'
        '<skipped message="needs a GPU"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert [(r["test"], r["outcome"], r["message"]) for r in junit_rows(report)] == [
        ("tests.a::test_ok", "passed", ""),
        ("tests.a::test_bad", "failed", "assert 1 == 2"),
        ("tests.b::test_gpu", "skipped", "needs a GPU"),
    ]


def report() -> dict[str, Any]:
    run = {
        "job": "digits CNN (SGD)", "name": "2 x 2", "ok": True, "seconds": 12.0,
        "digest": "0123456789abcdef" * 4, "backends": ["cuda:0/gloo x2"], "steps": 150,
        "same_digest": False, "first_difference": 3, "error": "", "passed": False,
    }  # fmt: skip
    failed = run | {"name": "4 x 1", "ok": False, "error": "launch 1 (4 processes): exit 1\nx"}
    return {
        "parts": ["tests", "bitwise", "overhead", "memory", "d2"],
        "device": "cuda",
        "seconds": 300.0,
        "verdict": "failed: bitwise",
        "environment": {
            "nvidia_smi": "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB",
            "torch": "2.11.0+cu130",
            "cuda": "13.0",
            "nccl": "2.27.3",
            "count": 1,
        },
        "results": {
            "tests": {
                "ok": True,
                "tests": [
                    {"test": "t::test_gpu", "outcome": "passed", "seconds": 30.0, "message": ""}
                ],
            },
            "bitwise": {"ok": False, "runs": [run, failed]},
            "inplace": {
                "ok": True,
                "error": "",
                "data": {
                    "grow": {
                        "in_place": {
                            "median_s": 0.21,
                            "max_s": 0.3,
                            "pause_median_s": 0.05,
                            "pause_max_s": 0.07,
                            "n": 3,
                        },
                        "restart": {"median_s": 2.5, "max_s": 3.0, "n": 3},
                    },
                    "throughput_ratio": {"in_place": 0.99, "restart": 0.7},
                    "digests_equal": True,
                },
            },
            "overhead": {
                "ok": True,
                "error": "",
                "data": {
                    "one_est": {
                        "job": "ResNet-18",
                        "per_est": 128,
                        "runtime_s_per_step": 0.0102,
                        "plain_s_per_step": 0.01,
                        "slowdown": 1.02,
                    },
                    "eight_ests": [
                        {
                            "job": "ResNet-18",
                            "per_est": 128,
                            "runtime_s_per_step": 0.08,
                            "accumulation_s_per_step": 0.079,
                            "throughput": 0.9875,
                        }
                    ],
                },
            },
            "memory": {
                "ok": True,
                "error": "",
                "data": {
                    "memory": [
                        {
                            "count": 16,
                            "job": "ResNet-18",
                            "per_est": 128,
                            "ests_peak_rss_mib": 900.0,
                            "plain_peak_rss_mib": 14000.0,
                            "ratio": 0.06,
                            "ests_gpu_used_gib": 4.9,
                            "plain_gpu_used_gib": 32.5,
                            "gpu_ratio": 0.151,
                            "ests_gpu_allocated_gib": 3.1,
                            "plain_gpu_allocated_gib": 22.0,
                        }
                    ]
                },
            },
        },
    }


def test_the_summary_has_a_table_per_part() -> None:
    text = render(report())
    assert "- device: NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB" in text
    assert "- torch 2.11.0+cu130, CUDA 13.0, NCCL 2.27.3; 1 GPU(s) visible to torch" in text
    assert "- verdict: **failed: bitwise**" in text
    assert "| t::test_gpu | passed | 30.0 |  |" in text
    assert (
        "| digits CNN (SGD) | 2 x 2 | cuda:0/gloo x2 | `0123456789abcdef` | **NO** | **3** "
        "| 150 | 12 |" in text
    )
    assert "| 4 x 1 | cuda:0/gloo x2 | failed: launch 1 (4 processes): exit 1 | - | - | - |" in text
    assert "| 1 EST vs plain loop | ResNet-18 | 128 | 10.20 | 10.00 | 1.0200x time |" in text
    assert "| 8 ESTs vs 8-micro-batch accumulation | ResNet-18 | 128 | 80.00 | 79.00 |" in text
    assert "| 16 | ResNet-18 | 128 | 4.90 | 32.50 | 0.151 | 3.10 / 22.00 | 900 / 14000 |" in text
    assert "| grow | in_place | 0.210 | 0.300 | 0.050 | 0.070 | 3 |" in text
    assert "| grow | restart | 2.500 | 3.000 | - | - | 3 |" in text
    assert "digests equal: True" in text
    assert text.rstrip().endswith("not run (deadline): d2")


def test_the_deadline_bounds_every_command() -> None:
    deadline = Deadline(100.0, now=0.0)
    assert deadline.left() < 0  # monotonic time is far past 100 s
    assert deadline.limit(300.0) == 1.0
    assert Deadline(1000.0).limit(300.0) == 300.0


def test_logs_are_packed_without_checkpoints(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "run" / "ckpt").mkdir(parents=True)
    (logs / "run" / "launch-0.log").write_text("digest")
    (logs / "run" / "ckpt" / "ckpt-10.pt").write_bytes(b"x" * 1000)
    pack_logs(logs, tmp_path / "logs.tar.gz")
    with tarfile.open(tmp_path / "logs.tar.gz") as tar:
        assert tar.getnames() == ["run/launch-0.log"]


def test_the_repository_imports_as_gearshift_without_an_install(tmp_path: Path) -> None:
    path = import_path(REPO, tmp_path / "path")
    assert (path / "gearshift" / "worker").resolve() == REPO / "services" / "worker"
    assert (path / "gearshift" / "v1").resolve() == REPO / "protos" / "gearshift" / "v1"
    # -S: no site-packages, so not the editable install of this checkout either.
    probe = "import gearshift.worker.gpus as g; print(g.__file__)"
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe], env={"PYTHONPATH": str(path)},
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert done.stdout.strip() == str(path / "gearshift" / "worker" / "gpus.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_without_a_gpu_nothing_runs_and_the_exit_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main([str(out), "--workdir", str(tmp_path / "work"), "--parts", "bitwise"]) == 2
    assert "error: no CUDA device (torch" in capsys.readouterr().err
    summary = (out / "summary.md").read_text()
    assert "- verdict: **not run**" in summary and "the GPU checks need one" in summary
    assert json.loads((out / "summary.json").read_text())["results"] == {}
    assert not list((tmp_path / "work" / "logs").iterdir())
