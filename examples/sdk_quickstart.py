"""Submit a job with the Python SDK, follow it, and read its result.

Start a cluster in another terminal (`gearshift up`), then:

    python -m gearshift.examples.sdk_quickstart [--address 127.0.0.1:50051]

Needs only the client install (`pip install gearshift`): the SDK imports neither
torch nor any service package.
"""

from __future__ import annotations

import argparse
import sys

from gearshift.client import Client, GearshiftError, JobSpec
from gearshift.client.spec import spec_from_dict


def quickstart_spec() -> JobSpec:
    """A small job: the digits CNN with 2 ESTs for 100 steps, on 1 or 2 devices."""
    return spec_from_dict(
        {
            "name": "sdk-quickstart",
            "entrypoint": {"module": "gearshift.examples.digits_cnn", "config": {"lr": 0.05}},
            "num_ests": 2,
            "global_batch_size": 16,
            "total_steps": 100,
            "dataset": {"name": "digits", "size": 1797, "shard_size": 32, "seed": 1},
            "elastic": {"min_devices": 1, "max_devices": 2},
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:50051", help="the scheduler")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    try:
        with Client(args.address) as client:
            job = client.submit(quickstart_spec())
            print(f"submitted {job.job_id}")
            for event in client.watch(job.job_id):
                devices = len(event.placement.processes)
                print(f"  {event.sequence:3d} {event.message or event.type} (devices: {devices})")
            job = client.wait(job.job_id, timeout=args.timeout)
    except GearshiftError as exc:  # typed errors carry the server's message
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    print(f"{job.job_id} ended at step {job.progress.step}, digest {job.final_digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
