"""``tenantkv-admin``: manage buckets, users and throttling of a tenantkv server.

    tenantkv-admin [--host H] [--port N] [--user U] [--password P] [--json] SUBCOMMAND ...
    tenantkv-admin SUBCOMMAND ... [--host H] [--port N] [--user U] [--password P] [--json]

Exit status: 0 on success, 1 when the server or the connection reports an
error (one line on stderr, ``tenantkv-admin: CodeName: message``), 2 on a
usage error. ``main(argv)`` returns that status, so tests and scripts can call
it in-process; ``python -m admin.cli`` runs it as a program.

How a run goes: parse the command line (argparse checks every value it can
without a server) → find the admin password → ask what the subcommand must ask
(a new user's password) → connect → run one or two commands → print a table,
or the raw result as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tenantkv
from tenantkv import errors
from tenantkv.protocol import DEFAULT_PORT

from . import format as fmt
from .cluster_totals import cluster_totals, totals_text

PROG = "tenantkv-admin"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_USER = "admin"
DEFAULT_TIMEOUT = 30.0
ROLES = ("read", "readwrite")
UNLIMITED = "unlimited"

ENV_HOST = "TENANTKV_HOST"
ENV_PORT = "TENANTKV_PORT"
ENV_USER = "TENANTKV_USER"
ENV_PASSWORD = "TENANTKV_PASSWORD"
ENV_NEW_USER_PASSWORD = "TENANTKV_NEW_USER_PASSWORD"


class UsageError(Exception):
    """The command line cannot run as given (exit 2). ``parser`` prints the usage,
    unless ``usage`` is false (the flags were right; an answer at a prompt was not)."""

    def __init__(
        self, message: str, parser: argparse.ArgumentParser | None = None, *, usage: bool = True
    ) -> None:
        super().__init__(message)
        self.parser = parser
        self.usage = usage


class Aborted(Exception):
    """The operator answered no (exit 1)."""


@dataclass(frozen=True, slots=True)
class Output:
    """What a subcommand produced: the server's raw result (printed by ``--json``)
    and the text a person reads."""

    result: Any
    text: str
    #: the subcommand already printed everything (top, watch)
    printed: bool = False


# -- argument types (argparse turns their errors into exit 2) --------------------------


def port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1-65535, got {port}")
    return port


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def limit(text: str) -> int | str:
    """A unit limit: a non-negative integer or the word ``unlimited``."""
    if text == UNLIMITED:
        return UNLIMITED
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"must be a non-negative integer or {UNLIMITED!r}, got {text!r}"
        )
    return value


def role(text: str) -> tuple[str, str]:
    """``BUCKET=read`` or ``BUCKET=readwrite``."""
    bucket, sep, r = text.partition("=")
    if not sep or not bucket or r not in ROLES:
        raise argparse.ArgumentTypeError(f"expected BUCKET=read or BUCKET=readwrite, got {text!r}")
    return bucket, r


def json_object(text: str) -> str:
    """A JSON object, passed on to the server as the text given."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object {{...}}, got {text!r}")
    return text


