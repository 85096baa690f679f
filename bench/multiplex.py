"""DeepPool's foreground/background multiplexing on one CPU worker: what collocating a
background job with a foreground job costs the foreground and gains the cluster, every
figure measured in this run, on a real worker daemon started here (no scheduler: tasks
are started with StartTask, as a scheduler would).

The foreground job trains on 2 CPU slots (2 processes); the background job on one of them
(1 process). Three runs, each from StartTask to the tasks' ends:

1. sequential: the foreground alone, then the background alone;
2. collocated (the worker's loop): both at once, roles FOREGROUND and BACKGROUND, the
   background at SCHED_IDLE and paused whenever the foreground's step time is above
   (1 + --bound) x its step time alone;
3. collocated, priority only: the same with the pause loop made inert (a huge bound).

Reported: foreground slowdown (its time collocated / alone), the background's progress
while the foreground ran (its steps done by then / its steps), and the throughput ratio
(jobs done per second collocated / sequential, the same two jobs). Both jobs end with the
digests of their sequential runs (checked). DeepPool on A100s: foreground < 18% slower,
1.2-2.3x cluster throughput. On a shared CPU machine the figures are noisy.

    .venv/bin/python bench/multiplex.py [--fg-steps 1500] [--bg-steps 1000] [--job MODULE] \\
        [--bound 0.2] [--pause-seconds 2] [--json out.json] [--cuda]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from gearshift.client.processes import DaemonProcess, start_daemon
from gearshift.common.channel import connect
from gearshift.common.facts import ENDED_TASK_STATES
from gearshift.common.ports import free_port
from gearshift.v1 import common_pb2, worker_pb2, worker_pb2_grpc

C = common_pb2
CNN = "gearshift.examples.digits_cnn"
TIMEOUT_S = 900.0
POLL_S = 0.05


def spec(name: str, steps: int, seed: int, module: str) -> C.JobSpec:
    return C.JobSpec(
        name=name,
        entrypoint=C.Entrypoint(module=module, config_json="{}"),
        num_ests=4,
        global_batch_size=16,
        total_steps=steps,
        dataset=C.DatasetSpec(size=1024, shard_size=16, seed=seed),
        checkpoint_every_steps=100,
    )


def request(
    root: Path, task_id: str, job: C.JobSpec, devices: list[int], collocation: C.Collocation
) -> worker_pb2.StartTaskRequest:
    """4 ESTs over `devices` of worker w (2 + 2, or all 4 on one)."""
    per = 4 // len(devices)
    processes = [
        C.ProcessAssignment(
            rank=r, worker_id="w", device_index=d, est_ids=list(range(r * per, (r + 1) * per))
        )
        for r, d in enumerate(devices)
    ]
    return worker_pb2.StartTaskRequest(
        task_id=task_id,
        job_id=task_id.partition(".")[0],
        spec=job,
        placement=C.Placement(processes=processes),
        local_ranks=list(range(len(devices))),
        rendezvous_address=f"127.0.0.1:{free_port()}",
        checkpoint_dir=str(root / "ckpt" / task_id),
        collocation=collocation,
    )


@dataclass
class Ended:
    seconds: float  # from StartTask to its end
    digest: str
    pause_count: int


def run(
    worker: DaemonProcess, requests: Sequence[worker_pb2.StartTaskRequest]
) -> tuple[dict[str, Ended], float]:
    """Start the tasks at once; each one's end, and the background's share of steps done
    when the first task ended (the foreground, started first)."""
    ended: dict[str, Ended] = {}
    progress_at_first_end = 0.0
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        began = time.monotonic()
        for r in requests:
            stub.StartTask(r)
        deadline = began + TIMEOUT_S
        while len(ended) < len(requests):
            if time.monotonic() > deadline:
                raise TimeoutError("the tasks did not end in time")
            for r in requests:
                if r.task_id in ended:
                    continue
                s = stub.GetTaskStatus(worker_pb2.GetTaskStatusRequest(task_id=r.task_id))
                if s.state not in ENDED_TASK_STATES:
                    continue
                if s.state != C.TASK_STATE_COMPLETED:
                    raise RuntimeError(
                        f"{r.task_id} ended {C.TaskState.Name(s.state)}: {s.message}"
                    )
                ended[r.task_id] = Ended(time.monotonic() - began, s.digest, s.pause_count)
                if len(ended) == 1 and len(requests) > 1:
                    other = requests[-1]
                    o = stub.GetTaskStatus(worker_pb2.GetTaskStatusRequest(task_id=other.task_id))
                    done = (
                        o.progress.step
                        if o.state not in ENDED_TASK_STATES
                        else other.spec.total_steps
                    )
                    progress_at_first_end = done / other.spec.total_steps
            time.sleep(POLL_S)
    return ended, progress_at_first_end


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fg-steps", type=int, default=1500, help="the foreground's steps")
    parser.add_argument("--bg-steps", type=int, default=1000, help="the background's steps")
    parser.add_argument("--job", default=CNN, help="the jobs' module (both jobs)")
    parser.add_argument("--bound", type=float, default=0.2, help="--max-foreground-slowdown")
    parser.add_argument("--pause-seconds", type=float, default=2.0)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--cuda",
        action="store_true",
        help="on one GPU (a lent GPU machine): the foreground's one process and the "
        "background's on GPU 0, on streams of high and low priority",
    )
    args = parser.parse_args(argv)

    fg_job = spec("fg", args.fg_steps, 7, args.job)
    bg_job = spec("bg", args.bg_steps, 11, args.job)
    alone = C.Collocation()
    fg_role = C.Collocation(role=C.COLLOCATION_ROLE_FOREGROUND, partner_job_id="bg")
    figures: dict[str, object] = {"fg_steps": args.fg_steps, "bg_steps": args.bg_steps}
    fg_devices = [0] if args.cuda else [0, 1]
    with tempfile.TemporaryDirectory(prefix="gearshift-multiplex-") as tmp:
        root = Path(tmp)
        worker = start_daemon(
            "worker",
            [
                *("--devices", "gpu:1" if args.cuda else "cpu:2"),
                *(("--accelerator", "cuda") if args.cuda else ()),
                *("--worker-id", "w", "--work-dir", str(root / "work")),
                *("--log-every", "2", "--pause-seconds", str(args.pause_seconds)),
                *("--max-foreground-slowdown", str(args.bound)),
            ],
            run_dir=root / "run",
        )
        try:
            worker.wait_ready(60)
            warm = spec("warm", 2, 1, args.job)  # the zygote's preload, the job's first build
            run(worker, [request(root, "warm.1", warm, fg_devices, alone)])
            seq_fg, _ = run(worker, [request(root, "fg.seq", fg_job, fg_devices, alone)])
            seq_bg, _ = run(worker, [request(root, "bg.seq", bg_job, [0], alone)])
            fg_alone, bg_alone = seq_fg["fg.seq"], seq_bg["bg.seq"]
            sequential = fg_alone.seconds + bg_alone.seconds
            slots = "GPU 0" if args.cuda else "2 CPU slots"
            print(f"{args.job}: foreground {args.fg_steps} steps on {slots}, background")
            print(f"{args.bg_steps} steps on 1 of them; --max-foreground-slowdown {args.bound}")
            print(f"\nsequential: foreground {fg_alone.seconds:6.2f} s, then background "
                  f"{bg_alone.seconds:6.2f} s: {sequential:6.2f} s")  # fmt: skip
            figures["sequential_s"] = sequential
            figures["fg_alone_s"], figures["bg_alone_s"] = fg_alone.seconds, bg_alone.seconds
            same = True
            for label, bound in (("collocated", args.bound), ("priority only", 1e9)):
                bg_role = C.Collocation(
                    role=C.COLLOCATION_ROLE_BACKGROUND,
                    partner_job_id="fg",
                    max_foreground_slowdown=bound,
                )
                key = "loop" if bound == args.bound else "priority"
                ended, bg_share = run(
                    worker,
                    [
                        request(root, f"fg.{key}", fg_job, fg_devices, fg_role),
                        request(root, f"bg.{key}", bg_job, [0], bg_role),
                    ],
                )
                fg, bg = ended[f"fg.{key}"], ended[f"bg.{key}"]
                total = max(fg.seconds, bg.seconds)
                slowdown = fg.seconds / fg_alone.seconds
                ratio = sequential / total
                same = same and (fg.digest, bg.digest) == (fg_alone.digest, bg_alone.digest)
                print(f"\n{label}: both done in {total:6.2f} s ({bg.pause_count} pauses)")
                print(f"  foreground slowdown:        {slowdown:6.3f}x ({fg.seconds:.2f} s)")
                print(f"  background progress by then: {100 * bg_share:5.1f}% of its steps")
                print(f"  throughput vs sequential:   {ratio:6.3f}x")
                figures[key] = asdict(fg) | {
                    "bg_s": bg.seconds,
                    "pause_count": bg.pause_count,
                    "total_s": total,
                    "fg_slowdown": slowdown,
                    "bg_progress_when_fg_done": bg_share,
                    "throughput_ratio": ratio,
                }
            print(f"\nsame digests as alone: {same}")
            figures["same_digests"] = same
        finally:
            worker.stop()
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
