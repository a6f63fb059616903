"""Specification of `spark-elastic assign`, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_cli

FULL = 1_000_000

SCALE_OUT = {
    "config": {"num_standby_replicas": 1},
    "tasks": [{"id": t, "stateful": True, "group": "g", "end_offset": FULL} for t in "ABC"],
    "clients": [
        {
            "id": "I1",
            "capacity": 1,
            "lags": {"B": 0},
            "previous": {"active": ["A", "C"], "standby": ["B"]},
            "leaving": False,
        },
        {
            "id": "I2",
            "lags": {"A": 0, "C": 0},
            "previous": {"active": ["B"], "standby": ["A", "C"]},
        },
        {"id": "I3"},
    ],
}


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("assign", *args, stdin=stdin)


def assign_json(problem: Any) -> dict[str, Any]:
    result = cli("-", stdin=json.dumps(problem))
    assert result.returncode == 0, result.stderr
    output: dict[str, Any] = json.loads(result.stdout)
    return output


def test_assign_reads_a_file_and_prints_the_documented_json(tmp_path: Path) -> None:
    problem = tmp_path / "problem.json"
    problem.write_text(json.dumps(SCALE_OUT))
    result = cli(str(problem))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "assignment": {
            "I1": {"active": ["A", "C"], "standby": ["B"], "warmup": []},
            "I2": {"active": ["B"], "standby": ["A", "C"], "warmup": []},
            "I3": {"active": [], "standby": [], "warmup": ["C"]},
        },
        "probing_rebalance": {"needed": True, "after_ms": 600_000},
        "may_shut_down": [],
        "warnings": [],
    }
    assert result.stderr == ""


def test_assign_reads_stdin_given_a_dash() -> None:
    output = assign_json(SCALE_OUT)
    assert output["assignment"]["I3"]["warmup"] == ["C"]


def test_assign_prints_one_line_with_compact() -> None:
    result = cli("--compact", "-", stdin=json.dumps(SCALE_OUT))
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1
    assert json.loads(result.stdout)["probing_rebalance"]["needed"] is True


def test_assign_defaults_every_optional_key() -> None:
    output = assign_json({"tasks": [{"id": "t1"}, {"id": "t2"}], "clients": [{"id": "c1"}]})
    assert output == {
        "assignment": {"c1": {"active": ["t1", "t2"], "standby": [], "warmup": []}},
        "probing_rebalance": {"needed": False, "after_ms": None},
        "may_shut_down": [],
        "warnings": [],
    }


def test_absent_lag_means_no_state_and_warmups_reported_back_finish_the_move() -> None:
    first = {
        "tasks": [{"id": "t1", "end_offset": FULL}, {"id": "t2", "end_offset": FULL}],
        "clients": [{"id": "c1", "previous": {"active": ["t1", "t2"]}}, {"id": "c2"}],
    }
    assert assign_json(first)["assignment"]["c2"]["warmup"] == ["t2"]
    caught_up = {
        "tasks": first["tasks"],
        "clients": [
            {"id": "c1", "previous": {"active": ["t1", "t2"]}},
            {"id": "c2", "lags": {"t2": 0}, "previous": {"warmup": ["t2"]}},
        ],
    }
    output = assign_json(caught_up)
    assert output["assignment"]["c2"] == {"active": ["t2"], "standby": [], "warmup": []}
    assert output["probing_rebalance"] == {"needed": False, "after_ms": None}


def test_a_stateful_task_without_end_offset_moves_to_a_new_client_through_a_warmup() -> None:
    # No end_offset: the state's size is unknown, and c2, reporting no lag, has none of it.
    output = assign_json(
        {
            "tasks": [{"id": "t1"}, {"id": "t2"}],
            "clients": [{"id": "c1", "previous": {"active": ["t1", "t2"]}}, {"id": "c2"}],
        }
    )
    assert output["assignment"] == {
        "c1": {"active": ["t1", "t2"], "standby": [], "warmup": []},
        "c2": {"active": [], "standby": [], "warmup": ["t2"]},
    }
    assert output["probing_rebalance"] == {"needed": True, "after_ms": 600_000}


def test_capacities_whose_sum_overflows_a_float_still_assign() -> None:
    output = assign_json(
        {
            "tasks": [{"id": "t1"}, {"id": "t2"}],
            "clients": [{"id": "c1", "capacity": 1e308}, {"id": "c2", "capacity": 1e308}],
        }
    )
    assert output["assignment"] == {
        "c1": {"active": ["t1"], "standby": [], "warmup": []},
        "c2": {"active": ["t2"], "standby": [], "warmup": []},
    }


def test_leaving_client_is_listed_once_it_may_shut_down() -> None:
    output = assign_json(
        {
            "config": {"num_standby_replicas": 1},
            "tasks": [{"id": "t1", "end_offset": FULL}],
            "clients": [
                {"id": "old", "previous": {"active": ["t1"]}, "leaving": True},
                {"id": "new", "lags": {"t1": 0}, "previous": {"standby": ["t1"]}},
            ],
        }
    )
    assert output["assignment"]["new"]["active"] == ["t1"]
    assert output["may_shut_down"] == ["old"]


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ('{"tasks": [', "stdin: not valid JSON"),
        ("[1, 2]", "input: expected a JSON object"),
        ('{"tasks": [{"id": "a"}], "clients": [{"id": "x", "capacity": NaN}]}', "NaN"),
        (
            '{"tasks": [{"id": "a"}], "clients": [{"id": "x", "capacity": -2}]}',
            "capacity: expected a finite number > 0, found -2",
        ),
        ('{"tasks": [{"id": "a"}, {"id": "a"}], "clients": [{"id": "x"}]}', "duplicate task id"),
        ('{"tasks": [], "clients": [{"id": "x"}, {"id": "x"}]}', "duplicate client id 'x'"),
        ('{"tasks": [{"id": "a", "sateful": true}]}', "found 'sateful'"),
        ('{"tasks": [{"stateful": true}]}', "tasks[0]: expected an object with an 'id'"),
        ('{"tasks": [{"id": 7}]}', "tasks[0]: task id: expected a non-empty str"),
        ('{"config": {"max_warmup_replicas": 0}}', "max_warmup_replicas: expected an int >= 1"),
        ('{"clients": [{"id": "x", "previous": {"active": "a"}}]}', "previous.active"),
        ('{"tasks": [{"id": "a"}], "clients": [{"id": "x", "leaving": true}]}', "all leaving"),
        (
            '{"tasks": [{"id": "a"}], "clients": [{"id": "x", "capacity": 1e300},'
            ' {"id": "y", "capacity": 1e-300}]}',
            "client 'y': capacity: expected at least 1e-300 times the largest capacity",
        ),
        (
            '{"tasks": [{"id": "a", "end_offset": 5, "id": "b"}]}',
            "tasks[0]: expected each key at most once, found 'id' twice",
        ),
        (
            '{"tasks": [{"id": "a"}], "tasks": [{"id": "b"}]}',
            "input: expected each key at most once, found 'tasks' twice",
        ),
        (
            '{"tasks": [{"id": "a"}], "clients": [{"id": "x", "lags": {"a": 9, "a": 0}}]}',
            "clients[0].lags: expected each key at most once, found 'a' twice",
        ),
        (
            '{"clients": [{"id": "x", "previous": {"active": [], "active": []}}]}',
            "clients[0].previous: expected each key at most once, found 'active' twice",
        ),
        ('{"config": {"max_warmup_replicas": 1, "max_warmup_replicas": 2}}', "found 'max_warm"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(stdin: str, message: str) -> None:
    result = cli("-", stdin=stdin)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("spark-elastic assign: error: ")
    assert message in lines[0]


def crashed_down_to_two() -> dict[str, Any]:
    """12 tasks with 2 standbys on 3 clients, balanced and caught up; then c2 crashes."""
    tasks = [{"id": f"T{i}", "group": f"g{i // 6}", "end_offset": FULL} for i in range(12)]
    three = {"config": {"num_standby_replicas": 2}, "tasks": tasks}
    first = assign_json({**three, "clients": [{"id": f"c{i}"} for i in (1, 2, 3)]})
    survivors = [
        {
            "id": client,
            "lags": dict.fromkeys(held["standby"], 0),
            "previous": {"active": held["active"], "standby": held["standby"]},
        }
        for client, held in first["assignment"].items()
        if client != "c2"
    ]
    return {**three, "clients": survivors}


def test_a_crash_leaving_too_few_clients_for_the_standbys_still_assigns_and_warns() -> None:
    result = cli("-", stdin=json.dumps(crashed_down_to_two()))
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    held = output["assignment"]
    for i in range(12):
        task = f"T{i}"
        active = [c for c in held if task in held[c]["active"]]
        standby = [c for c in held if task in held[c]["standby"]]
        assert len(active) == len(standby) == 1
        assert active != standby
    assert output["warnings"] == [
        {
            "kind": "standby-shortfall",
            "task": f"T{i}",
            "client": None,
            "detail": f"task 'T{i}' gets 1 of 2 standby replicas: 2 staying clients host at "
            "most 1 besides the active",
        }
        for i in range(12)
    ]
    lines = result.stderr.splitlines()
    assert lines == [
        f"spark-elastic assign: warning: standby-shortfall: {w['detail']}"
        for w in output["warnings"]
    ]


def test_warnings_are_one_line_each_in_readable_and_compact_output() -> None:
    readable = cli("-", stdin=json.dumps(crashed_down_to_two())).stdout
    warning_lines = [line for line in readable.splitlines() if '"kind": ' in line]
    assert len(warning_lines) == 12
    compact = cli("--compact", "-", stdin=json.dumps(crashed_down_to_two())).stdout
    assert json.loads(compact) == json.loads(readable)


def test_reports_of_removed_and_stateless_tasks_are_ignored_with_a_warning_each() -> None:
    result = cli(
        "-",
        stdin=json.dumps(
            {
                "tasks": [{"id": "a"}, {"id": "s", "stateful": False}],
                "clients": [
                    {"id": "x", "lags": {"b": 1, "s": 0}, "previous": {"active": ["a", "b"]}},
                    {"id": "y", "previous": {"active": ["s"], "standby": ["b"]}},
                ],
            }
        ),
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["assignment"] == {
        "x": {"active": ["a"], "standby": [], "warmup": []},
        "y": {"active": ["s"], "standby": [], "warmup": []},
    }
    assert [(w["kind"], w["task"], w["client"]) for w in output["warnings"]] == [
        ("stateless-task", "s", "x"),
        ("unknown-task", "b", "x"),
        ("unknown-task", "b", "y"),
    ]
    assert result.stderr.splitlines() == [
        "spark-elastic assign: warning: stateless-task: client 'x' reports a lag of task 's', "
        "which is stateless: ignored",
        "spark-elastic assign: warning: unknown-task: client 'x' reports a lag and an active of "
        "task 'b', which is not in the job: ignored",
        "spark-elastic assign: warning: unknown-task: client 'y' reports a standby of task 'b', "
        "which is not in the job: ignored",
    ]


def test_a_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = cli(str(tmp_path / "absent.json"))
    assert result.returncode == 2
    assert result.stderr.strip().endswith("cannot read: No such file or directory")
    assert "Traceback" not in result.stderr


def test_a_file_that_is_not_text_is_one_line_and_exit_2(tmp_path: Path) -> None:
    binary = tmp_path / "problem.json"
    binary.write_bytes(b"\xff\xfe\x00")
    result = cli(str(binary))
    assert result.returncode == 2
    assert "not UTF-8 text" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_assign_without_a_file_is_a_usage_error() -> None:
    result = cli()
    assert result.returncode == 2
    assert "FILE" in result.stderr
