"""A new checkpoint generation starts from the old one's committed prefix, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from key_counts import counts, produce
from pyspark.sql import SparkSession

from spark_elastic import EmbeddedLog
from spark_elastic.errors import CheckpointError
from spark_elastic.runtime.container.generations import fork_committed, last_committed_batch

LAYOUT = [
    "metadata",
    ".metadata.crc",
    "sources/0/0",
    *(f"offsets/{n}" for n in range(4)),
    *(f"offsets/.{n}.crc" for n in range(4)),
    *(f"commits/{n}" for n in range(3)),
    *(f"state/0/{p}/{v}.zip" for p in range(2) for v in range(1, 5)),
    "state/0/0/4.changelog",
    "state/0/0/SSTs/000009-abc.sst",
    "state/0/_metadata/v2/0",
    "state/0/_metadata/v2/3",
    "state/0/_stateSchema/default/0_aa",
    "state/0/_stateSchema/default/3_bb",
    "_spark_elastic/job.json",
    "_spark_elastic/owner.lock",
    "_spark_elastic/seed/part-0.parquet",
]


AFTER_BATCH_2 = {
    "state/0/0/4.zip",  # the state after batch 3, and batch 3's state metadata
    "state/0/1/4.zip",
    "state/0/0/4.changelog",
    "state/0/_metadata/v2/3",
    "state/0/_stateSchema/default/3_bb",
    "_spark_elastic/owner.lock",  # the old owner's, never the new one's
}
"""What a fork of :data:`LAYOUT` (last committed batch 2) never copies."""


def make_layout(root: Path) -> None:
    for name in LAYOUT:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_a_fork_keeps_the_committed_prefix_only(tmp_path: Path) -> None:
    make_layout(tmp_path / "old")
    result = fork_committed(tmp_path / "old", tmp_path / "new")
    assert result.last_committed == 2
    left_behind = files(tmp_path / "old") - files(tmp_path / "new")
    assert left_behind == {
        "offsets/3",  # planned but never committed: the fork plans batch 3 afresh
        "offsets/.3.crc",
        "state/0/0/4.zip",  # state after batch 3
        "state/0/1/4.zip",
        "state/0/0/4.changelog",
        "state/0/_metadata/v2/3",
        "state/0/_stateSchema/default/3_bb",
        "_spark_elastic/owner.lock",  # the old owner's, never the new one's
    }
    assert (tmp_path / "new" / "state/0/0/3.zip").read_text() == "state/0/0/3.zip"
    assert not list(tmp_path.glob(".*forking"))


def test_a_reopened_fork_runs_the_batch_its_source_planned_and_never_committed(
    tmp_path: Path,
) -> None:
    # A holding job's fork: its query must run a batch at once (Spark plans batches without
    # new records only after a batch of the same run), or the idle waits of what its tasks
    # hold would never end. The in-flight batch is the one Spark itself would run again.
    make_layout(tmp_path / "old")
    result = fork_committed(tmp_path / "old", tmp_path / "new", reopen_last=True)
    assert result.last_committed == 2
    assert files(tmp_path / "old") - files(tmp_path / "new") == AFTER_BATCH_2
    assert last_committed_batch(tmp_path / "new") == 2


def test_a_reopened_fork_of_a_source_with_all_committed_leaves_its_last_commit_behind(
    tmp_path: Path,
) -> None:
    make_layout(tmp_path / "old")
    for name in ("offsets/3", "offsets/.3.crc"):
        (tmp_path / "old" / name).unlink()
    result = fork_committed(tmp_path / "old", tmp_path / "new", reopen_last=True)
    assert result.last_committed == 2
    assert files(tmp_path / "old") - files(tmp_path / "new") == {
        "commits/2",  # batch 2 runs again
        *AFTER_BATCH_2,
    }
    assert last_committed_batch(tmp_path / "new") == 1

    # Its successor died before committing (a failure at start): the next fork runs the
    # same batch again, it does not walk back one batch per fork.
    again = fork_committed(tmp_path / "new", tmp_path / "newer", reopen_last=True)
    assert again.last_committed == 1
    assert files(tmp_path / "new") - files(tmp_path / "newer") == {
        "state/0/0/3.zip",  # state after batch 2, which runs again from the state after 1
        "state/0/1/3.zip",
    }
    assert last_committed_batch(tmp_path / "newer") == 1


def test_a_fork_never_overwrites_and_needs_a_checkpoint(tmp_path: Path) -> None:
    make_layout(tmp_path / "old")
    (tmp_path / "new").mkdir()
    with pytest.raises(CheckpointError, match="exists already"):
        fork_committed(tmp_path / "old", tmp_path / "new")
    with pytest.raises(CheckpointError, match="is not a checkpoint directory"):
        fork_committed(tmp_path / "new", tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_a_checkpoint_that_never_committed_forks_to_a_fresh_start(tmp_path: Path) -> None:
    (tmp_path / "old" / "offsets").mkdir(parents=True)
    (tmp_path / "old" / "metadata").write_text("{}")
    (tmp_path / "old" / "offsets" / "0").write_text("v1")
    assert fork_committed(tmp_path / "old", tmp_path / "new").last_committed == -1
    assert files(tmp_path / "new") == {"metadata"}


@pytest.fixture
def log(tmp_path: Path) -> EmbeddedLog:
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("clicks", 2)
    return log


def run(spark: SparkSession, log: EmbeddedLog, checkpoint: Path) -> list[tuple[str, int]]:
    emitted: list[tuple[str, int]] = []
    query = (
        counts(spark, log, checkpoint)
        .writeStream.foreachBatch(
            lambda batch, _: emitted.extend((r.key, r.n) for r in batch.collect())
        )
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return emitted


@pytest.mark.slow
@pytest.mark.long  # `make test-all`; the stories' failovers resume forks
def test_a_query_resumed_from_a_fork_applies_every_record_once(
    spark: SparkSession, log: EmbeddedLog, tmp_path: Path
) -> None:
    produce(log, 0, 100)
    first = run(spark, log, tmp_path / "gen-1")
    # The old owner died after planning a batch it never committed: its last commit goes, as
    # after a kill -9 between offsets/N and commits/N.
    last = last_committed_batch(tmp_path / "gen-1")
    (tmp_path / "gen-1" / "commits" / str(last)).unlink()
    replayed = {(k, n) for k, n in first}  # what the old owner may already have written
    produce(log, 100, 60)
    fork_committed(tmp_path / "gen-1", tmp_path / "gen-2")
    second = run(spark, log, tmp_path / "gen-2")
    final: dict[str, int] = {}
    for key, n in first + second:
        final[key] = max(final.get(key, 0), n)
    expected = pd.Series([f"user-{i % 13}" for i in range(160)]).value_counts().to_dict()
    assert final == expected
    # Each key's counts, old owner's and new owner's together, are 1..n with no gap; the new
    # owner starts from the last commit's state, so it only repeats what the batch it replays
    # had emitted (at-least-once output), never a count the state had not reached.
    for key, n in final.items():
        assert {m for k, m in first + second if k == key} == set(range(1, n + 1))
    assert {(k, n) for k, n in second} - replayed, "the fork processed nothing new"
