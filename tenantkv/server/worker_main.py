"""Entry point of a worker process: ``python -m tenantkv.server.worker_main FD WRITE_FD``
(its control channel and its write link).

Started by the supervisor of ``serve --workers N``, never by hand; see
:mod:`tenantkv.server.worker` for what a worker is.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
from collections.abc import Sequence

import trio

from tenantkv.config import Config
from tenantkv.server import process_memory
from tenantkv.server.log_setup import configure_logging
from tenantkv.server.server import Server
from tenantkv.server.worker import WorkerLink, read_init


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or not all(a.isdigit() for a in args):
        print(
            "usage: python -m tenantkv.server.worker_main FD WRITE_FD (started by tenantkv serve)"
        )
        return 2
    sock = socket.socket(fileno=int(args[0]))
    writes = socket.socket(fileno=int(args[1]))
    init = read_init(sock)
    config = Config().with_values(init.config, source="the supervisor")
    configure_logging(config.log_level, config.log_format, worker=init.index)
    # A terminal hangup reaches the whole process group; the supervisor decides
    # what SIGHUP means (reload the config) and tells the workers.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    process_memory.return_large_allocations()
    link = WorkerLink(init, sock, writes)
    try:
        server = Server(config, role=link)
    except Exception as exc:
        logging.getLogger("tenantkv").error("worker %d cannot start: %s", link.index, exc)
        return 1

    async def run() -> None:
        await server.serve(handle_signals=True, freeze_gc=True)

    trio.run(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
