"""Which address an export server binds and advertises.

By default the server binds the node's own address (what the role passes in, e.g. Ray's node IP,
else the address of the interface that routes outward), never every interface; a wildcard
(``0.0.0.0`` or ``::``) is bound only when configured, and then the node address is advertised.
"""

from __future__ import annotations

import ipaddress
import socket

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})

# Never contacted: connecting a UDP socket only selects the outward interface.
_ROUTE_PROBE = ("10.255.255.255", 1)


def node_address() -> str:
    """This node's outward IP address; ``127.0.0.1`` when no route exists."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(_ROUTE_PROBE)
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def is_wildcard(host: str) -> bool:
    """True for the any-interface addresses."""
    return host in WILDCARD_HOSTS


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ::1)."""
    bare = host.strip("[]")
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def host_port(host: str, port: int) -> str:
    """``host:port``, bracketing IPv6 literals (``[::1]:50051``)."""
    bare = host.strip("[]")
    try:
        if ipaddress.ip_address(bare).version == 6:
            return f"[{bare}]:{port}"
    except ValueError:
        pass  # a host name, not a literal
    return f"{host}:{port}"
