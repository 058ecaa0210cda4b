"""Runtime parameters: the settings ``set-parameter`` changes on a running node.

A change is validated, applied to the live gate, then saved as a system record
(``param:<name>``) so it outlives a restart; ``None`` puts the configured
value back and forgets the record. Which gate a parameter acts on is not known
here: each gate offers its own table (``parameter_table()``, see
:mod:`tenantkv.admission.gate`) and the node merges them with
:func:`prefixed`. A runtime setting in no table is read where it is used, on
every use (the session's timeouts, the login limits, ...).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tenantkv import config as config_mod
from tenantkv import errors
from tenantkv.admission.gate import ParameterTable
from tenantkv.config import Config
from tenantkv.storage.engine import Engine
from tenantkv.storage.ops import PutSystemOp, WriteOp

log = logging.getLogger("tenantkv.server")

#: System records holding parameters changed with set_parameter.
PARAM_PREFIX = b"param:"


def prefixed(prefix: str, table: ParameterTable) -> ParameterTable:
    """A gate's table under the setting names the node gives its knobs
    (``bucket_queue_`` + ``concurrency``); knobs that are no runtime setting
    (a pool sized by probing, say) are left out."""
    return {prefix + knob: apply for knob, apply in table.items() if _runtime(prefix + knob)}


def _runtime(name: str) -> bool:
    try:
        return config_mod.setting(name).runtime
    except config_mod.ConfigError:
        return False


class RuntimeParameters:
    """The configuration in force: as started (``base``), plus saved changes."""

    def __init__(
        self,
        base: Config,
        engine: Engine,
        write: Callable[[WriteOp], Awaitable[Any]],
        on_change: Callable[[Config], None],
    ) -> None:
        #: the configuration as started (defaults < file < command line)
        self.base = base
        self._write = write
        self._engine = engine
        self._on_change = on_change
        #: names of the parameters saved by set_parameter (they override the file)
        self.saved: set[str] = set()
        self.config = self._with_saved(base, engine, self.saved)
        #: name -> how to apply it to a live object (filled in when the gates exist)
        self.table: ParameterTable = {}

    def bind(self, *tables: ParameterTable) -> None:
        """Add the live objects' tables (each name once: two gates never share one)."""
        for t in tables:
            assert not self.table.keys() & t.keys(), sorted(self.table.keys() & t.keys())
            self.table.update(t)

    @staticmethod
    def _with_saved(config: Config, engine: Engine, saved: set[str], quiet: bool = False) -> Config:
        """Apply parameters saved by set_parameter (they outlive a restart)."""
        for key, value in engine.system_items(PARAM_PREFIX):
            name = key.decode()
            try:
                if not config_mod.setting(name).runtime:
                    continue
                config = config.with_values({name: value}, source="a saved parameter")
            except config_mod.ConfigError as exc:
                log.warning("ignoring saved parameter %s=%r: %s", name, value, exc)
                continue
            saved.add(name)
            if not quiet:
                log.info("parameter %s=%r (set at runtime; overrides the config)", name, value)
        return config

    def rebase(self, base: Config) -> list[str]:
        """The config file was read again (SIGHUP): apply the runtime settings it
        changes, except those set_parameter overrides. Returns the names of
        changed settings that only a restart applies."""
        restart = [
            s.name
            for s in config_mod.SETTINGS
            if not s.runtime and getattr(self.base, s.name) != getattr(base, s.name)
        ]
        self.base = base
        self._apply_all(self._with_saved(base, self._engine, set(), quiet=True))
        return restart

    def reload(self, engine: Engine) -> None:
        """Another worker changed a parameter: apply what is saved now."""
        self.saved = set()
        self._apply_all(self._with_saved(self.base, engine, self.saved, quiet=True))

    def _apply_all(self, target: Config) -> None:
        for s in config_mod.SETTINGS:
            if not s.runtime:
                continue
            new = getattr(target, s.name)
            if getattr(self.config, s.name) == new:
                continue
            apply = self.table.get(s.name)
            try:
                if apply is not None:
                    apply(new)
            except (errors.TenantKVError, ValueError) as exc:
                log.warning("parameter %s=%r not applied: %s", s.name, new, exc)
                continue
            self.config = self.config.with_values({s.name: new})
            log.info("parameter %s=%r", s.name, new)
        self._on_change(self.config)

    def describe(self, name: str) -> dict[str, Any]:
        s = _setting(name)
        return {
            "name": name,
            "value": getattr(self.config, name),
            "default": s.default,
            "runtime": s.runtime,
            "help": s.help,
        }

    def describe_all(self) -> list[dict[str, Any]]:
        return [self.describe(s.name) for s in config_mod.SETTINGS]

    async def set(self, name: str, value: Any) -> tuple[Any, Any]:
        """Change a runtime parameter (None: back to the configured value); persists it.
        Returns (old, new)."""
        s = _setting(name)
        if not s.runtime:
            raise errors.BadValue(
                f"{name!r} cannot change at runtime; set it in the config file or on the "
                "command line and restart"
            )
        if value is None:
            new = getattr(self.base, name)
            await self._write(PutSystemOp(PARAM_PREFIX + name.encode(), None))
        else:
            try:
                new = config_mod.check(name, value)
            except config_mod.ConfigError as exc:
                raise errors.BadValue(str(exc)) from None
        old = getattr(self.config, name)
        # Apply first: a cross-check (probing min <= max) may still refuse it.
        apply = self.table.get(name)
        if apply is not None:
            apply(new)
        self.config = self.config.with_values({name: new})
        self._on_change(self.config)
        if value is not None:
            await self._write(PutSystemOp(PARAM_PREFIX + name.encode(), new))
            self.saved.add(name)
        else:
            self.saved.discard(name)
        return old, new


def _setting(name: Any) -> config_mod.Setting:
    if not isinstance(name, str):
        raise errors.BadValue("'name' must be a string")
    try:
        return config_mod.setting(name)
    except config_mod.ConfigError as exc:
        raise errors.BadValue(str(exc)) from None
