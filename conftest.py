"""Test-suite wide fixtures: one local SparkSession for the whole run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] SparkSession shared by every test (Spark takes ~10 s to start)."""
    from spark_elastic._session import local_session

    session = local_session("spark-elastic-tests")
    yield session
    session.stop()
