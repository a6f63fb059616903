"""`spark-elastic checkpoint show` and `spark-elastic rescale`, run as real subprocesses."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
from cli_runner import run_cli
from pyspark.sql import SparkSession
from test_stateful_rescale import Job


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=300)


@pytest.fixture(scope="module")
def stopped(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-checkpoint")
    job = Job(spark, root / "job", random.Random(3))
    job.produce(60)
    job.run(root / "cp", 2)
    return root / "cp"


def test_checkpoint_show_json_lists_every_bucket(stopped: Path) -> None:
    result = cli("checkpoint", "show", str(stopped), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["job"]["name"] == "running-count"
    assert report["lastBatchCommitted"] is True
    assert {b["virtualTask"] for b in report["buckets"]} == {
        f"Partition {p}_{b}_2" for p in range(2) for b in range(2)
    }
    for bucket in report["buckets"]:
        assert bucket["behind"] == bucket["committedOffset"] - bucket["nextOffset"]


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
