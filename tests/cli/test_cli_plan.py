"""Specification of `spark-elastic plan`, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


def test_plan_prints_a_table_of_tasks() -> None:
    result = cli(
        "plan", "--input", "kafka.PVE:2", "--input", "kafka.URE:2", "--elasticity-factor", "2"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("4 tasks from 4 stream partitions")
    assert lines[1].split() == ["ID", "TASK", "PARTITIONS"]
    assert lines[2].split(maxsplit=1) == ["0", "Partition 0_0_2  kafka.PVE:0#0, kafka.URE:0#0"]
    assert len(lines) == 2 + 4


def test_plan_json_has_the_documented_shape() -> None:
    result = cli(
        "plan",
        "--input",
        "kafka.IS1:8",
        "--input",
        "kafka.IS2:12",
        "--grouper",
        "cogroup",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    tasks = json.loads(result.stdout)["tasks"]
    assert [t["id"] for t in tasks] == [0, 1, 2, 3]
    assert tasks[1]["name"] == "Partition 1"
    assert {"system": "kafka", "stream": "IS1", "partition": 5} in tasks[1]["partitions"]
    assert {"system": "kafka", "stream": "IS2", "partition": 9} in tasks[1]["partitions"]


def test_plan_reads_previous_json_and_saves_the_new_plan(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    first = cli("plan", "--input", "kafka.PVE:2", "--json")
    plan_file.write_text(first.stdout)
    grown = cli(
        "plan", "--input", "kafka.PVE:4", "--previous", str(plan_file), "--save", str(plan_file)
    )
    assert grown.returncode == 0, grown.stderr
    assert grown.stdout.splitlines()[0].startswith("2 tasks from 4 stream partitions")
    saved = json.loads(plan_file.read_text())
    assert [len(t["partitions"]) for t in saved["tasks"]] == [2, 2]


def test_single_grouper_plan_round_trips_through_previous(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    single = ["--grouper", "single", "--processor", "a", "--processor", "b"]
    first = cli("plan", "--input", "kafka.A:2", *single, "--save", str(plan_file))
    assert first.returncode == 0, first.stderr
    again = cli("plan", "--input", "kafka.A:4", *single, "--previous", str(plan_file), "--json")
    assert again.returncode == 0, again.stderr
    assert [t["name"] for t in json.loads(again.stdout)["tasks"]] == ["Task-a", "Task-b"]


def test_cogroup_refuses_a_partition_grouper_previous_plan_naming_the_stream(
    tmp_path: Path,
) -> None:
    # The JSON without a "grouper" key: only the tasks say how partitions were grouped.
    document = json.loads(
        cli("plan", "--input", "kafka.PVE:4", "--input", "kafka.URE:2", "--json").stdout
    )
    del document["grouper"]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(document))
    result = cli(
        "plan",
        "--input",
        "kafka.PVE:4",
        "--input",
        "kafka.URE:2",
        "--grouper",
        "cogroup",
        "--previous",
        str(plan_file),
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "kafka.URE has 2 partitions" in result.stderr
    assert "not made by the cogroup grouper" in result.stderr


def test_save_that_fails_prints_no_plan_and_leaves_nothing_behind(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    result = cli("plan", "--input", "kafka.A:1", "--save", str(tmp_path / "afile" / "x.json"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("spark-elastic plan: error: --save: ")
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]
    assert (tmp_path / "afile").read_text() == ""


def test_single_grouper_takes_processors() -> None:
    result = cli(
        "plan",
        "--input",
        "kafka.A:2",
        "--grouper",
        "single",
        "--processor",
        "x",
        "--processor",
        "y",
        "--json",
    )
    assert [t["name"] for t in json.loads(result.stdout)["tasks"]] == ["Task-x", "Task-y"]


# Previous-plan files for the bad-argument cases; "{tmp}" in an argument is their directory.
BAD_PREVIOUS_FILES = {
    "inf.json": '{"tasks": [{"name": "Partition 0", "partitions": '
    '[{"system": "kafka", "stream": "A", "partition": 1e400}]}]}',
    "float.json": '{"tasks": [{"name": "Partition 0", "partitions": '
    '[{"system": "kafka", "stream": "A", "partition": 0.0}]}]}',
    "bool.json": '{"tasks": [{"name": "Partition 0", "partitions": '
    '[{"system": "kafka", "stream": "A", "partition": false}]}]}',
}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input", "kafka.A:2", "--elasticity-factor", "3"], "elasticity_factor"),
        (["--input", "kafka.A:2", "--elasticity-factor", "x"], "invalid int value"),
        (["--input", "kafka.A"], "system.stream:partition_count"),
        (["--input", "kafka.A:2", "--grouper", "max"], "invalid choice"),
        (["--input", "kafka.A:2", "--grouper", "single", "--elasticity-factor", "2"], "single"),
        (["--input", "kafka.A:2", "--previous", "/nonexistent/plan.json"], "does not exist"),
        ([], "required: --input"),
        (["--input", "kafka.A:2", "--save", "/tmp"], "--save: expected a file"),
        (["--input", "kafka.A:2", "--save", "{tmp}"], "--save: expected a file"),
        (["--input", "kafka.A:2", "--save", "/dev/null/plan.json"], "--save: "),
        (["--input", "kafka.A:2", "--save", "{tmp}/inf.json/sub/x.json"], "--save: "),
        (["--input", "kafka.A:\u00b2"], "system.stream:partition_count"),
        (["--input", "kafka.A:99999999999999"], "at most 2147483647"),
        (["--input", "kafka.A:2147483647"], "limit of 16777216 (2**24)"),
        (["--input", "kafka.A:16384", "--elasticity-factor", "2048"], "elasticity_factor"),
        (["--input", "kafka.A:16385", "--elasticity-factor", "1024"], "limit of 16777216"),
        (["--input", "kafka.A:1", "--previous", "{tmp}/inf.json"], "found inf"),
        (["--input", "kafka.A:1", "--previous", "{tmp}/float.json"], "found 0.0"),
        (["--input", "kafka.A:1", "--previous", "{tmp}/bool.json"], "found False"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_and_no_traceback(
    args: list[str], message: str, tmp_path: Path
) -> None:
    for name, content in BAD_PREVIOUS_FILES.items():
        (tmp_path / name).write_text(content)
    result = cli("plan", *(arg.replace("{tmp}", str(tmp_path)) for arg in args))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr


def test_shrunk_previous_stream_exits_2_naming_stream_and_counts(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(cli("plan", "--input", "kafka.PVE:4", "--json").stdout)
    result = cli("plan", "--input", "kafka.PVE:2", "--previous", str(plan_file))
    assert result.returncode == 2
    assert "kafka.PVE" in result.stderr
    assert "from 4 to 2" in result.stderr


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).parent / "spark-elastic"
    result = subprocess.run(
        [str(exe), "plan", "--input", "kafka.A:1"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "Partition 0" in result.stdout


def test_importing_the_package_loads_neither_pyspark_nor_pandas() -> None:
    code = (
        "import sys, spark_elastic; "
        "print(sorted(m for m in ('pandas', 'pyarrow', 'pyspark', 'py4j') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


CLI_IMPORTS = """
import contextlib, io, sys
from spark_elastic.cli.main import main
assignment = '{"tasks": [{"id": "t1"}], "clients": [{"id": "c1"}]}'
sys.stdin = io.StringIO(assignment)
with contextlib.redirect_stdout(io.StringIO()):
    codes = [main(["plan", "--input", "kafka.A:4", "--json"]), main(["assign", "-"])]
heavy = ("pandas", "pyarrow", "pyspark", "py4j")
print(codes, sorted(m for m in heavy if m in sys.modules))
"""


def test_plan_and_assign_run_without_loading_pyspark_pandas_or_pyarrow() -> None:
    # What keeps both commands starting in a fraction of a second (measured 0.16-0.19 s);
    # wall-clock time itself is not asserted, it depends on the machine.
    result = subprocess.run(
        [sys.executable, "-c", CLI_IMPORTS], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0, 0] []"


def test_dataframe_method_appears_when_pyspark_is_imported_later() -> None:
    code = (
        "import spark_elastic; from pyspark.sql import DataFrame; "
        "print(hasattr(DataFrame, 'withVirtualTasks'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
