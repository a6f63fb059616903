"""Test-suite wide fixtures: one local SparkSession for the whole run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# Functions defined in test modules are pickled by reference (module `test_x`), so the
# Python workers Spark starts need the tests folder on their path too.
_TESTS = str(Path(__file__).parent / "tests")
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_TESTS, os.environ.get("PYTHONPATH", "")) if p
)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] SparkSession shared by every test (Spark takes ~10 s to start)."""
    from spark_elastic._session import local_session

    session = local_session("spark-elastic-tests")
    yield session
    session.stop()
