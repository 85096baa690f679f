"""The demo (`make demo`) end to end, shortened: devices shift under the CNN and its digest
still equals the fixed-device run's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_ends_with_identical_digests(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gearshift.client.demo", "--run-dir", str(tmp_path / "demo"),
         "--steps", "600", "--timeout", "300"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    out = result.stdout
    assert "identical:                        YES" in out
    digests = re.findall(r"sha256:([0-9a-f]{64})", out)
    assert len(digests) == 2 and digests[0] == digests[1]
    rescales = int(re.search(r"rescales:\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    assert rescales >= 2
    accuracy = float(re.search(r"held-out accuracy:\s+([\d.]+)%", out).group(1))  # type: ignore[union-attr]
    assert accuracy > 80.0
