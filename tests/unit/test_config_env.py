"""Settings from the environment, ``tenantkv config defaults``, and precedence:
command line > environment > config file > defaults."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tenantkv import config
from tenantkv.server import cli

REPO = Path(__file__).resolve().parents[2]


def test_precedence_cli_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('port = 9000\nlog_level = "warning"\nhost = "10.0.0.1"\n')
    env = {"TENANTKV_PORT": "9100", "TENANTKV_LOG_LEVEL": "error", "TENANTKV_MAX_BUCKETS": "7"}
    cfg = config.load(f, {"port": 9200, "log_level": None}, environ=env)
    assert cfg.port == 9200  # command line
    assert cfg.log_level == "error"  # environment over file (no flag given)
    assert cfg.max_buckets == 7  # environment over default
    assert cfg.host == "10.0.0.1"  # file over default
    assert cfg.durability == "fsync"  # default
    # Without environ (library callers), the environment is not read.
    assert config.load(f).port == 9000


@pytest.mark.parametrize(
    "name, text, value",
    [
        ("port", " 7300 ", 7300),
        ("hello_timeout_secs", "2.5", 2.5),
        ("hello_timeout_secs", "3", 3.0),
        ("ingress_request_rate_limiter_enabled", "true", True),
        ("ingress_request_rate_limiter_enabled", "TRUE", True),
        ("ingress_request_rate_limiter_enabled", "1", True),
        ("ingress_request_rate_limiter_enabled", "false", False),
        ("ingress_request_rate_limiter_enabled", "0", False),
        ("data_dir", "/var/lib/x y", "/var/lib/x y"),
        ("ingress_request_rate_limiter_exemptions", "", ""),
        ("metrics_port", "", None),  # empty unsets an optional setting
        ("metrics_port", "9207", 9207),
        ("tls_cert_file", "", None),
    ],
)
def test_env_values_are_parsed_per_type(name: str, text: str, value: object) -> None:
    var = config.setting(name).env_var
    assert var == "TENANTKV_" + name.upper()
    got = config.env_values({var: text})[name]
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    "var, text, message",
    [
        ("TENANTKV_PORT", "abc", "TENANTKV_PORT.*'port' must be an integer, got 'abc'"),
        ("TENANTKV_PORT", "70000", "'port' in environment variable TENANTKV_PORT must be <= 65535"),
        ("TENANTKV_PORT", "", "TENANTKV_PORT.*integer"),
        ("TENANTKV_HELLO_TIMEOUT_SECS", "nan", "TENANTKV_HELLO_TIMEOUT_SECS.*a number"),
        ("TENANTKV_ENABLE_TEST_COMMANDS", "yes", "TENANTKV_ENABLE_TEST_COMMANDS.*true, false"),
        ("TENANTKV_LOG_FORMAT", "xml", "TENANTKV_LOG_FORMAT must be one of text, json"),
    ],
)
def test_a_bad_env_value_names_the_variable(var: str, text: str, message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        config.load(None, environ={var: text})


def test_other_tenantkv_variables_are_not_settings() -> None:
    env = {
        "TENANTKV_ADMIN_PASSWORD": "secret",
        "TENANTKV_PASSWORD": "secret",
        "TENANTKV_USER": "admin",
        "TENANTKV_NEW_USER_PASSWORD": "x",
    }
    assert config.env_values(env) == {}
    assert config.load(None, environ=env) == config.Config()


def test_cross_checks_see_env_values() -> None:
    env = {"TENANTKV_WRITE_PERMIT_MIN_CAPACITY": "100", "TENANTKV_WRITE_PERMIT_MAX_CAPACITY": "10"}
    with pytest.raises(config.ConfigError):
        config.load(None, environ=env)


def test_defaults_file_is_valid_and_complete(tmp_path: Path) -> None:
    text = config.render_defaults()
    f = tmp_path / "defaults.toml"
    f.write_text(text)
    assert config.load(f) == config.Config()  # `config check` runs exactly this
    data = tomllib.loads(text)
    for s in config.SETTINGS:
        if s.default is None:
            assert s.name not in data
            assert s.example is not None, f"optional {s.name} needs an example value"
            # commented out, and valid once uncommented
            line = next(x for x in text.splitlines() if x.startswith(f"# {s.name} = "))
            value = tomllib.loads(line[2:])[s.name]
            assert config.check(s.name, value) == value
        else:
            assert data[s.name] == s.default
        assert s.env_var in text
        assert s.help.split()[0] in text


def test_defaults_and_configuration_md_list_the_same_settings() -> None:
    doc = (REPO / "docs" / "configuration.md").read_text()
    in_doc = set(re.findall(r"^\| `([a-z0-9_]+)` \|", doc, re.M))
    in_defaults = set(re.findall(r"^(?:# )?([a-z0-9_]+) = ", config.render_defaults(), re.M))
    assert in_doc == in_defaults == {s.name for s in config.SETTINGS}


def test_config_defaults_then_check_as_commands(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "tenantkv.server.cli", "config"]
    out = subprocess.run([*run, "defaults"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    f = tmp_path / "tenantkv.toml"
    f.write_text(out.stdout)
    check = subprocess.run([*run, "check", str(f)], capture_output=True, text=True, timeout=30)
    assert (check.returncode, check.stdout) == (0, f"{f}: ok\n"), check.stderr


def test_serve_refuses_a_bad_env_value_naming_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tenantkv.server.cli", "serve", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "TENANTKV_MAX_CONNECTIONS": "many"},
    )
    assert proc.returncode == 2
    assert "TENANTKV_MAX_CONNECTIONS" in proc.stderr and "integer" in proc.stderr


def test_deploy_config_and_unit_are_valid() -> None:
    assert config.load(REPO / "deploy" / "tenantkv.toml").log_format == "json"
    unit = (REPO / "deploy" / "tenantkv.service").read_text()
    exec_start = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    assert argv[0].endswith("/tenantkv") and argv[1] == "serve"
    args = cli.build_parser().parse_args(argv[1:])  # the flags exist
    assert args.config == "/etc/tenantkv/tenantkv.toml"
    assert "TimeoutStopSec=" in unit and "KillSignal=SIGTERM" in unit
