"""systemd's readiness protocol (``sd_notify``), without a dependency.

Under ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``, a unix datagram socket
(``@name`` for an abstract one); the service sends ``READY=1`` once it serves
and ``STOPPING=1`` when it begins to stop, so ``systemctl start`` returns when
clients can connect and dependent units start after that, not after the fork.
Without the variable (not under systemd) every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("tenantkv.server")


def notify(*fields: str) -> bool:
    """Send ``fields`` (``"READY=1"``, ...) to systemd; False when not under it.

    A failure is logged, never raised: readiness is advisory, serving is not.
    """
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall("\n".join(fields).encode())
    except OSError as exc:
        log.warning("could not notify systemd at %s: %s", path, exc)
        return False
    return True


def ready(status: str) -> bool:
    return notify("READY=1", f"MAINPID={os.getpid()}", f"STATUS={status}")


def stopping() -> bool:
    return notify("STOPPING=1", "STATUS=shutting down")
