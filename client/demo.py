"""`make demo` / `python -m gearshift.client.demo`: one job keeps its bits while devices shift.

1. `gearshift up` in-process: Redis, Brain, shard manager, scheduler (EasyScale's greedy
   allocator: it re-plans at every arrival and departure from the EST planner alone, so the
   shifts show within a minute; the default profile's elastic LAS weighs measured
   throughputs, and four CPU slots on a laptop's cores may measure no gain from a device),
   two worker daemons (v100:2, t4:2 - CPU slots with those labels).
2. The digits CNN with 4 ESTs, elastic on 1..4 devices, starts on all 4.
3. A second job that needs 2 devices arrives: the scheduler shrinks the CNN to 2; when
   it ends, a third job takes 1 device and the CNN gets what is left (EasyScale's planner
   may use 2 of the 3: a third device is no faster while one device still holds 2 ESTs);
   then the CNN grows back to 4.
4. The same job, run on a fixed 4 processes by `python -m gearshift.worker.run --spec`.
5. Both digests, whether they are identical, and the held-out accuracy of the model.

Exit status 0 only when the digests are identical.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import json_format

from gearshift.client import render
from gearshift.client.devcluster import ClusterConfig, DevCluster, parse_workers
from gearshift.client.sdk import Client
from gearshift.v1 import common_pb2, scheduler_pb2

C = common_pb2
CNN_CONFIG = {"lr": 0.05, "holdout": 297, "lr_step": 1000}


def cnn_spec(steps: int) -> C.JobSpec:
    """The digits CNN: 4 ESTs, 1,500 training digits (297 held out), elastic on 1..4 devices.

    D2 because its devices are of two types (v100 and t4 labels): D1 would hold it to the
    type it first ran on, and only D2 keeps the bits across types (EasyScale section 4)."""
    return C.JobSpec(
        name="digits-cnn",
        entrypoint=C.Entrypoint(
            module="gearshift.examples.digits_cnn", config_json=json.dumps(CNN_CONFIG)
        ),
        num_ests=4,
        global_batch_size=32,
        total_steps=steps,
        dataset=C.DatasetSpec(name="digits", size=1500, shard_size=25, seed=7),
        elastic=C.ElasticBounds(min_devices=1, max_devices=4),
        determinism=C.DETERMINISM_LEVEL_D2,
        checkpoint_every_steps=50,
    )


def other_spec(name: str, devices: int, steps: int) -> C.JobSpec:
    """A small MLP job that needs exactly `devices` devices: it takes them from the CNN."""
    return C.JobSpec(
        name=name,
        entrypoint=C.Entrypoint(module="gearshift.examples.mlp", config_json="{}"),
        num_ests=devices,
        global_batch_size=8 * devices,
        total_steps=steps,
        dataset=C.DatasetSpec(name="clusters", size=4096, shard_size=64, seed=1),
        elastic=C.ElasticBounds(min_devices=devices, max_devices=devices),
    )


_PRINT = threading.Lock()  # the event watcher prints from its own thread


def say(text: str) -> None:
    with _PRINT:
        print(text, flush=True)


class Timeline:
    """The CNN's devices over time, from its events (printed as they come)."""

    def __init__(self) -> None:
        self.placements: list[str] = []

    def follow(self, client: Client, job_id: str) -> None:
        shown = 0.0
        for event in client.watch(job_id):
            placement = event.placement
            if placement.processes:
                where = f"{len(placement.processes)} ({render.devices_by_type(placement)})"
                if not self.placements or self.placements[-1] != where:
                    self.placements.append(where)
            progress = event.type == scheduler_pb2.JOB_EVENT_TYPE_PROGRESS
            if not progress or time.monotonic() - shown > 3.0:
                shown = time.monotonic() if progress else shown
                say("    " + render.event_line(event))


def wait_step(client: Client, job_id: str, step: int, timeout: float) -> None:
    """Until the job's progress reaches `step` (its reports, not the throttled PROGRESS events)."""
    deadline = time.monotonic() + timeout
    while client.get(job_id).progress.step < step:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the CNN did not reach step {step} in {timeout:.0f}s")
        time.sleep(0.2)


