"""A job whose tasks see two streams in time order (#26): end to end, real processes.

``spark-elastic job run`` of the example two-stream job
(``examples/jobs/enriched_clicks.py``: each click with its user's latest
profile, its tasks holding records back until their other partition catches
up in time or has been idle), on the embedded log, through a stream running
dry, a failover and a move. The published rows are compared, row for row,
with a single pass over the same records in time order: every click once,
with the profile its user had at click time.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import enrichment
import pytest
from cli_runner import run_cli
from jobs import APPLY_DEADLINE_S, CHANGE_DEADLINE_S, ROOT, RunningJob, published_rows, wait_until

from spark_elastic import EmbeddedLog
from spark_elastic.runtime.sinks import DATA_DIR

# Long (`make test-all`): the time-ordered job's story; `make test` runs its pieces
# (test_time_order.py, test_hold_back.py, the held records of test_exactly_once.py).
pytestmark = [pytest.mark.slow, pytest.mark.long]

ENRICH_JOB = f"{ROOT / 'examples' / 'jobs' / 'enriched_clicks.py'}:job"


@pytest.fixture
def clicks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example job's root: its log of clicks and profiles, 2 partitions each (the
    click-count job's log is not made)."""
    monkeypatch.setenv("ENRICH_ROOT", str(tmp_path))
    monkeypatch.setenv("ENRICH_IDLE_MS", "20000")
    enrichment.new_log(tmp_path / "log")
    return tmp_path


def enriched(out: Path, container: str = "*") -> list[tuple[str, int, int, str]]:
    """Every click row published (by ``container``), sorted, without the end markers; a
    click published twice shows twice."""
    rows = published_rows(out, ("user", "click_offset", "partition", "profile"), container)
    return sorted(r for r in rows if not r[0].startswith("~end"))


def enriched_since(out: Path, earlier: set[str]) -> list[tuple[str, int, int, str]]:
    """What :func:`enriched` returns of the containers not in ``earlier``."""
    names = {d.name.partition("=")[2] for d in (out / DATA_DIR).glob("container=*")} - earlier
    return sorted(row for name in names for row in enriched(out, name))


def read_to_the_end(job: RunningJob, container: str, ends: dict[int, int]) -> bool:
    """Whether ``container``'s tasks committed the clicks' partitions up to ``ends``: each
    of them has reported a commit (a container that never committed has no checkpoint to
    fork, and its tasks no offsets)."""
    tasks = [t for t in job.status()["tasks"] if t["container"] == container]
    read = [t["offsets"].get("clicks", {}) for t in tasks]
    return (
        bool(read)
        and all(read)
        and all(int(offset) >= ends[int(p)] for r in read for p, offset in r.items())
    )


def test_a_job_holding_records_back_in_time_order_fails_over_and_moves_each_click_once(
    start_job: Callable[..., RunningJob], clicks: Path
) -> None:
    log = EmbeddedLog(clicks / "log")
    rng = enrichment.seeded()
    records = enrichment.produce(log, rng, 150, 0)
    job = start_job(2, job=ENRICH_JOB)  # 2 partitions x factor 2: 4 tasks
    running = wait_until(
        "two running containers",
        lambda: len(job.running_containers()) == 2 and job.running_containers(),
    )
    out = clicks / "out"
    wait_until("a first batch published", lambda: enriched(out), APPLY_DEADLINE_S)

    # Every task's profiles deliver (a record of a key of no user's) and then run dry: the
    # clicks after them wait for the profiles' partitions, which have nothing later, until
    # the idle time (20 s) passes. A container is killed once its tasks have read (and
    # committed) those clicks, so it dies holding them. (Without the profiles' last
    # delivery, a partition idle since the start would let the clicks go on at once.)
    victim, victim_pid = min(running.items())
    victim_tasks = next(
        c["tasks"] for c in job.job_model()["containers"] if c["containerId"] == victim
    )
    enrichment.every_task(log, 2, "~awake", enrichment.START + 10 * 150, ("profiles",))
    dry = enrichment.produce(log, rng, 30, 151, only="clicks")
    records += dry
    ends = log.end_offsets("clicks")
    wait_until(
        "the clicks read by the container to kill",
        lambda: read_to_the_end(job, victim, ends),
        APPLY_DEADLINE_S,
    )
    os.kill(victim_pid, signal.SIGKILL)
    held = {(user, offset, partition) for _, partition, offset, _, user, _ in dry}
    assert not held & {(u, o, p) for u, o, p, _ in enriched(out, victim)}

    # Its successor forks from its checkpoint, the held records with it, and once the idle
    # time has passed goes on without waiting (Kafka Streams' enforced processing),
    # counted on the status page and in `job status`.
    replacement = wait_until(
        "a new container forked from the killed one's checkpoint",
        lambda: next(
            (c for c in job.job_model()["containers"] if any(victim in s for s in c["sources"])),
            None,
        ),
    )
    assert set(replacement["tasks"]) == set(victim_tasks)
    # (By the successor, or by the successor's own if that one failed at start, as a Python
    # worker too slow to connect back on a loaded machine makes it: a container that did
    # not run at the kill.)
    wait_until(
        "the held clicks published by the killed container's successor",
        lambda: held & {(u, o, p) for u, o, p, _ in enriched_since(out, set(running))},
        APPLY_DEADLINE_S,
    )
    # Counted once the batch that published them is committed and reported.
    wait_until("records processed without waiting", lambda: job.status()["recordsEnforced"])
    status = run_cli("job", "status", job.url)
    assert "records processed without waiting (enforced): " in status.stdout, status.stdout
    records += enrichment.produce(log, rng, 150, 181)
    wait_until(
        "the killed container's tasks running again",
        lambda: any(
            set(c["tasks"]) == set(victim_tasks) and c["containerId"] in job.running_containers()
            for c in job.job_model()["containers"]
        ),
        APPLY_DEADLINE_S,
    )

    # A move, 2 -> 3 containers, while records arrive: the new owners take their tasks'
    # state (held records included) from the old owners, which go on until they hand over.
    scaled = run_cli("job", "scale", job.url, "--containers", "3")
    assert scaled.returncode == 0, scaled.stderr
    records += enrichment.produce(log, rng, 150, 331)
    wait_until(
        "three containers, the move done",
        lambda: (m := job.settled_model()) and len(m["containers"]) == 3,
        CHANGE_DEADLINE_S,
    )
    records += enrichment.produce(log, rng, 150, 481)
    enrichment.end_every_task(log, 2)

    expected = sorted(enrichment.reference(records))
    wait_until(
        f"all {len(expected)} clicks published",
        lambda: len(enriched(out)) >= len(expected),
        APPLY_DEADLINE_S,
    )
    assert enriched(out) == expected