class _MisplacedPassword(argparse.Action):
    """``user-create NAME --password X``: say which flag the user meant."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        parser.error(
            "--password is the password of the admin running this command and goes before "
            "the subcommand; give the new user's password with --user-password, "
            f"${ENV_NEW_USER_PASSWORD} or at the prompt"
        )


# -- terminal interaction --------------------------------------------------------------


def stdin_is_tty() -> bool:
    return sys.stdin is not None and sys.stdin.isatty()


def ask(question: str) -> str:
    """One line from the terminal; the question goes to stderr so stdout stays clean."""
    print(question, end="", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    if not line:
        raise Aborted("no answer (end of input)")
    return line.strip()


def prompt_password(prompt: str) -> str:
    try:
        return getpass.getpass(prompt)
    except EOFError:
        raise UsageError("no password entered", usage=False) from None


# -- subcommands -----------------------------------------------------------------------
#
# Each subcommand is declared once: its help, its arguments, an optional
# ``prepare`` (checks and questions before connecting) and ``run``, which talks
# to the server and returns an Output.

Run = Callable[[tenantkv.Client, argparse.Namespace], Output]
Prepare = Callable[[argparse.Namespace, argparse.ArgumentParser], None]


@dataclass(frozen=True, slots=True)
class Subcommand:
    name: str
    help: str
    description: str
    examples: tuple[str, ...]
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Run
    prepare: Prepare | None = None
    #: how long to wait for the server unless --timeout says (default DEFAULT_TIMEOUT)
    timeout: float | None = None
    #: the global --password may follow the subcommand (user-create and user-update
    #: take the new user's password there, and say so: _misplaced_password_arg)
    password_after: bool = True


def _no_arguments(p: argparse.ArgumentParser) -> None:
    pass


def _bucket_arg(p: argparse.ArgumentParser, help: str = "bucket name") -> None:
    p.add_argument("bucket", metavar="BUCKET", help=help)


# bucket-create


def _bucket_create_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="bucket name: 1-100 of letters, digits, _ . -")
    p.add_argument(
        "--reserved",
        type=limit,
        metavar="N|unlimited",
        help="throttle units per second reserved for this bucket (default: the server's)",
    )
    p.add_argument(
        "--hard-limit",
        type=limit,
        metavar="N|unlimited",
        help="most throttle units per second this bucket may use (default: the server's)",
    )


def _bucket_create(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    params: dict[str, Any] = {"name": a.name}
    if a.reserved is not None:
        params["reserved"] = a.reserved
    if a.hard_limit is not None:
        params["hard_limit"] = a.hard_limit
    result = c.command("create_bucket", **params)
    limits = ", ".join(f"{k}={v}" for k, v in params.items() if k != "name")
    text = f"created bucket {fmt.cell(a.name)!r}" + (f" ({limits})" if limits else "")
    return Output(result, text)


# bucket-list


def _bucket_list(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    buckets = c.list_buckets()
    if not buckets:
        return Output(buckets, "(no buckets)")
    rows = [[b.get("name"), b.get("entries")] for b in buckets]
    return Output(buckets, fmt.table(["name", "entries"], rows))


# bucket-delete


def _bucket_delete_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="bucket to delete")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")


def _bucket_delete_prepare(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    if not a.yes and not stdin_is_tty():
        raise UsageError(
            f"bucket-delete drops bucket {a.name!r} and all its data; stdin is not a "
            "terminal to confirm on, so pass --yes",
            p,
        )


def _bucket_delete(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    name = a.name
    if not a.yes:
        found = [b for b in c.list_buckets() if b.get("name") == name]
        if found:  # otherwise the delete below reports BucketNotFound
            entries = found[0].get("entries")
            what = (
                f"empty bucket {name!r}"
                if entries == 0
                else f"bucket {name!r} and all its {entries} entries"
            )
            answer = ask(f"Delete {what}? This cannot be undone. Type the bucket name to confirm: ")
            if answer != name:
                raise Aborted(f"bucket {name!r} not deleted")
    result = c.delete_bucket(name)
    return Output(result, f"deleted bucket {fmt.cell(name)!r}")


# user-create


def _user_create_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="user name: 1-128 of letters, digits, _ . - (no @)")
    p.add_argument(
        "--user-password",
        metavar="PW",
        help=f"the new user's password (visible to other local users in ps; prefer "
        f"${ENV_NEW_USER_PASSWORD} or the prompt)",
    )
    p.add_argument(
        "--role",
        dest="roles",
        type=role,
        action="append",
        default=[],
        metavar="BUCKET=read|readwrite",
        help="grant a role on a bucket; repeat for more buckets",
    )
    p.add_argument("--admin", action="store_true", help="make the user an admin (all buckets)")
    p.add_argument(
        "--unthrottled",
        action="store_true",
        help="the user's requests are charged throttle units but never delayed",
    )
    _misplaced_password_arg(p)


def _misplaced_password_arg(p: argparse.ArgumentParser) -> None:
    """A hidden ``--password`` after the subcommand, to say which flag was meant.
    default=SUPPRESS: a subparser default would overwrite the global --password."""
    p.add_argument(
        "--password",
        nargs="?",
        action=_MisplacedPassword,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )


def _roles(pairs: list[tuple[str, str]], p: argparse.ArgumentParser) -> dict[str, str]:
    """``--role B=R`` flags as a map; the same bucket given two roles is a usage error."""
    roles: dict[str, str] = {}
    for bucket, r in pairs:
        if roles.get(bucket, r) != r:
            raise UsageError(f"bucket {bucket!r} is given two roles", p)
        roles[bucket] = r
    return roles


def _user_create_prepare(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    a.roles = _roles(a.roles, p)
    if a.user_password is not None:
        password = a.user_password
    elif os.environ.get(ENV_NEW_USER_PASSWORD):
        password = os.environ[ENV_NEW_USER_PASSWORD]
    elif stdin_is_tty():
        password = prompt_password(f"Password for new user {a.name!r}: ")
        if prompt_password("Repeat it: ") != password:
            raise UsageError("the passwords do not match", p, usage=False)
    else:
        raise UsageError(
            f"no password for the new user: pass --user-password PW, set "
            f"${ENV_NEW_USER_PASSWORD}, or run on a terminal to be prompted",
            p,
        )
    if not password:
        raise UsageError("the new user's password is empty", p)
    a.new_password = password


def _user_create(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    result = c.create_user(
        a.name, a.new_password, roles=a.roles, admin=a.admin, unthrottled=a.unthrottled
    )
    u = result if isinstance(result, dict) else {}
    text = (
        f"created user {fmt.cell(a.name)!r} (admin: {fmt.cell(u.get('admin', a.admin))}, "
        f"unthrottled: {fmt.cell(u.get('unthrottled', a.unthrottled))}, "
        f"roles: {fmt.cell(u.get('roles', a.roles))})"
    )
    return Output(result, text)


# user-update


def _user_update_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="user to change")
    p.add_argument(
        "--role",
        dest="roles",
        type=role,
        action="append",
        default=None,
        metavar="BUCKET=read|readwrite",
        help="the user's roles become exactly these; repeat for more buckets",
    )
    p.add_argument("--no-roles", action="store_true", help="take every role away (with no --role)")
    for flag, yes, no in (
        ("admin", "make it an admin (all buckets)", "take its admin privilege away"),
        (
            "unthrottled",
            "its requests are charged throttle units but never delayed",
            "its requests are throttled like any user's: charged units, and delayed or "
            "refused at its bucket's limits",
        ),
    ):
        g = p.add_mutually_exclusive_group()
        g.add_argument(f"--{flag}", dest=flag, action="store_true", default=None, help=yes)
        g.add_argument(f"--no-{flag}", dest=flag, action="store_false", help=no)
    p.add_argument(
        "--user-password",
        metavar="PW",
        help=f"a new password for the user (prefer ${ENV_NEW_USER_PASSWORD})",
    )
    _misplaced_password_arg(p)


def _user_update_prepare(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    changes: dict[str, Any] = {}
    if a.roles is not None and a.no_roles:
        raise UsageError("give --role or --no-roles, not both", p)
    if a.roles is not None:
        changes["roles"] = _roles(a.roles, p)
    elif a.no_roles:
        changes["roles"] = {}
    for flag in ("admin", "unthrottled"):
        if getattr(a, flag) is not None:
            changes[flag] = getattr(a, flag)
    password = a.user_password or os.environ.get(ENV_NEW_USER_PASSWORD)
    if password is not None:
        if not password:
            raise UsageError("the new password is empty", p)
        changes["password"] = password
    if not changes:
        raise UsageError(
            "nothing to change: give --role/--no-roles, --admin/--no-admin, "
            "--unthrottled/--no-unthrottled or a new password",
            p,
        )
    a.changes = changes


def _user_update(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    u = c.command("update_user", name=a.name, **a.changes)
    text = (
        f"updated user {fmt.cell(a.name)!r} (admin: {fmt.cell(u.get('admin'))}, "
        f"unthrottled: {fmt.cell(u.get('unthrottled'))}, roles: {fmt.cell(u.get('roles'))})"
    )
    return Output(u, text)


# user-list / user-delete


def _user_list(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    users = c.list_users()
    rows = [[u.get("name"), u.get("admin"), u.get("unthrottled"), u.get("roles")] for u in users]
    text = fmt.table(["name", "admin", "unthrottled", "roles"], rows) if users else "(no users)"
    return Output(users, text)


def _user_delete_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="user to delete")


def _user_delete(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    return Output(c.delete_user(a.name), f"deleted user {fmt.cell(a.name)!r}")


# status / ping


def _status(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    doc = c.server_status()
    return Output(doc, fmt.status_text(doc))


def _cluster_status(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    status = c.server_status()
    doc = status.get("cluster")
    if doc is None:
        raise errors.ClientError(
            f"{c.host}:{c.port} is not in a cluster (it was started without --cluster)"
        )
    if not doc.get("joined"):
        return Output(doc, _cluster_text(doc))
    doc = {**doc, "totals": cluster_totals(c, status, doc)}  # each node's status, and summed
    return Output(doc, _cluster_text(doc) + "\n\n" + totals_text(doc["totals"]))


def _cluster_text(doc: dict[str, Any]) -> str:
    """The cluster as this node sees it: who it is, then a row per node of the map."""
    if not doc.get("joined"):
        return f"node {fmt.cell(doc.get('node'))}: not joined yet (etcd unreachable?)"
    m = doc["map"]
    lease = doc["lease"]
    head = (
        f"node {fmt.cell(doc['node'])} ({'coordinator' if doc['coordinator'] else 'member'}, "
        f"lease {'valid' if lease['valid'] else 'LOST'}), etcd {','.join(doc['etcd'])}\n"
        f"map version {m['version']}: {m['slots_assigned']} of 16384 slots assigned"
    )
    rows = [
        [
            name,
            n["address"],
            n["resp_address"] or "-",
            "up" if n["up"] else "DOWN",
            n["slots"],
            " ".join(f"{s}-{e}" if s != e else f"{s}" for s, e in n["ranges"]) or "-",
        ]
        for name, n in m["nodes"].items()
    ]
    head += _rebalance_text(m.get("rebalance"))
    if not rows:
        return head
    return head + "\n" + fmt.table(["node", "address", "resp", "state", "slots", "ranges"], rows)


def _rebalance_text(progress: dict[str, Any] | None) -> str:
    """The rebalance in progress as a line with a progress bar ("" when none runs)."""
    if not progress:
        return ""
    moved, total = progress["moved"], max(progress["total"], 1)
    width = 30
    done = min(width, width * moved // total)
    bar = "#" * done + "." * (width - done)
    moving = progress.get("moving") or []
    now = ", ".join(f"slots {s}-{e} {src}->{dst} ({phase})" for s, e, src, dst, phase in moving)
    drain = progress.get("drain") or []
    line = f"\nrebalance [{bar}] {moved}/{progress['total']} slots moved"
    if drain:
        line += f", removing {', '.join(drain)}"
    return line + (f"; moving {now}" if now else "")


def _rebalance_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batch-slots",
        type=int,
        default=0,
        metavar="N",
        help="slots moved together (default 256): more is faster, each batch's write "
        "pause grows with the keys written during its last catch-up",
    )


def _rebalance(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    progress = c.command("cluster_rebalance", batch_slots=a.batch_slots)
    if not progress.get("total"):
        return Output(progress, "the slots are even over the nodes that are up: nothing to move")
    return Output(progress, "rebalance started:" + _rebalance_text(progress))


def _node_remove_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="the node to take out of the cluster")
    _rebalance_args(p)


def _node_remove(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    progress = c.command("cluster_node_remove", name=a.name, batch_slots=a.batch_slots)
    return Output(
        progress,
        f"removing node {fmt.cell(a.name)!r}: its slots move to the other nodes, then it "
        "leaves the map (follow it with cluster-status)" + _rebalance_text(progress),
    )


def _ping(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    start = time.perf_counter()
    result = c.ping()
    ms = (time.perf_counter() - start) * 1000
    version = c.server_info.get("version", "?")
    return Output(
        result,
        f"{fmt.cell(result)} from {c.host}:{c.port} (tenantkv {fmt.cell(version)}) in {ms:.2f} ms",
    )


# throttle properties


def _map_text(result: Any, done: str) -> str:
    """A returned map as key/value pairs; anything else (true, nil) as ``done``."""
    if isinstance(result, str | bytes):
        try:
            result = json.loads(result)
        except ValueError:
            return fmt.cell(result)
    if isinstance(result, dict):
        return fmt.kv_table(result)
    return done


def _json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "body", metavar="JSON", type=json_object, help="the properties as one JSON object"
    )


def _bucket_json_args(p: argparse.ArgumentParser) -> None:
    _bucket_arg(p)
    _json_arg(p)


def _set_node_throttle(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    result = c.command("SetNodeThrottleProperties", json=a.body)
    _warn_about_capacity(c, result)
    return Output(result, _map_text(result, "node throttle properties set"))


def _warn_about_capacity(c: tenantkv.Client, props: Any) -> None:
    """Say so (on stderr) when the capacity set throttles everything or cannot hold
    the reservations: both are accepted, and both are rarely what was meant."""
    capacity = props.get("capacity") if isinstance(props, dict) else None
    if not isinstance(capacity, int):
        return  # "unlimited"
    buckets = c.server_status().get("throttle", {}).get("buckets", {})
    reserved = sum(b["reserved"] for b in buckets.values() if isinstance(b.get("reserved"), int))
    if capacity == 0:
        print(f"{PROG}: warning: capacity 0 throttles every bucket completely", file=sys.stderr)
    elif reserved > capacity:
        print(
            f"{PROG}: warning: capacity {capacity} is below the buckets' reservations "
            f"({reserved}): every reservation is scaled by {capacity / reserved:.3f} "
            "(status: throttle.node.reservation_scale, each bucket's effective_reserved)",
            file=sys.stderr,
        )


def _get_node_throttle(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    result = c.command("GetNodeThrottleProperties")
    return Output(result, _map_text(result, fmt.cell(result)))


def _set_bucket_throttle(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    result = c.command("SetBucketThrottleProperties", bucket=a.bucket, json=a.body)
    return Output(result, _map_text(result, f"throttle properties of {a.bucket!r} set"))


def _get_bucket_throttle(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    result = c.command("GetBucketThrottleProperties", bucket=a.bucket)
    return Output(result, _map_text(result, fmt.cell(result)))


# server parameters


def _param_set_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="parameter (see param-get)")
    p.add_argument(
        "value",
        metavar="VALUE",
        nargs="?",
        help='new value; JSON if it parses (5, 0.5, true, "text"), else taken as text',
    )
    p.add_argument("--reset", action="store_true", help="go back to the configured value")


def _param_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _param_set_check(a: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if a.reset == (a.value is not None):
        raise UsageError("param-set needs either VALUE or --reset", parser)


def _param_set(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    value = None if a.reset else _param_value(a.value)
    result = c.command("set_parameter", name=a.name, value=value)
    text = f"{a.name}: {fmt.cell(result.get('old'))} -> {fmt.cell(result.get('new'))}"
    return Output(result, text)


def _param_get_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", nargs="?", help="one parameter (default: all)")


def _param_get(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    if a.name is None:
        params = c.command("get_parameter")
        rows = [
            [p["name"], p["value"], p["default"], "yes" if p["runtime"] else ""] for p in params
        ]
        return Output(params, fmt.table(["name", "value", "default", "runtime"], rows))
    result = c.command("get_parameter", name=a.name)
    return Output(result, fmt.kv_table(result))


# watch / bucket queues


def _watch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bucket", metavar="BUCKET", help="only this bucket's events")
    p.add_argument(
        "--count", type=int, metavar="N", help="stop after N events (default: until Ctrl-C)"
    )


def _watch(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    seen = 0
    params: dict[str, Any] = {"wait_ms": 1000}
    if a.bucket:
        params["bucket"] = a.bucket
    if not a.json:
        print(
            f"{'time':>12}  {'event':<17} {'bucket':<16} {'class':<5} {'operation':<10} "
            f"{'key':>4} {'running':>7} {'queued':>6}  outcome",
            flush=True,
        )
    try:
        while a.count is None or seen < a.count:
            for ev in c.command("watch_events", **params)["events"]:
                seen += 1
                if a.json:
                    print(fmt.dumps(ev).replace("\n", " "), flush=True)
                else:
                    print(
                        f"{ev['time']:>12.3f}  {ev['event']:<17} {ev['bucket']:<16} "
                        f"{ev['class']:<5} {ev['operation']:<10} {ev['key_len']:>4} "
                        f"{ev['running']:>7} {ev['queued']:>6}  {ev['outcome']}",
                        flush=True,
                    )
                if a.count is not None and seen >= a.count:
                    break
    except KeyboardInterrupt:
        pass
    a.json = False  # events were printed as they came
    return Output(seen, f"{seen} events")


# top / backup


def _top_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--interval",
        type=seconds,
        default=1.0,
        metavar="SECS",
        help="seconds between refreshes (default 1)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="print one view (two samples --interval apart) and exit; with --json, for scripts",
    )
    p.add_argument("--count", "-n", type=int, metavar="N", help="stop after N views")


def _top(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    from . import top as top_mod  # (its metrics module is only `top`'s)

    shown = top_mod.run(
        c.server_status,
        interval=a.interval,
        once=a.once,
        as_json=a.json,
        count=a.count,
        stdin=sys.stdin,
    )
    return Output(shown, "", printed=True)


def _backup_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        metavar="PATH",
        help="absolute directory on the server's machine: new, or empty",
    )


def _backup(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    result = c.command("backup", path=a.path)
    text = (
        f"backup written to {fmt.cell(result.get('path'))}: "
        f"{fmt.human_bytes(int(result.get('bytes', 0)))} in {result.get('duration_secs')} s"
    )
    return Output(result, text)


def _queue_limit(text: str) -> int | None:
    if text == "default":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer or 'default'") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _queue_set_args(p: argparse.ArgumentParser) -> None:
    _bucket_arg(p)
    p.add_argument("cls", metavar="CLASS", choices=("read", "write"), help="read or write")
    # SUPPRESS: a flag left out is absent, so "default" (None) and "unchanged" differ.
    p.add_argument(
        "--concurrency", type=_queue_limit, metavar="N|default", default=argparse.SUPPRESS
    )
    p.add_argument("--tolerance", type=_queue_limit, metavar="N|default", default=argparse.SUPPRESS)


def _queue_set(c: tenantkv.Client, a: argparse.Namespace) -> Output:
    params: dict[str, Any] = {"bucket": a.bucket, "class": a.cls}
    if hasattr(a, "concurrency"):
        params["concurrency"] = a.concurrency
    if hasattr(a, "tolerance"):
        params["queue_tolerance"] = a.tolerance
    result = c.command("set_bucket_queue", **params)
    return Output(result, fmt.kv_table(result))


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        "top",
        "live per-bucket view: units, ops, throttling, latency",
        "A live view of the server, refreshed every --interval seconds, like mongotop: per "
        "bucket, units/s against its reservation and hard limit, operations/s, throttled/s "
        "(made to wait by the tenant throttle), rejected/s (refused with an overload error "
        "by any gate), p99 latency in ms, requests waiting and connections; above it the "
        "node: connections, ops/s, write lag, commits/s and their p99, ticket pools. On a "
        "terminal, q quits. --once --json prints one view as JSON for scripts.",
        (
            "tenantkv-admin top",
            "tenantkv-admin top --interval 5",
            "tenantkv-admin top --once --json | jq '.buckets[] | {bucket, units_per_sec}'",
        ),
        _top_args,
        _top,
    ),
    Subcommand(
        "backup",
        "write a consistent, compacted copy of the data (online)",
        "Ask the server to write a consistent, compacted copy of its whole data directory "
        "(buckets, data, users, throttle properties, parameters) to PATH, a new or empty "
        "directory on the server's machine, while it goes on serving. Prints the size and "
        "how long it took. Restore with `tenantkv restore PATH --data-dir DIR` (server "
        "stopped). Waits up to --timeout (default one hour for backup).",
        (
            "tenantkv-admin backup /var/backups/tenantkv/$(date +%F)",
            "tenantkv-admin --json backup /srv/backup/tkv-1 | jq .bytes",
        ),
        _backup_args,
        _backup,
        timeout=3600.0,
    ),
    Subcommand(
        "watch",
        "follow bucket-queue events live",
        "Stream request_throttled / request_handled events of the bucket queues (time, "
        "bucket, class, operation, key length, slots in use, queued, outcome). Ctrl-C stops.",
        ("tenantkv-admin watch", "tenantkv-admin watch --bucket orders --count 100"),
        _watch_args,
        _watch,
    ),
    Subcommand(
        "bucket-queue-set",
        "set a bucket's own queue limits",
        "Set one bucket's running slots (--concurrency) and waiting room (--tolerance) for "
        "reads or writes; 'default' returns a value to the node's bucket_queue_* setting.",
        ("tenantkv-admin bucket-queue-set orders write --concurrency 16 --tolerance 256",),
        _queue_set_args,
        _queue_set,
    ),
    Subcommand(
        "bucket-create",
        "create a bucket",
        "Create an empty bucket. A bucket is one tenant: its own key space, roles and "
        "throttle limits. --reserved and --hard-limit set its throttle units per second "
        "(a non-negative integer or 'unlimited'); leave them out to use the server's "
        "defaults.",
        (
            "tenantkv-admin bucket-create orders",
            "tenantkv-admin bucket-create orders --reserved 1000 --hard-limit unlimited",
        ),
        _bucket_create_args,
        _bucket_create,
    ),
    Subcommand(
        "bucket-list",
        "list buckets with their entry counts",
        "List every bucket, sorted by name, with the number of entries it holds.",
        ("tenantkv-admin bucket-list", "tenantkv-admin --json bucket-list | jq -r '.[].name'"),
        _no_arguments,
        _bucket_list,
    ),
    Subcommand(
        "bucket-delete",
        "delete a bucket and all its data",
        "Delete a bucket and every record in it; connections using it lose their "
        "selection. This cannot be undone. On a terminal you are asked to type the "
        "bucket name; elsewhere (scripts, pipes) --yes is required.",
        ("tenantkv-admin bucket-delete orders", "tenantkv-admin bucket-delete orders --yes"),
        _bucket_delete_args,
        _bucket_delete,
        _bucket_delete_prepare,
    ),
    Subcommand(
        "user-create",
        "create a user",
        "Create a user with roles on buckets. The new user's password comes from "
        f"--user-password, else ${ENV_NEW_USER_PASSWORD}, else a prompt (asked twice) "
        "when stdin is a terminal. (--password, before the subcommand, is the password "
        "of the admin running this command.) A user who is not an admin must name one "
        "of its buckets when it connects.",
        (
            "tenantkv-admin user-create app --role orders=readwrite --role catalog=read",
            f"{ENV_NEW_USER_PASSWORD}=s3cret tenantkv-admin user-create reporter "
            "--role orders=read",
            "tenantkv-admin user-create ops --admin --unthrottled",
        ),
        _user_create_args,
        _user_create,
        _user_create_prepare,
        password_after=False,
    ),
    Subcommand(
        "user-list",
        "list users with their roles",
        "List every user, sorted by name: admin, unthrottled, and roles per bucket.",
        ("tenantkv-admin user-list", "tenantkv-admin --json user-list"),
        _no_arguments,
        _user_list,
    ),
    Subcommand(
        "user-update",
        "change a user's roles, privileges or password",
        "Change a user in place: --role (repeatable) replaces all its roles, --no-roles "
        "takes them away, --admin/--no-admin and --unthrottled/--no-unthrottled set the "
        f"flags, --user-password (or ${ENV_NEW_USER_PASSWORD}) sets a new password. "
        "What is not given stays. Its open connections see the change before their next "
        "command.",
        (
            "tenantkv-admin user-update app --role orders=read",
            "tenantkv-admin user-update ops --no-unthrottled",
            f"{ENV_NEW_USER_PASSWORD}=n3w tenantkv-admin user-update app",
        ),
        _user_update_args,
        _user_update,
        _user_update_prepare,
        password_after=False,
    ),
    Subcommand(
        "user-delete",
        "delete a user",
        "Delete a user. Its open connections close, and its requests that have not run "
        "yet fail; new logins fail. A user cannot delete itself.",
        ("tenantkv-admin user-delete app",),
        _user_delete_args,
        _user_delete,
    ),
    Subcommand(
        "status",
        "show the server's status document",
        "Show the server status: version and uptime, connections, storage and the "
        "group-commit writer, a row per bucket (entries, connections, operations and "
        "errors since start), and a section per admission gate. --json prints the whole "
        "document for scripts and monitoring.",
        ("tenantkv-admin status", "tenantkv-admin --json status | jq .connections.current"),
        _no_arguments,
        _status,
    ),
    Subcommand(
        "param-set",
        "change a server parameter at runtime",
        "Change a runtime server parameter (set_parameter). The change applies at once or "
        "to new connections, and persists across restarts; --reset returns to the value "
        "from the config file. Only parameters marked runtime in param-get can change.",
        (
            "tenantkv-admin param-set throttle_max_wait_ms 2000",
            "tenantkv-admin param-set idle_timeout_secs --reset",
        ),
        _param_set_args,
        _param_set,
        _param_set_check,
    ),
    Subcommand(
        "param-get",
        "show server parameters",
        "Show one server parameter, or all of them with their defaults and whether they "
        "can change at runtime (get_parameter).",
        ("tenantkv-admin param-get", "tenantkv-admin --json param-get log_level"),
        _param_get_args,
        _param_get,
    ),
    Subcommand(
        "set-node-throttle",
        "set the node's throttle properties (JSON)",
        "Set node-wide throttle properties (SetNodeThrottleProperties). JSON is one "
        "object; keys it leaves out keep their values. Prints the properties now in force.",
        ("tenantkv-admin set-node-throttle '{\"capacity\": 50000}'",),
        _json_arg,
        _set_node_throttle,
    ),
    Subcommand(
        "get-node-throttle",
        "show the node's throttle properties",
        "Show the node-wide throttle properties (GetNodeThrottleProperties).",
        ("tenantkv-admin get-node-throttle",),
        _no_arguments,
        _get_node_throttle,
    ),
    Subcommand(
        "set-bucket-throttle",
        "set a bucket's throttle properties (JSON)",
        "Set one bucket's throttle properties (SetBucketThrottleProperties). JSON is one "
        "object; keys it leaves out keep their values. Prints the properties now in force.",
        (
            "tenantkv-admin set-bucket-throttle orders "
            '\'{"reserved": 1000, "hard_limit": "unlimited"}\'',
        ),
        _bucket_json_args,
        _set_bucket_throttle,
    ),
    Subcommand(
        "get-bucket-throttle",
        "show a bucket's throttle properties",
        "Show one bucket's throttle properties (GetBucketThrottleProperties).",
        ("tenantkv-admin get-bucket-throttle orders",),
        _bucket_arg,
        _get_bucket_throttle,
    ),
    Subcommand(
        "ping",
        "check that the server answers",
        "Connect, log in and ping; prints the round-trip time of the ping.",
        ("tenantkv-admin ping", "tenantkv-admin --port 7300 ping"),
        _no_arguments,
        _ping,
    ),
    Subcommand(
        "cluster-status",
        "show the cluster: nodes, slots, map version",
        "Show the cluster as the node asked sees it (docs/cluster.md): its name, whether it "
        "coordinates and holds its etcd lease, the cluster map's version, and a row per "
        "node with its address, state (up, or DOWN once its lease expired), slot count "
        "and slot ranges; then each node's operations, read and write units and keys "
        "(from each node's status, over its main port) and their sum over the cluster. "
        "Exit 1 when the node is not in a cluster.",
        ("tenantkv-admin cluster-status", "tenantkv-admin --json cluster-status | jq .map"),
        _no_arguments,
        _cluster_status,
    ),
    Subcommand(
        "rebalance",
        "even the slots out over the nodes that are up",
        "Ask the cluster's coordinator to move slots so that every node that is up holds "
        "an even share (a node that joined gets its share this way; nothing moves on its "
        "own). Slots move in small batches, their data copied while writes go on; each "
        "batch stops taking writes for well under a second. Answers once the coordinator "
        "took it on; follow the progress with cluster-status (docs/cluster.md, "
        '"Rebalance").',
        ("tenantkv-admin rebalance", "tenantkv-admin cluster-status"),
        _rebalance_args,
        _rebalance,
    ),
    Subcommand(
        "node-remove",
        "move every slot off a node, then take it out of the cluster",
        "Ask the coordinator to move all of NAME's slots to the other nodes that are up "
        "(evened out), then take NAME out of the map; it stays out while it runs, and "
        "may be stopped once cluster-status no longer lists it. The node must be up: "
        "its slots' data is on it alone.",
        ("tenantkv-admin node-remove node3",),
        _node_remove_args,
        _node_remove,
    ),
)


# -- the parser ------------------------------------------------------------------------


class _Formatter(argparse.HelpFormatter):
    """Wraps one-line paragraphs (descriptions); keeps multi-line ones (examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        fill = super()._fill_text  # zero-argument super() fails inside a comprehension
        paragraphs = text.split("\n\n")
        return "\n\n".join(
            indent + p.replace("\n", "\n" + indent) if "\n" in p else fill(p, width, indent)
            for p in paragraphs
        )


def _examples(lines: Sequence[str]) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


MAIN_EXAMPLES = (
    f"export {ENV_PASSWORD}=...",
    "tenantkv-admin bucket-create orders",
    "tenantkv-admin user-create app --role orders=readwrite",
    "tenantkv-admin --host db1 status",
    "tenantkv-admin SUBCOMMAND --help",
)

MAIN_EPILOG = f"""\
connection:
  --host, --port and --user default to ${ENV_HOST}, ${ENV_PORT} and
  ${ENV_USER}, then to {DEFAULT_HOST}, {DEFAULT_PORT} and {DEFAULT_USER}. The password comes from
  --password, else ${ENV_PASSWORD}, else a prompt on a terminal. These
  options and --timeout and --json go before or after the subcommand
  (user-create and user-update take the new user's password as
  --user-password). --port is the MessagePack port, not the RESP one.

exit status:
  0 success, 1 an error from the server or the connection, 2 a usage error.

{_examples(MAIN_EXAMPLES)}"""


def _add_global_options(
    p: argparse.ArgumentParser, *, suppress: bool = False, password: bool = True
) -> None:
    """The connection options and --json, before the subcommand or (``suppress``:
    no default, so one given before is kept) after it."""
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    p.add_argument(
        "--host",
        metavar="H",
        help=f"server address (default ${ENV_HOST} or {DEFAULT_HOST})",
        **unset,
    )
    p.add_argument(
        "--port",
        metavar="N",
        type=port_number,
        help=f"the server's MessagePack port (default ${ENV_PORT} or {DEFAULT_PORT}; "
        "not the RESP port)",
        **unset,
    )
    p.add_argument(
        "--user",
        metavar="U",
        help=f"admin user to log in as (default ${ENV_USER} or admin)",
        **unset,
    )
    if password:
        p.add_argument(
            "--password",
            metavar="P",
            help=f"its password (visible in ps; prefer ${ENV_PASSWORD} or the prompt)",
            **unset,
        )
    p.add_argument(
        "--timeout",
        metavar="SECS",
        type=seconds,
        help=f"give up on the server after this long (default {DEFAULT_TIMEOUT:g}; backup: 3600)",
        **unset,
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the server's result as JSON instead of a table",
        **unset,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Administer a tenantkv server: buckets, users, throttling and status.",
        epilog=MAIN_EPILOG,
        formatter_class=_Formatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {tenantkv.__version__}")
    _add_global_options(parser)
    # The same options may follow the subcommand (`status --port 7300`): SUPPRESS
    # keeps a subcommand from resetting what was given before it. user-create and
    # user-update keep their own --password, which says where the new user's goes.
    after = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_global_options(after, suppress=True)
    after_but_password = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_global_options(after_but_password, suppress=True, password=False)
    sub = parser.add_subparsers(
        title="subcommands", dest="subcommand", metavar="SUBCOMMAND", required=True
    )
    for spec in SUBCOMMANDS:
        p = sub.add_parser(
            spec.name,
            help=spec.help,
            description=spec.description,
            epilog=_examples(spec.examples),
            formatter_class=_Formatter,
            parents=[after if spec.password_after else after_but_password],
            allow_abbrev=False,  # "--user" must not pass for "--user-password"
        )
        spec.add_arguments(p)
        p.set_defaults(spec=spec, subparser=p)
    return parser


# -- running ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    user: str


def resolve_target(a: argparse.Namespace) -> Target:
    """Flags, else environment variables, else defaults."""
    host = a.host or os.environ.get(ENV_HOST) or DEFAULT_HOST
    port = a.port
    if port is None:
        env_port = os.environ.get(ENV_PORT)
        if env_port:
            try:
                port = port_number(env_port)
            except argparse.ArgumentTypeError as exc:
                raise UsageError(f"${ENV_PORT}: {exc}") from None
        else:
            port = DEFAULT_PORT
    user = a.user or os.environ.get(ENV_USER) or DEFAULT_USER
    return Target(host, port, user)


def resolve_password(a: argparse.Namespace, t: Target) -> str:
    if a.password is not None:
        if not a.password:
            raise UsageError("--password is empty")
        return a.password
    if os.environ.get(ENV_PASSWORD):
        return os.environ[ENV_PASSWORD]
    if stdin_is_tty():
        password = prompt_password(f"Password for {t.user} at {t.host}:{t.port}: ")
        if not password:
            raise UsageError("no password entered", usage=False)
        return password
    raise UsageError(
        f"no password for user {t.user!r}: pass --password P, set ${ENV_PASSWORD}, "
        "or run on a terminal to be prompted"
    )


def error_line(exc: errors.TenantKVError) -> str:
    line = f"{PROG}: {exc.code_name}: {exc.errmsg}"
    if exc.retry_after_ms is not None:
        line += f" (retry after {exc.retry_after_ms} ms)"
    return line


def run(a: argparse.Namespace) -> Output:
    """Connect and run the parsed subcommand (after ``prepare``)."""
    t = resolve_target(a)
    password = resolve_password(a, t)
    spec: Subcommand = a.spec
    if spec.prepare is not None:
        spec.prepare(a, a.subparser)
    timeout = a.timeout or spec.timeout or DEFAULT_TIMEOUT
    with tenantkv.Client(
        t.host,
        t.port,
        user=t.user,
        password=password,
        timeout=timeout,
        connect_timeout=min(timeout, 10.0),
        client_name=PROG,
    ) as client:
        return spec.run(client, a)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version or a usage error
        return exc.code if isinstance(exc.code, int) else 2
    try:
        out = run(args)
        if not out.printed:
            print(fmt.dumps(out.result) if args.json else out.text, flush=True)
    except UsageError as exc:
        p = exc.parser or parser
        if exc.usage:
            p.print_usage(sys.stderr)
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    except errors.TenantKVError as exc:
        print(error_line(exc), file=sys.stderr)
        return 1
    except Aborted as exc:
        print(f"{PROG}: aborted: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout went away (| head); keep the interpreter from failing on its final flush.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
