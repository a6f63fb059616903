"""`spark-elastic checkpoint show` and `spark-elastic rescale`, run as real subprocesses."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_runner import run_cli
from pyspark.sql import SparkSession
from stateful_job import Job

from spark_elastic import EmbeddedLog
from spark_elastic.cli.checkpoint import _finished, _session_conf
from spark_elastic.errors import CheckpointError
from spark_elastic.runtime.container import class_archive

# Slow (left out by `pytest -m "not slow"`): each command starts its own Spark application.
pytestmark = pytest.mark.slow


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=300)


@pytest.fixture(scope="module")
def stopped(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-checkpoint")
    job = Job(spark, root / "job", random.Random(3))
    job.produce(60)
    job.run(root / "cp", 2)
    return root / "cp"


@pytest.mark.long  # `make test-all`; `make test` runs the table
def test_checkpoint_show_json_lists_every_bucket(stopped: Path) -> None:
    result = cli("checkpoint", "show", str(stopped), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["job"]["name"] == "running-count"
    assert report["lastBatchCommitted"] is True
    assert {b["virtualTask"] for b in report["buckets"]} == {
        f"Partition {p}_{b}_2" for p in range(2) for b in range(2)
    }
    # The job ran to the end of the log: every bucket's partition is committed up to its end.
    ends = EmbeddedLog(stopped.parent / "job" / "log").end_offsets("clicks")
    for bucket in report["buckets"]:
        assert bucket["committedOffset"] == ends[bucket["partition"]]
        assert 0 < bucket["nextOffset"] <= ends[bucket["partition"]]
        assert bucket["behind"] == ends[bucket["partition"]] - bucket["nextOffset"]


def test_checkpoint_show_prints_a_table(stopped: Path) -> None:
    result = cli("checkpoint", "show", str(stopped))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert "job 'running-count', elasticity factor 2" in lines[0]
    assert lines[1].split()[:3] == ["VIRTUAL", "TASK", "STREAM"]
    assert len(lines) == 2 + 4


def test_rescale_cli_writes_a_seeded_checkpoint(stopped: Path, tmp_path: Path) -> None:
    target = tmp_path / "split"
    result = cli(
        "rescale", "--from", str(stopped), "--to", str(target), "--elasticity-factor", "4", "--json"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["tasks"] == 8
    assert (target / "_spark_elastic" / "seed").is_dir()
    job = json.loads((target / "_spark_elastic" / "job.json").read_text())
    assert job["elasticityFactor"] == 4
    assert job["startingOffsets"] == summary["startingOffsets"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--elasticity-factor", "3"], "elasticity_factor"),
        (["--elasticity-factor", "0"], "elasticity_factor"),
        (["--elasticity-factor", "2", "--to", "SOURCE"], "other than the sources"),
    ],
)
def test_rescale_cli_refuses_bad_arguments_with_exit_2(
    stopped: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    argv = ["rescale", "--from", str(stopped)]
    argv += [str(stopped) if a == "SOURCE" else a for a in args]
    if "--to" not in argv:
        argv += ["--to", str(tmp_path / "new")]
    result = cli(*argv)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert message in result.stderr
    assert not (tmp_path / "new").exists()


def test_rescale_cli_refuses_a_directory_that_is_no_stateful_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    result = cli(
        "rescale",
        "--from",
        str(tmp_path / "plain"),
        "--to",
        str(tmp_path / "new"),
        "--elasticity-factor",
        "2",
    )
    assert result.returncode == 2
    assert "not written by a spark-elastic stateful query" in result.stderr
    result = cli("checkpoint", "show", str(tmp_path / "missing"))
    assert result.returncode == 2
    assert "does not exist" in result.stderr


def broken_copy(stopped: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "broken"
    shutil.copytree(stopped, copy)
    return copy


def assert_one_line_exit_2(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr


def test_checkpoint_show_refuses_an_undecodable_job_file_with_exit_2(
    stopped: Path, tmp_path: Path
) -> None:
    checkpoint = broken_copy(stopped, tmp_path)
    (checkpoint / "_spark_elastic" / "job.json").write_bytes(b"{\xff\xfe")
    assert_one_line_exit_2(cli("checkpoint", "show", str(checkpoint)), "cannot read the job file")


def test_rescale_cli_refuses_an_offset_log_that_is_a_file_with_exit_2(
    stopped: Path, tmp_path: Path
) -> None:
    checkpoint = broken_copy(stopped, tmp_path)
    shutil.rmtree(checkpoint / "offsets")
    (checkpoint / "offsets").write_text("not a directory")
    target = tmp_path / "new"
    result = cli(
        "rescale", "--from", str(checkpoint), "--to", str(target), "--elasticity-factor", "4"
    )
    assert_one_line_exit_2(result, "cannot list Spark's offset log")
    assert not target.exists()


def test_a_command_s_jvm_starts_as_a_container_s_with_c1_and_the_class_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A short-lived JVM reading a checkpoint once (7.2-7.5 s against 14.6-15.1 for a 1M-key
    # rescale on 2 cores, docs/benchmarks.md): C1 only, the host's archive recorded or mapped.
    monkeypatch.setenv(class_archive.ENV, str(tmp_path / "archives"))
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)  # the suite's own options
    try:
        options = _session_conf([])["spark.driver.extraJavaOptions"]
    finally:
        class_archive._CURRENT.clear()
    assert options.startswith("-Xss16m -Dlog4j2.configurationFile=")
    assert "-XX:TieredStopAtLevel=1" in options
    assert f"-XX:ArchiveClassesAtExit={tmp_path / 'archives'}" in options
    # A --conf that chooses the compiler and class sharing keeps them, and none are added.
    theirs = "-XX:TieredStopAtLevel=4 -Xshare:off"
    conf = [("spark.driver.extraJavaOptions", theirs)]
    assert _session_conf(conf)["spark.driver.extraJavaOptions"] == theirs


def test_a_command_moves_its_recorded_archive_in_even_when_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    finished: list[object] = []
    monkeypatch.setattr(class_archive, "finish", finished.append)

    def fails(args: argparse.Namespace) -> int:
        raise CheckpointError("no such checkpoint")

    with pytest.raises(CheckpointError):
        _finished(fails)(argparse.Namespace())
    assert finished == [class_archive.gateway_process()]
