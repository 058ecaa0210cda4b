"""Blocking and Trio clients over one sans-IO core and one retry policy.

- :mod:`.core` — request encoding, response matching, every command described once
- :mod:`.retry` — the overload retry policy and its per-operation state machine
- :mod:`.servers` — address lists, the home server, retry server selection
- :mod:`.monitoring` — command started / succeeded / failed events and listeners
- :mod:`.base` — settings both clients share; :mod:`.sync_client`, :mod:`.async_client`
  — the two thin I/O drivers
"""
