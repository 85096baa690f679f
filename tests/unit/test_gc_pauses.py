"""Every cycle-collector pass is timed (gearshift_gc_pause_seconds) and a long one logged:
a full pass holds the GIL, so it shows up as every RPC's latency tail."""

from __future__ import annotations

import gc

import pytest

from gearshift.common import metrics


def _count(generation: str) -> float:
    for family in metrics.GC_PAUSE_SECONDS.collect():
        for sample in family.samples:
            if sample.name.endswith("_count") and sample.labels["generation"] == generation:
                return sample.value
    return 0.0


def test_full_passes_are_timed_and_long_ones_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    logged: list[tuple[int, float, int]] = []
    callback = metrics.time_collections(lambda *args: logged.append(args))
    try:
        before = _count("2")
        monkeypatch.setattr(metrics, "LONG_GC_PAUSE_S", 0.0)  # every pass counts as long
        gc.collect(2)
        assert _count("2") == before + 1
        assert logged and logged[-1][0] == 2 and logged[-1][1] >= 0.0
        monkeypatch.setattr(metrics, "LONG_GC_PAUSE_S", 3600.0)
        logged.clear()
        gc.collect(2)
        assert _count("2") == before + 2 and not logged
    finally:
        gc.callbacks.remove(callback)
