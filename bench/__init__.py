"""tenantkv benchmarks: ``python -m bench SUBCOMMAND`` (see docs/benchmarking.md).

- :mod:`bench.loadgen` — the protocol-agnostic load loop, run in worker processes,
  and one codec per wire protocol (tenantkv MessagePack-RPC, Redis RESP).
- :mod:`bench.servers` — start and stop a tenantkv daemon or a redis-server.
- :mod:`bench.report` — percentiles, the printed table, ratios, JSON.
- :mod:`bench.throughput` — the ``throughput`` scenario.
- :mod:`bench.throttle` — the ``throttle`` scenarios (tenant throttle accuracy and cost).
"""
