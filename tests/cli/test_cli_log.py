"""Specification of `spark-elastic log`, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli

from spark_elastic.log.embedded import EmbeddedLog
from udfs import kafka_partitions


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("log", *args, stdin=stdin)


def ok(*args: str, stdin: str | None = None) -> str:
    result = cli(*args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_create_produce_grow_and_describe(tmp_path: Path) -> None:
    log_dir = str(tmp_path / "log")
    assert ok("create", log_dir, "clicks", "--partitions", "3") == (
        f"created topic clicks with 3 partitions in {log_dir}\n"
    )
    records = tmp_path / "records.tsv"
    records.write_text("alice\tlogin\nbob\tview\n\nalice\tlogout\n")
    assert ok("produce", log_dir, "clicks", "--file", str(records)).startswith(
        "produced 3 records to clicks; end offsets "
    )
    # 3 -> 4 is no multiple: allowed for a topic no job reads, when asked for.
    ok("grow", log_dir, "clicks", "--partitions", "4", "--any-count")
    ok("create", log_dir, "alpha", "--partitions", "1")

    log = EmbeddedLog(log_dir, create=False)
    rows = [r for p in range(3) for r in log.read("clicks", p).to_pylist()]
    assert sorted((r["key"], r["value"]) for r in rows) == [
        (b"alice", b"login"),
        (b"alice", b"logout"),
        (b"bob", b"view"),
    ]
    for row in rows:
        assert row["partition"] == kafka_partitions([row["key"]], 3)[0]

    ends = log.describe("clicks").end_offsets
    table = ok("describe", log_dir).splitlines()
    assert table[0].split() == ["TOPIC", "PARTITIONS", "RECORDS", "END", "OFFSETS"]
    assert table[1].split() == ["alpha", "1", "0", "0:0"]
    assert table[2].split() == ["clicks", "4", "3", *(f"{p}:{o}" for p, o in enumerate(ends))]
    described = json.loads(ok("describe", log_dir, "clicks", "--json"))
    assert described == {"topics": [log.describe("clicks").to_json()]}
    assert described["topics"][0]["partitions"] == 4


def test_produce_reads_json_lines_from_stdin(tmp_path: Path) -> None:
    log_dir = str(tmp_path / "log")
    ok("create", log_dir, "t", "--partitions", "1")
    lines = [
        {"key": "k", "value": "v", "timestamp": 1_700_000_000_000},
        {"key": None, "value": "no key"},
        {"key": "tab\tkey", "value": None},
    ]
    ok("produce", log_dir, "t", "--file", "-", stdin="\n".join(map(json.dumps, lines)) + "\n")

    rows = EmbeddedLog(log_dir, create=False).read("t", 0).to_pylist()
    assert [(r["key"], r["value"]) for r in rows] == [
        (b"k", b"v"),
        (None, b"no key"),
        (b"tab\tkey", None),
    ]
    assert rows[0]["timestamp"].timestamp() == 1_700_000_000


def test_generate_is_reproducible_and_keyed_like_kafka(tmp_path: Path) -> None:
    for name in ("a", "b"):
        ok("create", str(tmp_path / name), "t", "--partitions", "4")
        ok("produce", str(tmp_path / name), "t", "--generate", "2000", "--keys", "40")
    first = EmbeddedLog(tmp_path / "a", create=False)
    second = EmbeddedLog(tmp_path / "b", create=False)

    assert first.describe("t").records == 2000
    keys: set[bytes] = set()
    for p in range(4):
        batch = first.read("t", p)
        assert batch.column("key").to_pylist() == second.read("t", p).column("key").to_pylist()
        assert batch.column("value").to_pylist() == second.read("t", p).column("value").to_pylist()
        part_keys = batch.column("key").to_pylist()
        np.testing.assert_array_equal(kafka_partitions(part_keys, 4), np.full(len(part_keys), p))
        keys.update(part_keys)
    assert len(keys) == 40
    value = json.loads(first.read("t", 0, 0, 1).column("value")[0].as_py())
    assert set(value) == {"key", "seq"}


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (("describe", "{dir}/missing"), None, "no embedded log at"),
        (("create", "{dir}/log", "t", "--partitions", "2"), None, "topic 't' already exists"),
        (("grow", "{dir}/log", "t", "--partitions", "1"), None, "cannot shrink to 1"),
        (("describe", "{dir}/log", "nope"), None, "no topic 'nope'"),
        (("produce", "{dir}/log", "t", "--file", "-"), "a\tb\nno tab\n", "line 2: expected KEY"),
        (("produce", "{dir}/log", "t", "--file", "-"), '{"key": 1}\n', "line 1: expected a JSON"),
        (("produce", "{dir}/log", "t", "--file", "{dir}/none.txt"), None, "a readable file"),
        (("produce", "{dir}/log", "t", "--generate", "5"), None, "--keys: expected a key count"),
        (("produce", "{dir}/log", "t", "--generate", "0", "--keys", "2"), None, "positive"),
        (("create", "{dir}/log", "a/b", "--partitions", "2"), None, "Kafka topic name"),
        (("grow", "{dir}/log", "t"), None, "required: --partitions"),
        (
            ("grow", "{dir}/log", "t", "--partitions", "3"),
            None,
            "--partitions: expected a multiple",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...], stdin: str | None, message: str
) -> None:
    EmbeddedLog(tmp_path / "log").create_topic("t", 2)
    result = cli(*(a.format(dir=tmp_path) for a in args), stdin=stdin)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert message in result.stderr
    # A refused produce appends nothing, even the valid lines before the bad one.
    assert EmbeddedLog(tmp_path / "log", create=False).describe("t").records == 0


def test_the_log_commands_import_no_spark_of_their_own(tmp_path: Path) -> None:
    ok("create", str(tmp_path / "log"), "t", "--partitions", "2")
    # What the package and the other subcommands import is their business; the
    # log commands themselves add neither pyspark nor pandas to a CLI run.
    probe = (
        "import sys\n"
        "import spark_elastic\n"
        "from spark_elastic.cli.main import build_parser, main\n"
        "build_parser()  # imports every subcommand module\n"
        "before = set(sys.modules)\n"
        f"main(['log', 'produce', {str(tmp_path / 'log')!r}, 't', '--generate', '10', "
        "'--keys', '3'])\n"
        "main(['log', 'describe', " + repr(str(tmp_path / "log")) + "])\n"
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
        "('pyspark', 'pandas', 'py4j')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.splitlines()[-1] == "[]"


def test_grow_to_a_multiple_keeps_tasks_and_other_counts_are_refused(tmp_path: Path) -> None:
    log_dir = str(tmp_path / "log")
    ok("create", log_dir, "clicks", "--partitions", "4")
    result = cli("grow", log_dir, "clicks", "--partitions", "6")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        line for line in result.stderr.splitlines() if "multiple of clicks's 4 partitions" in line
    ]
    assert len(result.stderr.splitlines()) == 1
    assert EmbeddedLog(log_dir, create=False).partition_count("clicks") == 4
    assert ok("grow", log_dir, "clicks", "--partitions", "8") == "topic clicks: 4 -> 8 partitions\n"


def test_generate_shows_keys_as_part_of_it_in_usage() -> None:
    result = cli("produce", "--help")
    assert "--generate N --keys K" in result.stdout
    assert "required with --generate" in result.stdout


def test_version() -> None:
    from spark_elastic import __version__

    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"spark-elastic {__version__}"
