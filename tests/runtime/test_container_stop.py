"""A container asked to stop finishes the micro-batch in flight before it stops its query.

Real Spark streaming queries in this process: a batch is held inside its
``foreachBatch`` (on the driver, so an event can hold it) while the stop
waits, and the batch itself checks that the stop is still waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from spark_elastic.runtime.container.run import _finish_batch


class Watched:
    """A streaming query whose ``status`` reads are counted (the stop's polls)."""

    def __init__(self, query: Any) -> None:
        self.query, self.polls = query, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.query, name)

    @property
    def status(self) -> dict[str, Any]:
        self.polls += 1
        return self.query.status  # type: ignore[no-any-return]


def wait_for(what: str, condition: Any, timeout: float = 60.0) -> None:
    done = threading.Event()
    deadline = threading.Timer(timeout, done.set)
    deadline.start()
    try:
        while not condition():
            if done.wait(0.02):
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
    finally:
        deadline.cancel()


@pytest.fixture
def held(spark: SparkSession, tmp_path: Path) -> Iterator[tuple[Watched, dict[str, Any]]]:
    """A query on Spark's rate source whose batch 1 waits until the spec lets it go."""
    state: dict[str, Any] = {
        "entered": threading.Event(),
        "go": threading.Event(),
        "stop_waiting": None,
    }
    stopper: dict[str, threading.Thread] = {}

    def write(batch: DataFrame, batch_id: int) -> None:
        # On the driver (a py4j callback), once per micro-batch.
        batch.count()
        if batch_id == 1:
            state["entered"].set()
            state["go"].wait(60)
            state["stop_waiting"] = stopper["thread"].is_alive()

    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 50)
        .load()
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="0.2 seconds")
        .start()
    )
    state["stopper"] = stopper
    try:
        yield Watched(query), state
    finally:
        state["go"].set()
        query.stop()


def test_the_stop_waits_for_the_batch_in_flight_to_commit(
    held: tuple[Watched, dict[str, Any]],
) -> None:
    query, state = held
    state["entered"].wait(60)
    assert state["entered"].is_set()
    stopper = threading.Thread(target=_finish_batch, args=(query, 60.0, threading.Event()))
    state["stopper"]["thread"] = stopper
    stopper.start()
    # The stop has looked at the query several times and is still waiting; the batch then
    # ends and sees it still waiting.
    wait_for("the stop's polls", lambda: query.polls >= 5)
    state["go"].set()
    stopper.join(60)
    assert state["stop_waiting"] is True
    assert not stopper.is_alive()
    assert query.lastProgress["batchId"] >= 1  # the held batch committed before the stop


def test_a_container_that_lost_its_lease_stops_at_once(
    held: tuple[Watched, dict[str, Any]],
) -> None:
    query, state = held
    state["entered"].wait(60)
    lost = threading.Event()
    lost.set()
    _finish_batch(query, 60.0, lost)  # fenced: its batch could not commit anyway
    assert query.polls == 0
