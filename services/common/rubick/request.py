"""What a Rubick job asks for: the input of the `rubick` policy and its variants."""

from __future__ import annotations

from dataclasses import dataclass

from gearshift.common.rubick.plans import Plan


@dataclass(frozen=True)
class Request:
    """A job's model (the trace's application name), its original plan on its requested
    GPUs and CPU cores per GPU, and whether it is guaranteed (its tenant's quota covers it:
    it must never run slower than the request with the original plan)."""

    application: str
    plan: Plan
    gpus: int
    cpus_per_gpu: int
    guaranteed: bool = False

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.cpus_per_gpu < 1:
            raise ValueError(
                f"a request needs >= 1 GPU and CPU, got {self.gpus}, {self.cpus_per_gpu}"
            )
        if self.plan.gpus != self.gpus:
            raise ValueError(f"plan {self.plan.label} needs {self.plan.gpus} GPUs, not {self.gpus}")
