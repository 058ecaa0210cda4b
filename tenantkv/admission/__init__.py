"""Admission control: one module per gate on the request path (DESIGN.md §2).

Each gate is a plain object with an injected clock and no I/O, plus a thin Trio
adapter that does the waiting, so its decisions are unit-testable without a socket.
"""
