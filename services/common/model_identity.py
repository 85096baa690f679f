"""A job's model identity (`JobSpec.model_type`) when its user gave none.

The Brain pools by model identity whatever it learns of a model: the finished jobs an
initial resource plan copies, throughput estimates, Rubick fits, layer profiles' owner.
So two jobs may share an identity only when they run the same code - the module's name
alone is not enough: every user's `train.py` is the module `train`, and one user's
one-device history would cap another's unrelated job.

- Code the client packaged (`entrypoint.code_sha256`, `gearshift run`, `gearshift
  submit` of a job file with `entrypoint.path` or `working_dir`, the SDK's
  `submit(working_dir=...)`): the module's name and the first digits of the package's
  digest, `train-3f9a1c2b`. The same code submitted again is the same model; an edit
  is a new one (its history no longer describes it).
- Gearshift's own modules (`gearshift.examples.digits_cnn`): the module's last name,
  `digits_cnn`. Their code ships with Gearshift and is the same on every worker of a
  release, so the name is stable and says what the model is.
- Any other module the workers' environment provides: its full import path (dots
  kept), `mylab.models.train`. One environment has one module at one path; the
  scheduler never imports user code to hash it (it may not have it, and importing
  runs it).

An explicit model_type is the user's word and is never changed (several versions of a
model may share history on purpose). Parameter-server jobs are named elsewhere
(`with_defaults`: their model is the built-in wide-and-deep).
"""

from __future__ import annotations

import hashlib

from gearshift.v1 import common_pb2

BUILTIN_PREFIX = "gearshift."  # modules that ship with Gearshift
DIGEST_DIGITS = 8  # 32 bits: a clash needs ~65,000 versions of one module name
MAX_LENGTH = 128  # a model_type's longest (check_name's, the Brain's column)


def default_model_type(entrypoint: common_pb2.Entrypoint) -> str:
    """The model identity of a job that names none (see the module's docstring)."""
    module = entrypoint.module
    name = module.rsplit(".", 1)[-1]
    if entrypoint.code_sha256:
        return _valid(name, entrypoint.code_sha256)
    if module.startswith(BUILTIN_PREFIX):
        return _valid(name)
    return _valid(module)


def _valid(name: str, digest: str = "") -> str:
    """`name` (and the digest's first digits) as a valid model_type: a name starts with a
    letter or digit (a module `_train` is `train`), and one too long is cut and told apart
    by a digest of the whole."""
    name = name.lstrip("_") or "model"
    if digest:
        name = f"{name[: MAX_LENGTH - DIGEST_DIGITS - 1]}-{digest[:DIGEST_DIGITS]}"
    if len(name) > MAX_LENGTH:
        whole = hashlib.sha256(name.encode()).hexdigest()
        name = f"{name[: MAX_LENGTH - DIGEST_DIGITS - 1]}-{whole[:DIGEST_DIGITS]}"
    return name


def model_type_of(spec: common_pb2.JobSpec) -> str:
    """The spec's model identity: the user's, else the default."""
    return spec.model_type or default_model_type(spec.entrypoint)
