"""The long chaos soak (outside CI): waves of the chaos test's jobs, one after another,
under one driver that keeps striking for `--minutes`; a summary at the end (kills per
part, jobs, digests, shard accounting), written as JSON with `--json`.

    .venv/bin/python -m tests.chaos.soak --minutes 30 [--seed 1] [--json soak.json]

It runs a PostgreSQL and a Redis of its own (no GEARSHIFT_TEST_* variables needed).
Exit 0 when every wave held, 1 when one did not (its problems printed).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.chaos.driver import Chaos, chaos_site
from tests.chaos.scenario import problems, redelivered, run_wave
from tests.chaos.test_chaos import DYNAMIC_STEPS, STEPS
from tests.e2e.worker_cluster import reference

WAVE_BUDGET = 600.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to strike")
    parser.add_argument("--seed", type=int, default=1, help="the driver's random seed")
    parser.add_argument("--json", type=Path, help="write the summary here too")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs)")
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be > 0")
    root = Path(tempfile.mkdtemp(prefix="gs-soak-"))
    ref = reference(root / "reference", STEPS)
    end = time.monotonic() + args.minutes * 60
    summary: dict[str, object] = {"seed": args.seed, "minutes": args.minutes}
    waves: list[dict[str, object]] = []
    failed: list[str] = []
    kills: Counter[str] = Counter()
    with chaos_site(root / "site") as site:
        chaos = Chaos(site, random.Random(args.seed))
        with chaos.running():
            while time.monotonic() < end and not failed:
                started = time.monotonic()
                wave = run_wave(chaos, STEPS, DYNAMIC_STEPS, WAVE_BUDGET, f"wave{len(waves)}")
                found = problems(wave, site.cluster, ref, DYNAMIC_STEPS)
                failed.extend(found)
                waves.append(
                    {
                        "jobs": len(wave.jobs),
                        "seconds": round(time.monotonic() - started, 1),
                        "digests_equal": sum(
                            wave.final[j].final_digest == ref.digest for j in wave.est_jobs
                        ),
                        "epochs_closed": len(wave.ledger.closed_epochs()),
                        "shards_redelivered": redelivered(wave),
                        "problems": found,
                    }
                )
                print(f"wave {len(waves)}: {waves[-1]} kills so far {dict(chaos.kills)}")
        kills.update(chaos.kills)
        summary.update(
            kills=dict(kills),
            waves=waves,
            jobs=sum(int(str(w["jobs"])) for w in waves),
            held=not failed,
        )
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"logs under {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
