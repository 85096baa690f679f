"""Free TCP ports on this machine, for launchers, rendezvous addresses and tests."""

from __future__ import annotations

import random
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel hands out now (from the ephemeral range)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_port_in(low: int, high: int, host: str = "127.0.0.1") -> int:
    """A port in [low, high) that is free now, picked at random.

    Below the ephemeral range, no other program is handed it meanwhile, so a
    daemon restarted on it can bind it again; the random pick keeps parallel
    callers apart.
    """
    rng = random.Random()  # not the global generator: a seeded job must not pick our ports
    for _ in range(200):
        port = rng.randrange(low, high)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{high - 1}")
