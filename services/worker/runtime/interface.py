"""Which network interface gloo (and TensorPipe, for PS jobs) binds to: the one that
reaches rank 0's rendezvous.

Without GLOO_SOCKET_IFNAME, gloo binds to the address this machine's hostname resolves
to, and falls back to loopback when that address is not local. Many hosts resolve their
own name to 127.0.0.1 (Debian's /etc/hosts, containers, network namespaces), so every
rank would then announce 127.0.0.1 to its peers, and a job across hosts would hang at
its first collective. The interface whose address routes to the rendezvous host is the
one peers can reach (they reach that host too). A user's GLOO_SOCKET_IFNAME wins.
TensorPipe's uv transport (torch.distributed.rpc) guesses its address the same way and
reads TP_SOCKET_IFNAME.
Linux only (SIOCGIFADDR); IPv4 rendezvous addresses.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import MutableMapping

SIOCGIFADDR = 0x8915
GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
TENSORPIPE_IFNAME = "TP_SOCKET_IFNAME"


def interface_addresses() -> dict[str, str]:
    """Interface name -> its (first) IPv4 address, for every interface that has one."""
    out: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it
                continue
            out[name] = socket.inet_ntoa(reply[20:24])
    return out


def route_source(host: str) -> str:
    """The local address this machine sends from to reach `host` (no packet is sent: a
    UDP connect only picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        address: str = probe.getsockname()[0]
        return address


def interface_toward(master_addr: str) -> str | None:
    """The interface to bind to for a rendezvous at `master_addr` (HOST:PORT);
    None when the route is loopback (one machine: gloo's default works) or the host is
    not an IPv4 address this machine can route to."""
    host = master_addr.rpartition(":")[0].strip("[]")
    try:
        source = route_source(socket.gethostbyname(host))
    except OSError:
        return None
    if ipaddress.ip_address(source).is_loopback:
        return None
    return next((name for name, addr in interface_addresses().items() if addr == source), None)


def set_interface(
    master_addr: str, variable: str = GLOO_IFNAME, env: MutableMapping[str, str] = os.environ
) -> str:
    """Set `variable` (GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME) for this process unless set
    already; returns the interface the library will use ("" for its default)."""
    if env.get(variable):
        return env[variable]
    name = interface_toward(master_addr)
    if name is not None:
        env[variable] = name
    return name or ""
