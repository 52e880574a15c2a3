"""A free loopback TCP port, for the servers and rendezvous a run or a test starts on this machine."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on at ``host`` now (the kernel's pick for port 0, as Prefect's ``find_available_port``
    does). Another process may take it before the caller binds it: a server started on it fails loudly then."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
