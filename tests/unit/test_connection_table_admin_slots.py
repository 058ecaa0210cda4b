"""The connection table keeps slots per address for admins (sans-IO): an address's
users idling on all its slots cannot lock out its admin."""

from __future__ import annotations

from tenantkv.admission.connection_table import ConnectionTable

LIMITS = {"max_connections": 100, "per_address": 3}


def test_an_address_full_of_idle_users_still_admits_its_admin() -> None:
    t = ConnectionTable()
    for c in range(3):
        assert t.admit(c, "10.0.0.1", 0.0, **LIMITS, reserved_per_address=2).ok
        assert (
            t.authenticated(
                c, admin=False, max_connections=100, reserved_for_admins=0, per_address=3
            )
            is None
        )
    # Two more connections from the address are admitted: who they are is known at hello.
    assert t.admit(3, "10.0.0.1", 0.0, **LIMITS, reserved_per_address=2).ok
    assert t.admit(4, "10.0.0.1", 0.0, **LIMITS, reserved_per_address=2).ok
    refused = t.authenticated(
        3, admin=False, max_connections=100, reserved_for_admins=0, per_address=3
    )
    assert refused is not None and "admin_reserved_connections_per_address" in refused
    assert (
        t.authenticated(4, admin=True, max_connections=100, reserved_for_admins=0, per_address=3)
        is None
    )
    assert t.statistics().refused_reserved_for_admins_per_address == 1
    # A user's slot freed is a user's again; other addresses are not affected.
    t.closed(0)
    assert t.admit(5, "10.0.0.1", 0.0, **LIMITS, reserved_per_address=2).ok
    assert (
        t.authenticated(5, admin=False, max_connections=100, reserved_for_admins=0, per_address=3)
        is None
    )
    assert t.admit(6, "10.0.0.2", 0.0, **LIMITS, reserved_per_address=2).ok


def test_without_reserved_slots_the_address_cap_is_as_before() -> None:
    t = ConnectionTable()
    for c in range(3):
        assert t.admit(c, "10.0.0.1", 0.0, **LIMITS).ok
    assert not t.admit(3, "10.0.0.1", 0.0, **LIMITS).ok
