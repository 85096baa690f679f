"""Dollars per device-hour, for the cost policies and the simulator's cost figure."""

from __future__ import annotations

from gearshift.common.errors import ValidationError

# The public cloud on-demand GPU prices Gavel's evaluation uses (Google Cloud, per GPU-hour).
GAVEL_PRICES: dict[str, float] = {"v100": 2.48, "p100": 1.46, "k80": 0.45, "t4": 0.35}


def parse_prices(text: str, field: str = "--prices") -> dict[str, float]:
    """ "v100=2.48,k80=0.45" -> dollars per device-hour of each type (others: Gavel's)."""
    out = dict(GAVEL_PRICES)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or not name.strip() or not price >= 0:
            raise ValidationError(field, f"{item!r} is not TYPE=DOLLARS_PER_HOUR (>= 0)")
        out[name.strip()] = price
    return out
