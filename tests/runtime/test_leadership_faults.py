"""Specification: leadership under faults in combination, seeded and randomized.

Two in-process coordinators of one job share a real PostgreSQL store, each
connecting as a role of its own: A leads, B stands by. Each step draws
faults at random from the seed: a coordinator pauses (it neither ticks nor
answers for a while, as a stopped process or a long GC), its store stops
answering it (its role may no longer log in, its session is ended), both
at once, and containers go quiet. Between faults the coordinators tick, the standby tries to lead,
containers heartbeat to whichever coordinator answers them, and every live
coordinator tries to write. Short leases on real clocks (the store's lease
is on the database's), so a run takes a few seconds.

Whatever the seed, three things hold:

1. **Fencing**: the store's writes, in commit order, come from epochs that
   never go down; a coordinator writes nothing once another has claimed
   the store.
2. **Nested leases**: every container lease a deposed leader granted had
   ended before its successor claimed the store.
3. **A new leader waits**: nothing is failed over by it before one store
   lease plus the margin after its claim.

A failing seed prints itself; add it to ``SEEDS`` as a spec of its own.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from postgresql_server import PostgreSQLServer

from conftest import FAKE_TASKS, FakeLauncher
from spark_elastic.errors import StoreError, StoreFencedError, StoreOwnedError
from spark_elastic.runtime.coordinator.standby import Standby
from spark_elastic.runtime.coordinator.stores.postgresql import PostgreSQLStore
from spark_elastic.runtime.coordinator.supervisor import JobShape, Supervisor
from spark_elastic.runtime.lease import LeaseTerms
from spark_elastic.runtime.protocol import Registration

SEEDS = [1, 2, pytest.param(3, marks=pytest.mark.long), pytest.param(4, marks=pytest.mark.long)]
"""Fixed seeds (failing seeds found by the random one go here, each a spec); ``make test``
runs the first two and a fresh one, ``make test-all`` all."""

STORE_LEASE_S = 0.6
TERMS = LeaseTerms(lease_s=0.25, margin_s=0.1, write_budget_s=0.05)
STEPS = 45


@dataclass
class Node:
    """One coordinator process, in-process: its store, its supervisor once it leads."""

    name: str
    url: str
    store: PostgreSQLStore
    supervisor: Supervisor | None = None
    claimed_at: float | None = None
    claimed_wall: float | None = None
    paused_until: int = -1
    cut_until: int = -1
    deposed: bool = False
    grants: list[float] = field(default_factory=list)
    """When each container lease it granted ends (monotonic)."""


@pytest.fixture
def roles(postgresql: PostgreSQLServer, pg_url: str) -> Callable[[str], str]:
    """``url_for(name)``: a login role of the coordinator ``name``, acting as the database's
    owner, so that each coordinator's store can be cut off alone."""
    database = pg_url.rsplit("/", 1)[1]
    owner = f"owner_{database}"
    with psycopg.connect(postgresql.url(), autocommit=True) as db:
        db.execute(f"CREATE ROLE {owner} NOLOGIN")
        db.execute(f'ALTER DATABASE "{database}" OWNER TO {owner}')

    def url_for(name: str) -> str:
        role = f"{name}_{database}"
        with psycopg.connect(postgresql.url(), autocommit=True) as db:
            db.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' IN ROLE {owner}")
            db.execute(f"ALTER ROLE {role} SET role TO {owner}")
        return f"postgresql://{role}:pw@127.0.0.1:{postgresql.port}/{database}"

    return url_for


def set_login(postgresql: PostgreSQLServer, url: str, allowed: bool) -> None:
    role = url.split("//", 1)[1].split(":", 1)[0]
    with psycopg.connect(postgresql.url(), autocommit=True) as db:
        db.execute(f"ALTER ROLE {role} {'LOGIN' if allowed else 'NOLOGIN'}")
        if not allowed:
            db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )


def lead(node: Node, tmp_path: Path, launcher: FakeLauncher) -> None:
    """``node`` (holding the store's claim) becomes the job's coordinator."""
    job = JobShape("clicks", "jobs.py:job", 2, {"clicks": 2}, FAKE_TASKS, str(tmp_path / "cp"))
    node.supervisor = Supervisor(job, node.store, launcher, node.url, 2, TERMS, startup_s=60)
    node.claimed_at, node.claimed_wall = time.monotonic(), time.time()


