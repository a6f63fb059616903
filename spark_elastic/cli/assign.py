"""``spark-elastic assign``: one KIP-441 rebalance, JSON in and JSON out.

Input (a file, or ``-`` for stdin)::

    {"config": {"num_standby_replicas": 1, ...},
     "tasks": [{"id": "t1", "stateful": true, "group": "g", "end_offset": 50000}, ...],
     "clients": [{"id": "c1", "capacity": 1, "lags": {"t1": 0},
                  "previous": {"active": [...], "standby": [...], "warmup": [...]},
                  "leaving": false}, ...]}

Output::

    {"assignment": {"c1": {"active": [...], "standby": [...], "warmup": [...]}, ...},
     "probing_rebalance": {"needed": true, "after_ms": 600000},
     "may_shut_down": [...],
     "warnings": [{"kind": "standby-shortfall", "task": "t1", "client": null,
                   "detail": "..."}, ...]}

Warnings (standbys short of the configured count, reports of removed or
stateless tasks ignored) are also printed on stderr, one line each; the exit
status stays 0. Malformed input is one line on stderr and exit status 2.

Every key but ``tasks[].id`` and ``clients[].id`` is optional (defaults as in
:class:`~spark_elastic.AssignmentConfig`, :class:`~spark_elastic.TaskSpec` and
:class:`~spark_elastic.ClientState`); ``previous.warmup`` is an extension of
the issue's format, for warm-ups handed out by the last rebalance. Unknown
keys are errors, so a typo cannot silently fall back to a default, and so
is a key given twice in one object (JSON would keep the last silently).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from spark_elastic.assignment.model import AssignmentConfig, ClientState, TaskSpec
from spark_elastic.errors import ArgumentError, ArgumentTypeError, SparkElasticError

__all__ = ["register", "run"]

_T = TypeVar("_T")

_TOP_KEYS = ("config", "tasks", "clients")
_CONFIG_KEYS = (
    "acceptable_recovery_lag",
    "num_standby_replicas",
    "max_warmup_replicas",
    "probing_rebalance_interval_ms",
    "balance_tolerance",
)
_TASK_KEYS = ("id", "stateful", "group", "end_offset")
_CLIENT_KEYS = ("id", "capacity", "lags", "previous", "leaving")
_PREVIOUS_KEYS = ("active", "standby", "warmup")


def register(subparsers: Any) -> None:
    """Add the ``assign`` subcommand."""
    parser = subparsers.add_parser(
        "assign",
        help="assign tasks to clients for one rebalance (KIP-441, JSON in and out)",
        description=(
            "Read tasks, clients (capacity, lags, previous assignment, leaving) and config as "
            "JSON; print each client's active, standby and warm-up tasks, whether a probing "
            "rebalance is needed, which leaving clients may shut down, and warnings (standbys "
            "short, stale reports ignored; also on stderr, one line each)."
        ),
    )
    parser.add_argument("input", metavar="FILE", help="the problem as JSON, or - for stdin")
    parser.add_argument("--compact", action="store_true", help="print JSON on one line")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Read the problem, assign, print the result."""
    from spark_elastic.assignment.assignor import assign

    document = _load(args.input)
    config, tasks, clients = _problem(document)
    result = assign(tasks, clients, config)
    output = {
        "assignment": {
            client_id: {
                "active": list(tasks_of.active),
                "standby": list(tasks_of.standby),
                "warmup": list(tasks_of.warmup),
            }
            for client_id, tasks_of in result.assignment.items()
        },
        "probing_rebalance": {
            "needed": result.probing_rebalance.needed,
            "after_ms": result.probing_rebalance.after_ms,
        },
        "may_shut_down": list(result.may_shut_down),
        "warnings": [dataclasses.asdict(warning) for warning in result.warnings],
    }
    sys.stdout.write(json.dumps(output) if args.compact else _readable(output))
    sys.stdout.write("\n")
    for warning in result.warnings:
        print(f"spark-elastic assign: warning: {warning.kind}: {warning.detail}", file=sys.stderr)
    return 0