def fixed_run(spec: C.JobSpec, folder: Path) -> str:
    """The digest of the same job on a fixed 4 processes (the runtime's launcher)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec_file = folder / "job.json"
    spec_file.write_text(json_format.MessageToJson(spec))
    command = [
        sys.executable, "-m", "gearshift.worker.run", "--spec", str(spec_file), "--procs", "4",
        "--checkpoint-dir", str(folder / "checkpoints"), "--log-every", "400",
    ]  # fmt: skip
    say("    $ " + " ".join(command[1:]))
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"the fixed run failed:\n{result.stdout}\n{result.stderr}")
    return str(re.findall(r"^digest sha256:([0-9a-f]{64})$", result.stdout, re.MULTILINE)[-1])


def accuracy(checkpoints: Path) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, "-m", "gearshift.examples.digits_cnn", "evaluate",
         "--checkpoint-dir", str(checkpoints), "--config", json.dumps(CNN_CONFIG)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return dict(json.loads(result.stdout))


def run(run_dir: Path, steps: int, timeout: float) -> int:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    started = time.monotonic()
    config = ClusterConfig(
        run_dir=run_dir, base_port=0, workers=parse_workers("v100:2,t4:2"), round_seconds=2.0,
        heartbeat_interval=0.5, heartbeat_timeout=5.0, log_level="warning",
        scheduler={"profile": {"allocate": {"name": "easyscale"}}},
    )  # fmt: skip
    say("[1/5] starting the dev cluster: Redis, Brain, shard manager, scheduler, 2 workers")
    with DevCluster(config) as cluster, Client(cluster.address("scheduler")) as client:
        for row in cluster.rows():
            say(f"    {row.name:<13} {row.address}")
        spec = cnn_spec(steps)
        job = client.submit(spec)
        say(
            f"[2/5] submitted {job.job_id}: digits CNN, 4 ESTs, elastic 1..4 devices, {steps} steps"
        )
        timeline = Timeline()
        watcher = threading.Thread(target=timeline.follow, args=(client, job.job_id), daemon=True)
        watcher.start()

        wait_step(client, job.job_id, 100, timeout)
        say("[3/5] a job needing 2 devices arrives (the CNN should shrink to 2)")
        second = client.submit(other_spec("takes-two", 2, 400))
        client.wait(second.job_id, timeout=timeout)
        say(
            "    takes-two finished; a job needing 1 device arrives"
            " (the CNN gets the 3 left, or 2 of them: 4 ESTs on 3 devices are no faster than on 2)"
        )
        third = client.submit(other_spec("takes-one", 1, 300))
        client.wait(third.job_id, timeout=timeout)
        say("    takes-one finished (the CNN should grow back to 4)")
        final = client.wait(job.job_id, timeout=timeout)
        watcher.join(10)
        if final.state != C.JOB_STATE_SUCCEEDED:
            say(f"the CNN ended {render.state_name(final.state)}: {final.message}")
            return 1
        checkpoints = run_dir / "checkpoints" / job.job_id

    say("[4/5] the same job on a fixed 4 devices")
    reference = fixed_run(spec, run_dir / "fixed-4")
    say("[5/5] held-out accuracy of the elastic run's model")
    scores = accuracy(checkpoints)

    identical = final.final_digest == reference
    path = " -> ".join(timeline.placements)
    say("")
    say(f"devices under the CNN over time:  {path}")
    say(f"rescales:                         {final.rescale_count}")
    say(f"digest, elastic run:              sha256:{final.final_digest}")
    say(f"digest, fixed 4 devices:          sha256:{reference}")
    say(f"identical:                        {'YES' if identical else 'NO'}")
    say(
        f"held-out accuracy:                {scores['accuracy']:.1%} "
        f"({int(scores['correct'])}/{int(scores['samples'])} digits)"
    )
    say(f"demo time:                        {time.monotonic() - started:.0f} s")
    return 0 if identical else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gearshift.client.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run-dir", type=Path, default=Path(".gearshift/demo"))
    parser.add_argument("--steps", type=int, default=2000, help="the CNN's global steps")
    parser.add_argument("--timeout", type=float, default=480.0, help="seconds per wait")
    args = parser.parse_args(argv)
    return run(args.run_dir, args.steps, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
