"""Where the seeds' measured data are (Gavel, Rubick, DeepPool): `../shared/data` beside the
checkout, or `$GEARSHIFT_SHARED_DIR/data`. The benchmarks and the tests read them alike."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def shared_data(name: str) -> Path:
    """The folder of one seed's data, e.g. shared_data("gavel")."""
    return Path(os.environ.get("GEARSHIFT_SHARED_DIR", REPO.parent / "shared")) / "data" / name
