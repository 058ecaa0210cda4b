"""The floor: the least server our stack can be, to measure tenantkv against.

Same wire format as tenantkv (MessagePack-RPC, ``hello`` first, ``get`` and
``set`` with the same parameters and replies), same stack (Trio, msgpack,
LMDB with ``sync=True``), one task per connection, one read transaction per
received chunk, and group commit for SETs: one writer thread commits whatever
is queued and acknowledges each write after its batch is durable. No gates, no
limits, no metrics, no users: what is left is what the stack costs, so
tenantkv's CPU per operation over the floor's is what our own code costs.

    python -m bench.floor serve --data-dir DIR --port 0 --ready-file PATH

(the arguments of ``tenantkv serve`` that bench/servers.py passes, so one
launcher starts either).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import threading
from typing import Any

import lmdb
import msgpack
import trio


class Chunk:
    """The SETs of one received chunk: its replies go out once all are durable."""

    def __init__(self) -> None:
        self.pending, self.done = 0, trio.Event()


class Writer(threading.Thread):
    """Group commit: one thread, one transaction (one fsync) per batch of queued writes."""

    def __init__(self, env: lmdb.Environment, token: trio.lowlevel.TrioToken) -> None:
        super().__init__(daemon=True)
        self.env, self.token, self.q = env, token, queue.SimpleQueue[Any]()

    def run(self) -> None:
        while True:
            batch = [self.q.get()]
            while not self.q.empty():
                batch.append(self.q.get())
            with self.env.begin(write=True) as txn:
                for key, value, _ in batch:
                    txn.put(key, value)
            self.token.run_sync_soon(_ack, batch)


def _ack(batch: list[Any]) -> None:
    for _, _, chunk in batch:
        chunk.pending -= 1
        if not chunk.pending:
            chunk.done.set()


async def connection(stream: trio.SocketStream, env: lmdb.Environment, writer: Writer) -> None:
    """One task: read a chunk, answer its GETs from one read transaction, queue its
    SETs, wait until they are durable, send every reply of the chunk at once."""
    unpacker = msgpack.Unpacker(raw=False)
    pack = msgpack.Packer(use_bin_type=True).pack
    try:
        while data := await stream.receive_some(256 * 1024):
            unpacker.feed(data)
            replies, chunk = [], Chunk()
            with env.begin() as txn:
                for _, msgid, method, params in unpacker:
                    if method == "get":
                        value = txn.get(params["key"])
                        result = None if value is None else {"value": value, "cas": 1}
                    elif method == "set":
                        chunk.pending += 1
                        writer.q.put((params["key"], params["value"], chunk))
                        result = {"cas": 1}
                    else:  # hello and anything else
                        result = {"server": "floor"}
                    replies.append(pack([1, msgid, None, result]))
            if chunk.pending:
                await chunk.done.wait()
            await stream.send_all(b"".join(replies))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def serve(args: argparse.Namespace) -> None:
    env = lmdb.open(args.data_dir, map_size=1 << 32, sync=True)
    writer = Writer(env, trio.lowlevel.current_trio_token())
    writer.start()
    listeners = await trio.open_tcp_listeners(args.port, host=args.host)
    port = listeners[0].socket.getsockname()[1]
    ready = {"host": args.host, "port": port, "metrics_port": None, "pid": os.getpid()}
    await trio.Path(args.ready_file + ".tmp").write_text(json.dumps(ready))
    os.replace(args.ready_file + ".tmp", args.ready_file)
    await trio.serve_listeners(lambda s: connection(s, env, writer), listeners)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    p.add_argument("command", choices=("serve",))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready-file", required=True)
    args = p.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    trio.run(serve, args)


if __name__ == "__main__":
    main()
