"""Several "hosts" on this machine: Linux network namespaces on a bridge, for tests that
must cross a real network stack (issue 46 point 4).

Each host is a namespace with its own loopback and one veth whose peer sits on a bridge
in the root namespace; the bridge holds `.1` of the test's own /24 (10.231.N.0/24) and
host i holds `.10+i`. Daemons in the root namespace listen on the bridge address, and a
process started with `Host.command(...)` (`ip netns exec`) sees only its host's stack:
its 127.0.0.1 is its own, and a peer is reached over TCP through the bridge. The file
system is shared, as a cluster's shared storage would be.

Everything made is removed when the `network` context exits, a failed test included;
what a killed test session left (its pid is in every name) is removed by the next one.
Making namespaces needs root (CAP_NET_ADMIN) and `ip`; `unavailable()` says why not.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tests.helpers import wait_until

SUBNET_PREFIX = "10.231"  # the tests' own addresses: nothing outside this machine is routed there
NAMESPACE = re.compile(r"^gs(\d+)h\d+$")  # gs<pid>h<i>: host i of test process <pid>
BRIDGE = re.compile(r"^gsbr(\d+)$")  # gsbr<pid>: its bridge


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and run.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({run.returncode}): {run.stderr.strip()}")
    return run


@dataclass(frozen=True)
class Host:
    """One network namespace: its name and its address on the bridge."""

    namespace: str
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host's network stack (ip execs it: the pid is argv's)."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def pids(self) -> list[int]:
        """Every process whose network namespace is this host's."""
        run = _ip("netns", "pids", self.namespace, check=False)
        return [int(word) for word in run.stdout.split()]

    def kill_all(self, timeout: float = 10.0) -> list[int]:
        """SIGKILL every process in the namespace, as a host that loses power; returns
        their pids once all are gone (a process forked meanwhile is killed too)."""
        killed: set[int] = set()

        def gone() -> bool:
            left = self.pids()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                killed.add(pid)
            return not left

        wait_until(gone, timeout, f"every process of {self.namespace} killed", interval=0.1)
        return sorted(killed)


@dataclass(frozen=True)
class Network:
    bridge: str
    bridge_address: str  # the root namespace's address on the bridge
    hosts: tuple[Host, ...]


def unavailable() -> str:
    """Why namespaces cannot be made here ("" when they can)."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CAP_NET_ADMIN)"
    probe = f"gsprobe{os.getpid() % 100000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return ""


def _octet() -> int:
    """This test process's third octet: parallel sessions get different subnets."""
    return 1 + os.getpid() % 250


@contextmanager
def network(count: int) -> Iterator[Network]:
    """`count` hosts on a fresh bridge; every namespace, link and process in them is
    removed on exit, whatever happened inside."""
    if not 1 <= count <= 50:
        raise ValueError(f"count must be between 1 and 50 hosts, got {count}")
    _sweep()
    tag = str(os.getpid())  # link names stay within 15 characters up to 7-digit pids
    octet = _octet()
    bridge = f"gsbr{tag}"
    net = Network(
        bridge,
        f"{SUBNET_PREFIX}.{octet}.1",
        tuple(
            Host(f"gs{tag}h{i}", f"{SUBNET_PREFIX}.{octet}.{10 + i}") for i in range(1, count + 1)
        ),
    )
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{net.bridge_address}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, host in enumerate(net.hosts, start=1):
            outside, inside = f"gsv{tag}x{i}", f"gsv{tag}y{i}"
            _ip("netns", "add", host.namespace)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            _ip("link", "set", inside, "netns", host.namespace)
            ns = ("-n", host.namespace)
            _ip(*ns, "addr", "add", f"{host.address}/24", "dev", inside)
            _ip(*ns, "link", "set", inside, "up")
            _ip(*ns, "link", "set", "lo", "up")
        yield net
    finally:
        _remove(net)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep() -> None:
    """Remove namespaces and bridges of test processes that are gone (SIGKILLed sessions)."""
    spaces = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line]
    links = [line.split()[1].rstrip(":") for line in _ip("-o", "link").stdout.splitlines()]
    for name in spaces:
        found = NAMESPACE.match(name)
        if found and not _alive(int(found.group(1))):
            stale = Host(name, "")
            if stale.pids():
                stale.kill_all()
            _ip("netns", "del", name, check=False)
    for name in links:
        found = BRIDGE.match(name)
        if found and not _alive(int(found.group(1))):
            _ip("link", "del", name, check=False)


def _remove(net: Network) -> None:
    """Kill what runs in the hosts, delete them (their veth ends go with them) and the
    bridge; what was never made is skipped."""
    problems = []
    for host in net.hosts:
        if _ip("netns", "pids", host.namespace, check=False).returncode == 0:
            try:
                host.kill_all()
            except AssertionError as exc:
                problems.append(str(exc))
            _ip("netns", "del", host.namespace, check=False)
    _ip("link", "del", net.bridge, check=False)
    left = [h.namespace for h in net.hosts if h.namespace in _ip("netns", "list").stdout.split()]
    if left or problems:
        raise RuntimeError(f"network namespaces not cleaned up: {left} {problems}")
