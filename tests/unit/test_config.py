"""Config loading: precedence, unknown keys, bad values; docs derived from one declaration."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from tenantkv import config


def test_defaults_without_a_file() -> None:
    cfg = config.load(None)
    assert (cfg.port, cfg.host, cfg.data_dir) == (
        config.DEFAULT_PORT,
        "127.0.0.1",
        "./tenantkv-data",
    )


def test_file_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('port = 9000\ndurability = "nosync"\n[server]\nhost = "0.0.0.0"\n')
    cfg = config.load(f, {"port": 9100, "host": None})
    assert (cfg.port, cfg.durability, cfg.host) == (9100, "nosync", "0.0.0.0")


@pytest.mark.parametrize(
    "body, message",
    [
        ("prot = 1", "unknown setting 'prot'"),
        ('port = "x"', "'port'.*int"),
        ("port = 70000", "'port'.*<= 65535"),
        ('durability = "sometimes"', "'durability'.*fsync, nosync"),
        ("idle_timeout_secs = true", "'idle_timeout_secs'"),
        ("port = ", "not valid TOML"),
    ],
)
def test_bad_files_name_the_setting(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(body)
    with pytest.raises(config.ConfigError, match=message):
        config.load(f)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="cannot read"):
        config.load(tmp_path / "nope.toml")


def test_configuration_doc_is_generated_from_the_declaration() -> None:
    doc = Path(__file__).parents[2] / "docs" / "configuration.md"
    assert doc.read_text() == config.render_markdown(), (
        "run: tenantkv config docs > docs/configuration.md"
    )


def test_serve_help_names_each_default_once() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "tenantkv.server.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "(default: None)" not in out
    for default in ("./tenantkv-data", "127.0.0.1", "7207"):
        assert out.count(default) == 1, default


def test_every_setting_is_declared_once_and_whole() -> None:
    """Config's fields are the declaration: each has help, its default passes its
    own checks, and SETTINGS follows them one for one."""
    assert [s.name for s in config.SETTINGS] == [f.name for f in fields(config.Config)]
    for s in config.SETTINGS:
        assert s.help.strip(), s.name
        assert config.check(s.name, s.default) == s.default, s.name
        assert getattr(config.Config(), s.name) == s.default
        assert s.optional or s.default is not None, s.name
