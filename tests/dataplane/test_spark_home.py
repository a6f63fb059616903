"""A local session's Python processes import pyspark compiled, not from Spark's zip.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python
process's path, and Python compiles what it imports from a zip each time.
A local session whose Python processes run the driver's interpreter starts
its JVM from a home of links without the zips; anything else keeps Spark's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyspark
import pytest

from spark_elastic.dataplane.spark_home import (
    build,
    homes_dir,
    is_local_or_standalone,
    launching,
    own_spark_home,
    runs_this_interpreter,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PYSPARK = Path(pyspark.__file__).parent
HERE = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def test_the_session_s_python_workers_import_the_installed_pyspark(spark: SparkSession) -> None:
    def where(batches: Iterator[object]) -> Iterator[object]:
        import pandas as pd

        loaded = sys.modules["pyspark"]
        for _ in batches:
            yield pd.DataFrame(
                {"file": [loaded.__file__], "loader": [type(loaded.__loader__).__name__]}
            )

    (row,) = spark.range(1).mapInPandas(where, "file string, loader string").collect()
    assert row.loader == "SourceFileLoader"
    assert row.file == pyspark.__file__
    home = spark.sparkContext._jvm.System.getenv("SPARK_HOME")  # type: ignore[union-attr]
    assert not (Path(home) / "python" / "lib" / "pyspark.zip").exists()


def test_the_home_links_everything_of_pyspark_s_but_its_zips(tmp_path: Path) -> None:
    home = build(PYSPARK, tmp_path)
    assert (home / "jars").resolve() == (PYSPARK / "jars").resolve()
    assert (home / "bin" / "spark-submit").is_file()
    lib = home / "python" / "lib"
    assert lib.is_dir()
    assert sorted(p.name for p in lib.iterdir()) == sorted(
        p.name
        for p in (PYSPARK / "python" / "lib").iterdir()
        if p.name != "pyspark.zip" and not p.name.startswith("py4j-")
    )
    assert sorted(p.name for p in home.iterdir()) == sorted(p.name for p in PYSPARK.iterdir())


def test_the_home_is_made_once_and_then_reused(tmp_path: Path) -> None:
    first = build(PYSPARK, tmp_path)
    marker = first / "python" / "made-first"
    marker.touch()
    assert build(PYSPARK, tmp_path) == first
    assert marker.exists()
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # nothing half-made beside it


def test_a_broken_home_is_not_reused(tmp_path: Path) -> None:
    first = build(PYSPARK, tmp_path)
    (first / "python" / "lib" / "pyspark.zip").symlink_to(
        PYSPARK / "python" / "lib" / "pyspark.zip"
    )
    with pytest.raises(OSError, match="does not fit"):
        build(PYSPARK, tmp_path)  # the caller then starts from Spark's own home
    assert [p.name for p in tmp_path.iterdir()] == [first.name]


def test_a_local_session_on_this_interpreter_gets_the_home(tmp_path: Path) -> None:
    env = {**HERE, "SPARK_HOME": str(PYSPARK), "SPARK_ELASTIC_SPARK_HOMES": str(tmp_path)}
    home = own_spark_home("local[2]", {}, env)
    assert home is not None
    assert Path(home).parent == tmp_path


@pytest.mark.parametrize(
    ("master", "conf", "change", "why"),
    [
        ("yarn", {}, {}, "YARN ships pyspark.zip to its executors"),
        ("k8s://https://h:6443", {}, {}, "Kubernetes runs images of its own"),
        ("local[2]", {"spark.pyspark.python": "/usr/bin/false"}, {}, "another interpreter"),
        ("local[2]", {}, {"PYSPARK_PYTHON": "/opt/other/python"}, "another interpreter"),
        ("local[2]", {}, {"SPARK_HOME": "/opt/spark"}, "a Spark distribution, not pip's"),
        ("local[2]", {}, {"SPARK_ELASTIC_SPARK_HOMES": "off"}, "turned off"),
    ],
)
def test_any_other_set_up_keeps_spark_s_own_home(
    tmp_path: Path, master: str, conf: dict[str, str], change: dict[str, str], why: str
) -> None:
    env = {**HERE, "SPARK_HOME": str(PYSPARK), "SPARK_ELASTIC_SPARK_HOMES": str(tmp_path)}
    assert own_spark_home(master, conf, {**env, **change}) is None, why


def test_without_an_interpreter_named_workers_run_python3_from_path(tmp_path: Path) -> None:
    env = {"SPARK_HOME": str(PYSPARK), "SPARK_ELASTIC_SPARK_HOMES": str(tmp_path)}
    python3 = runs_this_interpreter("python3", sys.executable)
    assert (own_spark_home("local", {}, env) is not None) == python3


def test_a_virtual_environment_s_python_is_not_the_system_s(tmp_path: Path) -> None:
    link = tmp_path / "python"
    link.symlink_to(os.path.realpath(sys.executable))
    assert runs_this_interpreter(sys.executable, sys.executable)
    assert not runs_this_interpreter(str(link), sys.executable)


def test_local_and_standalone_masters() -> None:
    assert all(
        is_local_or_standalone(m) for m in ("local", "local[*]", "local[4, 2]", "spark://h:7077")
    )
    assert not any(is_local_or_standalone(m) for m in ("localhost", "yarn", "k8s://h:6443"))


def test_spark_home_is_set_while_the_jvm_launches_and_restored_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPARK_HOME", "/before")
    with launching("/during"):
        assert os.environ["SPARK_HOME"] == "/during"
    assert os.environ["SPARK_HOME"] == "/before"
    monkeypatch.delenv("SPARK_HOME")
    with pytest.raises(RuntimeError), launching("/during"):
        raise RuntimeError
    assert "SPARK_HOME" not in os.environ
    with launching(None):
        assert "SPARK_HOME" not in os.environ


def test_the_homes_live_in_the_user_s_cache_unless_told(tmp_path: Path) -> None:
    assert (
        homes_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "spark-elastic" / "spark-homes"
    )
    assert homes_dir({"SPARK_ELASTIC_SPARK_HOMES": str(tmp_path)}) == tmp_path
    assert homes_dir({"SPARK_ELASTIC_SPARK_HOMES": "off"}) is None
