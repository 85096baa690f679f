"""`python -m gearshift.worker.profiling.profile_job`: a job's layer profile, as JSON.

Loads the job as the runtime does - import `--job` (with `--code-dir` first on the
import path), seed torch, call its `build(config)` - and profiles the model it returns
with the torch.fx profiler at per-device batch B/g for g = 1, 2, 4, ... --max-devices,
feeding it real samples of the job's dataset (collated by the job's own collate).
Prints the LayerProfile message as JSON (or writes it to --out); `gearshift profile`
runs this and stores the result in the Brain. Needs torch (the `worker` extra).

Exit status: 0 done, 2 bad input (a module that does not import, a model torch.fx
cannot trace, a batch the device counts do not divide).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from gearshift.common.errors import ValidationError
from gearshift.common.facts import EXIT_BAD_INPUT
from gearshift.v1 import brain_pb2
from gearshift.worker.training_task import parse_config

DEVICES = ("cpu", "cuda")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gearshift.worker.profiling.profile_job",
        description="Profile a job's model layer by layer (torch.fx) and print the profile.",
    )
    parser.add_argument("--job", required=True, help="module defining build(config) -> Job")
    parser.add_argument("--config", default="{}", help="the job's config, a JSON object")
    parser.add_argument("--code-dir", type=Path, help="folder put first on the import path")
    parser.add_argument("--global-batch", type=int, required=True, help="B, the global batch")
    parser.add_argument(
        "--max-devices", type=int, required=True, help="G: profile g = 1, 2, 4, ... G (divides B)"
    )
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="where to measure")
    parser.add_argument("--repeats", type=int, default=3, help="timings per layer (least counts)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads on CPU")
    parser.add_argument("--seed", type=int, default=0, help="seed before build(config)")
    parser.add_argument("--out", type=Path, help="write the JSON here instead of stdout")
    return parser


def profile(args: argparse.Namespace) -> str:
    """The profile of the job, as the LayerProfile message's JSON."""
    if args.code_dir is not None:
        sys.path.insert(0, str(args.code_dir.resolve()))
    message = measure(
        args.job,
        parse_config(args.config, "--config"),
        global_batch=args.global_batch,
        max_devices=args.max_devices,
        device_kind=args.device,
        repeats=args.repeats,
        threads=args.threads,
        seed=args.seed,
    )
    return json_format.MessageToJson(message, indent=1)


def measure(
    module: str,
    config: dict[str, Any],
    *,
    global_batch: int,
    max_devices: int,
    device_kind: str = "cpu",
    repeats: int = 3,
    threads: int | None = 1,
    seed: int = 0,
) -> brain_pb2.LayerProfile:
    """The job's layer profile, its model built afresh (`threads` None: as the process is).
    ValidationError for a job that cannot be profiled, naming the flag."""
    import torch  # noqa: PLC0415 - after the arguments are checked: it takes a second

    from gearshift.worker.profiling.fxprofile import profile_module  # noqa: PLC0415
    from gearshift.worker.runtime.job import load_job  # noqa: PLC0415

    if device_kind == "cuda" and not torch.cuda.is_available():
        raise ValidationError("--device", "cuda: no CUDA device here")
    device = torch.device(device_kind)
    torch.manual_seed(seed)
    job = load_job(module, config)
    model = job.model.to(device)
    dataset, collate = job.dataset, job.collate

    def make_input(batch: int) -> torch.Tensor:
        samples = collate([dataset[i % len(dataset)] for i in range(batch)])
        inputs = samples[0] if isinstance(samples, (tuple, list)) else samples
        if not isinstance(inputs, torch.Tensor):
            raise ValidationError("--job", "the dataset's inputs must collate to one tensor")
        return inputs.to(device)

    name = torch.cuda.get_device_name(device) if device_kind == "cuda" else "cpu"
    count = threads or torch.get_num_threads()
    label = f"cuda: {name}" if device_kind == "cuda" else f"cpu ({count} thread(s))"
    try:
        return profile_module(
            model,
            (),
            global_batch=global_batch,
            max_devices=max_devices,
            repeats=repeats,
            threads=threads if device_kind == "cpu" else None,
            make_input=make_input,
            device=label,
        )
    except ValueError as exc:
        field, sep, problem = str(exc).partition(": ")
        raise ValidationError(f"--{field.replace('_', '-')}" if sep else "--job", problem) from None
    except torch.fx.proxy.TraceError as exc:
        raise ValidationError("--job", f"torch.fx cannot trace the model: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.global_batch < 1:
            raise ValidationError("--global-batch", "must be >= 1")
        if args.repeats < 1:
            raise ValidationError("--repeats", "must be >= 1")
        text = profile(args)
    except ValidationError as exc:
        print(f"profile_job: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.out is not None:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