def _readable(output: Mapping[str, Any]) -> str:
    """Indented JSON with one line per client and per warning (``json.dumps(indent=2)`` puts
    every task on a line of its own)."""
    clients = [
        f"    {json.dumps(client)}: {json.dumps(tasks)}"
        for client, tasks in output["assignment"].items()
    ]
    warnings = [f"    {json.dumps(warning)}" for warning in output["warnings"]]
    return (
        "{\n"
        f'  "assignment": {_block(clients, "{", "}")},\n'
        f'  "probing_rebalance": {json.dumps(output["probing_rebalance"])},\n'
        f'  "may_shut_down": {json.dumps(output["may_shut_down"])},\n'
        f'  "warnings": {_block(warnings, "[", "]")}\n'
        "}"
    )


def _block(lines: list[str], opening: str, closing: str) -> str:
    return opening + "\n" + ",\n".join(lines) + "\n  " + closing if lines else opening + closing


def _load(source: str) -> object:
    name = "stdin" if source == "-" else source
    try:
        if source == "-":
            text = sys.stdin.read()
        else:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as exc:
        raise ArgumentError(f"{name}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ArgumentError(f"{name}: not UTF-8 text: {exc.reason}") from None
    try:
        document = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_pairs)
        _reject_repeated_keys(document)
    except json.JSONDecodeError as exc:
        raise ArgumentError(
            f"{name}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise ArgumentError(f"{name}: not valid JSON: nested too deeply") from None
    return document


class _Repeated(dict[str, Any]):
    """A JSON object that was given some key twice (``key``: the first such key)."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: a dict, marked when a key came twice."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return _Repeated(pairs, key)
        seen.add(key)
    return dict(pairs)


def _reject_repeated_keys(value: object, where: str | None = None) -> None:
    """Refuse a key given twice in one object, naming where (JSON would keep the last).

    ``where`` is the path as :func:`_problem` names it (``tasks[0]``,
    ``clients[1].lags``); ``None`` for the whole input.
    """
    if isinstance(value, _Repeated):
        raise ArgumentError(
            f"{where or 'input'}: expected each key at most once, found {value.key!r} twice"
        )
    if isinstance(value, dict):
        for key, item in value.items():
            _reject_repeated_keys(item, key if where is None else f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _reject_repeated_keys(item, f"{where or 'input'}[{i}]")


def _reject_constant(name: str) -> object:
    raise ArgumentError(f"input: {name} is not a JSON number")


def _problem(document: object) -> tuple[AssignmentConfig, list[TaskSpec], list[ClientState]]:
    top = _object(document, "input", _TOP_KEYS)
    config = _build("config", _config, top.get("config", {}))
    tasks = [
        _build(f"tasks[{i}]", _task, item)
        for i, item in enumerate(_array(top.get("tasks", []), "tasks"))
    ]
    clients = [
        _build(f"clients[{i}]", _client, item)
        for i, item in enumerate(_array(top.get("clients", []), "clients"))
    ]
    return config, tasks, clients


def _config(value: object, where: str) -> AssignmentConfig:
    return AssignmentConfig(**_object(value, where, _CONFIG_KEYS))


def _task(value: object, where: str) -> TaskSpec:
    return TaskSpec(**_with_id(value, where, _TASK_KEYS))


def _client(value: object, where: str) -> ClientState:
    fields = dict(_with_id(value, where, _CLIENT_KEYS))
    previous = _object(fields.pop("previous", {}), f"{where}.previous", _PREVIOUS_KEYS)
    for kind in _PREVIOUS_KEYS:
        if kind in previous:
            fields[f"previous_{kind}"] = _array(previous[kind], f"{where}.previous.{kind}")
    if "lags" in fields:
        fields["lags"] = _object(fields["lags"], f"{where}.lags", None)
    return ClientState(**fields)


def _object(value: object, where: str, keys: tuple[str, ...] | None) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ArgumentTypeError.wrong_type(where, "a JSON object", value)
    if keys is not None:
        for key in value:
            if key not in keys:
                raise ArgumentError.invalid(where, "known keys only", key, keys)
    return value


def _array(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ArgumentTypeError.wrong_type(where, "a JSON array", value)
    return value


def _with_id(value: object, where: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    fields = _object(value, where, keys)
    if "id" not in fields:
        raise ArgumentError.invalid(where, "an object with an 'id'", value)
    return fields


def _build(where: str, make: Callable[[object, str], _T], value: object) -> _T:
    """Build a value, naming where in the input it came from when it is refused."""
    try:
        return make(value, where)
    except SparkElasticError as exc:
        message = str(exc)
        if not message.startswith(where):
            message = f"{where}: {message}"
        raise type(exc)(message) from None