def run(seed: int, postgresql: PostgreSQLServer, url_for: Callable[[str], str], tmp: Path) -> None:
    rng = random.Random(seed)
    launcher = FakeLauncher()
    a = Node("a", "http://a:8470", PostgreSQLStore(url_for("a"), STORE_LEASE_S))
    b = Node("b", "http://b:8470", PostgreSQLStore(url_for("b"), STORE_LEASE_S))
    nodes = [a, b]
    silent: dict[str, int] = {}  # container id -> the step it speaks again
    try:
        a.store.claim(a.url)
        lead(a, tmp, launcher)
        standby = Standby(b.store, b.url)
        for step in range(STEPS):
            # Faults, drawn from the seed.
            for node in nodes:
                if node.cut_until == step:
                    set_login(postgresql, node.store.url, True)
                if rng.random() < 0.06 and node.paused_until < step:
                    node.paused_until = step + rng.randint(2, 12)
                if rng.random() < 0.05 and node.cut_until < step:
                    node.cut_until = step + rng.randint(2, 12)
                    set_login(postgresql, node.store.url, False)
            for process in launcher.processes.values():  # a container goes quiet a while
                if rng.random() < 0.04:
                    silent[process.container_id] = step + rng.randint(2, 10)
            time.sleep(rng.uniform(0.02, 0.12))
            for node in nodes:
                if node.deposed or node.paused_until >= step:
                    continue
                step_node(node, step, tmp, launcher, standby, rng, silent)
        # The end: everything answers again.
        for node in nodes:
            set_login(postgresql, node.store.url, True)
        took = "took over" if b.supervisor else "stood by"
        print(f"  b {took}; a deposed {a.deposed}; grants a {len(a.grants)}, b {len(b.grants)}")
    finally:
        for node in nodes:
            node.store.close()
    check(a, b, url_for("checker"))


def step_node(
    node: Node,
    step: int,
    tmp: Path,
    launcher: FakeLauncher,
    standby: Standby,
    rng: random.Random,
    silent: dict[str, int],
) -> None:
    supervisor = node.supervisor
    if supervisor is None:
        if standby.try_to_lead():
            lead(node, tmp, launcher)
        return
    # A coordinator back from a pause may answer a request (a write) before its next tick
    # renews its lease: the order of its work is drawn too.
    work = ["tick", "heartbeats", "probe"]
    rng.shuffle(work)
    if node.paused_until == step - 1:
        work.insert(0, "write")  # a report that waited out the pause lands first
    try:
        for what in work:
            if what == "tick":
                supervisor.tick()
            elif what == "heartbeats":
                heartbeats(node, supervisor, launcher, {c for c, s in silent.items() if s > step})
            elif what == "write" or rng.random() < 0.5:
                node.store.event("probe", node.name, f"epoch {node.store.epoch}")
    except StoreFencedError:
        node.deposed = True
    except (StoreError, StoreOwnedError):
        pass  # out of reach this step: it tries again at the next


def heartbeats(node: Node, supervisor: Supervisor, launcher: FakeLauncher, quiet: set[str]) -> None:
    """The containers heartbeat to it, but the ``quiet`` ones; each lease it grants is kept."""
    for number, process in enumerate(launcher.processes.values(), 50_000):
        record = supervisor.records.get(process.container_id)
        if not process.alive or record is None or process.container_id in quiet:
            continue
        if record.state == "launching":
            supervisor.register(Registration(process.container_id, number))
        sent = time.monotonic()
        reply = supervisor.heartbeat(process.container_id)
        if reply.alive and reply.lease_ms:
            node.grants.append(sent + reply.lease_ms / 1000)


def check(a: Node, b: Node, checker_url: str) -> None:
    with psycopg.connect(checker_url) as db:
        probes = db.execute("SELECT detail FROM events WHERE kind = 'probe' ORDER BY id").fetchall()
        failovers = db.execute(
            "SELECT at FROM events WHERE kind = 'failover' ORDER BY id"
        ).fetchall()
    epochs = [int(row[0].split()[1]) for row in probes]
    # 1. Fencing: epochs in commit order never go down.
    assert epochs == sorted(epochs), f"a deposed coordinator wrote after its successor: {epochs}"
    # 2. Nested leases: a successor's claim came after every lease its predecessor granted.
    if b.claimed_at is not None:
        late = [end for end in a.grants if end > b.claimed_at]
        assert not late, f"a granted leases past b's claim: {late}"
    # 3. A new leader waits one store lease plus the margin before it fails anything over
    # (and the old one writes nothing after the claim: 1.).
    if b.claimed_wall is not None:
        waited = b.claimed_wall + STORE_LEASE_S + TERMS.margin_s
        early = [at for (at,) in failovers if b.claimed_wall < at < waited]
        assert not early, f"b failed over {len(early)} containers before its wait"


@pytest.mark.parametrize("seed", SEEDS)
def test_leadership_holds_under_random_faults(
    seed: int, postgresql: PostgreSQLServer, roles: Callable[[str], str], tmp_path: Path
) -> None:
    print(f"leadership faults: seed {seed}")
    run(seed, postgresql, roles, tmp_path)


def test_leadership_holds_under_random_faults_of_a_fresh_seed(
    postgresql: PostgreSQLServer, roles: Callable[[str], str], tmp_path: Path
) -> None:
    seed = random.SystemRandom().randrange(1_000_000)
    print(f"leadership faults: seed {seed} (add it to SEEDS if this fails)")
    run(seed, postgresql, roles, tmp_path)
