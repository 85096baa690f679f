"""Facts the scheduler, the worker, the Brain and the client must agree on beyond the protos.

Each used to be written out in every place that needed it; a change to one copy
alone would make two services disagree (on when a job is done, which holder to
release, whether a process failed). This module imports only gearshift.v1 and
the standard library, because the client-only install imports it too.
"""

from __future__ import annotations

import math
import re

from gearshift.v1 import common_pb2

# -- jobs and tasks --------------------------------------------------------------

# Job states a job never leaves.
TERMINAL_STATES: frozenset[common_pb2.JobState.ValueType] = frozenset(
    {
        common_pb2.JOB_STATE_SUCCEEDED,
        common_pb2.JOB_STATE_FAILED,
        common_pb2.JOB_STATE_CANCELLED,
    }
)
# Task states a worker reports once, when the task's processes have all exited.
ENDED_TASK_STATES: tuple[common_pb2.TaskState.ValueType, ...] = (
    common_pb2.TASK_STATE_CHECKPOINTED,
    common_pb2.TASK_STATE_COMPLETED,
    common_pb2.TASK_STATE_FAILED,
    common_pb2.TASK_STATE_LEFT,
)


def total_steps(spec: common_pb2.JobSpec) -> int:
    """Global steps the job runs: total_steps, or epochs x ceil(dataset size / global batch).

    The scheduler counts progress against it and the worker passes it to the runtime as
    --steps, so both sides agree on when a job is done.
    """
    if spec.HasField("total_steps"):
        return spec.total_steps
    per_epoch = math.ceil(spec.dataset.size / max(spec.global_batch_size, 1))
    return spec.epochs * max(per_epoch, 1)


def shard_holder_id(job_id: str, est: int) -> str:
    """The shard-manager holder of EST `est` of a dynamic-mode job: the worker reads shards
    under it, the scheduler releases it when the process that ran the EST dies."""
    return f"{job_id}/est-{est}"


# -- the runtime's exit codes (a training process, as the worker and scheduler read them)

EXIT_COMPLETED = 0  # reached total steps
EXIT_BAD_INPUT = 2  # bad flags, spec or job code: no restart can help
EXIT_STOPPED = 75  # EX_TEMPFAIL: checkpointed on request, resume later
EXIT_OUT_OF_MEMORY = 3  # a MemoryError: a restart needs more memory, not the same again
EXIT_FENCED = 4  # a newer placement of the job holds its shard holders: this one is stale
CLEAN_EXITS = (EXIT_COMPLETED, EXIT_STOPPED)  # every other exit code is a failure
# How a task's message starts when a process ran out of memory (TaskStatus.out_of_memory).
OUT_OF_MEMORY = "out of memory"

# -- accelerator types -----------------------------------------------------------

ACCELERATOR_TYPE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
ACCELERATOR_TYPE_RULE = "must be lower-case letters, digits, '_' or '-'"


def is_accelerator_type(value: str) -> bool:
    """Whether `value` is a valid accelerator type label (e.g. "v100", "cpu", "a100-80g")."""
    return ACCELERATOR_TYPE.match(value) is not None


# -- determinism levels ----------------------------------------------------------

DETERMINISM_PREFIX = "DETERMINISM_LEVEL_"  # DeterminismLevel's names less it are the short names
DETERMINISM_LEVELS = ("D0", "D1", "D2")  # short names, weakest first (CLI, YAML, runtime)
DEFAULT_DETERMINISM = "D1"
# A spec's level -> the runtime's --determinism; unspecified means the default.
DETERMINISM_NAMES: dict[common_pb2.DeterminismLevel.ValueType, str] = {
    common_pb2.DETERMINISM_LEVEL_UNSPECIFIED: DEFAULT_DETERMINISM,
    common_pb2.DETERMINISM_LEVEL_D0: "D0",
    common_pb2.DETERMINISM_LEVEL_D1: "D1",
    common_pb2.DETERMINISM_LEVEL_D2: "D2",
}
