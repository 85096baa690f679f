"""What each determinism level sets (EasyScale section 3.3), in one place.

Every level (D0, D1, D2): deterministic algorithms only
(`torch.use_deterministic_algorithms(True)`, also for torch.compile), no cuDNN autotuning
(`cudnn.benchmark = False`, `cudnn.deterministic = True`),
`CUBLAS_WORKSPACE_CONFIG=:4096:8`, seeds derived from the job seed, and a fixed
intra-op thread count (`--threads`, default 1): on CPU, reductions can depend on
how many threads split them.

D2 adds kernel choices that do not depend on the device type:
- CPU: every EST runs with `d2_threads` intra-op threads whatever the process
  was given; the vector ISA is pinned for ATen (`ATEN_CPU_CAPABILITY=avx2`),
  MKL (`MKL_CBWR=AVX2`) and oneDNN (`ONEDNN_MAX_CPU_ISA=AVX2`) — these are read
  when torch loads, so the launcher sets them in each process's environment
  (this module imports torch only inside `apply` for that reason);
- GPU: no TF32 (matmul and cuDNN), no reduced-precision fp16/bf16 reductions,
  `float32_matmul_precision("highest")`.
"""

from __future__ import annotations

import os
import sys

from gearshift.common.errors import ValidationError
from gearshift.worker.runtime.settings import Determinism

D2_CPU_ISA = "AVX2"


def environment(level: Determinism) -> dict[str, str]:
    """Variables a training process needs before it imports torch."""
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "TORCHINDUCTOR_DETERMINISTIC": "1"}
    if level is Determinism.D2:
        env |= {
            "ATEN_CPU_CAPABILITY": D2_CPU_ISA.lower(),
            "MKL_CBWR": D2_CPU_ISA,
            "ONEDNN_MAX_CPU_ISA": D2_CPU_ISA,
        }
    return env


def apply(level: Determinism, threads: int, d2_threads: int) -> int:
    """Set the process-wide switches; returns the intra-op thread count ESTs run with."""
    import torch  # noqa: PLC0415 - environment() must work before torch loads

    for name, value in environment(level).items():
        os.environ.setdefault(name, value)
    # What torch.use_deterministic_algorithms(True) does, without importing torch._inductor
    # (over a second per process) just to set its flag: the variable above sets it when a
    # job compiles.
    torch._C._set_deterministic_algorithms(True)
    if "torch._inductor.config" in sys.modules:
        setattr(sys.modules["torch._inductor.config"], "deterministic", True)  # noqa: B010
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    effective = d2_threads if level is Determinism.D2 else threads
    if level is Determinism.D2:
        capability = torch.backends.cpu.get_cpu_capability()
        if capability != D2_CPU_ISA:
            raise ValidationError(
                "--determinism",
                f"D2 needs torch's CPU kernels pinned to {D2_CPU_ISA} but they are {capability}: "
                f"set ATEN_CPU_CAPABILITY={D2_CPU_ISA.lower()} before torch is imported "
                "(the launcher does) on a CPU that has it",
            )
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.set_float32_matmul_precision("highest")
    torch.set_num_threads(effective)
    return effective
