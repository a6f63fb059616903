"""Specification of a host's scratch directories (``container/scratch.py``).

A container's JVM keeps its temporary files (RocksDB's native library, Spark's
local directories) in a directory of its own, marked with its owner, and a
container starting sweeps the directories of containers no longer running: a
killed container's files last until the next one starts on the host. The
in-process specs use real child processes as owners; the last kills a real
container-like process with its gateway JVM (about 6 s).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from spark_elastic.runtime.container.scratch import (
    ENV,
    OWNER,
    mark,
    owner_alive,
    scratch_root,
    sweep,
    with_scratch,
)

_SEES_EVERY_PROCESS = os.geteuid() == 0 and os.readlink("/proc/self/ns/pid") == "pid:[4026531836]"
"""Root in the host's initial PID namespace: what tells a namespace with no process left."""


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "scratch"
    monkeypatch.setenv(ENV, str(directory))
    for name in ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS"):
        monkeypatch.delenv(name, raising=False)
    return directory


def _start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _exited_owner() -> tuple[int, int]:
    """The PID and start time of a real process that has exited and been reaped."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    start = _start_time(child.pid)
    assert child.stdin is not None
    child.stdin.close()
    child.wait(30)
    return child.pid, start


def _owned_by(directory: Path, owner: str) -> Path:
    directory.mkdir(parents=True)
    (directory / OWNER).write_text(owner)
    (directory / "librocksdbjni.so").write_bytes(b"library")
    return directory


def test_the_root_is_in_the_systems_temporary_directory_unless_the_environment_says() -> None:
    assert scratch_root({}) == Path(tempfile.gettempdir()) / "spark-elastic-scratch"
    assert scratch_root({ENV: " /data/scratch "}) == Path("/data/scratch")


def test_a_directory_is_its_owners_while_that_very_process_runs(root: Path) -> None:
    me, (pid, start) = os.getpid(), _exited_owner()
    ns = os.readlink("/proc/self/ns/pid")
    assert owner_alive(mark(root / "mine")) is True
    assert (root / "mine" / OWNER).read_text() == f"{me} {_start_time(me)} {ns}\n"
    assert owner_alive(_owned_by(root / "exited", f"{pid} {start} {ns}")) is False
    # A PID another process has taken since: its start time differs.
    assert owner_alive(_owned_by(root / "reused", f"{me} {_start_time(me) + 1} {ns}")) is False
    # A PID namespace no process is in any more (a "host" of the namespaces launcher gone):
    # only root in the initial namespace sees that; elsewhere it is never taken for dead.
    gone = _owned_by(root / "host-gone", f"1 {start} pid:[1]")
    assert owner_alive(gone) is not _SEES_EVERY_PROCESS
    # A mark of a PID alone (written before start times were): alive while the PID is.
    assert owner_alive(_owned_by(root / "old-live", f"{me}")) is True
    assert owner_alive(_owned_by(root / "old-exited", f"{pid}")) is False
    assert owner_alive(root) is None  # no mark: not known to be anyone's
    assert owner_alive(_owned_by(root / "garbled", "pid")) is None


def test_a_sweep_deletes_only_the_directories_of_owners_no_longer_running(root: Path) -> None:
    me, (pid, start) = os.getpid(), _exited_owner()
    ns = os.readlink("/proc/self/ns/pid")
    dead = _owned_by(root / "jvm-c-1-1", f"{pid} {start} {ns}")
    live = _owned_by(root / "jvm-c-2-2", f"{me} {_start_time(me)} {ns}")
    elsewhere = _owned_by(root / "jvm-c-3-1", f"{pid} {start} pid:[1]")  # a namespace gone
    unmarked = root / "someone-else"
    unmarked.mkdir()

    assert sweep(root) == ([dead, elsewhere] if _SEES_EVERY_PROCESS else [dead])
    assert not dead.exists()
    assert elsewhere.exists() is not _SEES_EVERY_PROCESS
    assert live.is_dir()
    assert unmarked.is_dir()
    assert sweep(root) == []
    assert sweep(root / "absent") == []


def test_a_container_jvm_gets_a_marked_directory_of_its_own_after_the_jobs_options(
    root: Path,
) -> None:
    conf = with_scratch({"spark.driver.extraJavaOptions": "-Xss16m", "k": "v"}, "job/c 7")
    again = with_scratch({}, "job/c 7")

    (mine,) = (p for p in root.iterdir() if str(p) in conf["spark.driver.extraJavaOptions"])
    assert mine.name.startswith("jvm-job_c_7-")
    assert conf == {"spark.driver.extraJavaOptions": f"-Xss16m -Djava.io.tmpdir={mine}", "k": "v"}
    assert owner_alive(mine) is True
    assert again["spark.driver.extraJavaOptions"] != f"-Djava.io.tmpdir={mine}", "one each"


@pytest.mark.parametrize(
    "where", ["spark.driver.extraJavaOptions", "SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS"]
)
def test_a_jobs_own_temporary_directory_wins_and_nothing_is_added(
    root: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    theirs = "-Djava.io.tmpdir=/data/tmp"
    conf = {where: theirs} if where.startswith("spark.") else {}
    if not where.startswith("spark."):
        monkeypatch.setenv(where, theirs)
    assert with_scratch(conf, "c-1") == conf
    assert not root.exists()


def test_a_root_that_cannot_be_made_or_named_leaves_the_jvm_as_it_was(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = root.parent / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(ENV, str(blocker / "scratch"))
    assert with_scratch({"a": "b"}, "c-1") == {"a": "b"}
    assert f"{blocker / 'scratch'} is not writable" in capsys.readouterr().err

    monkeypatch.setenv(ENV, str(root.parent / "with space"))
    assert with_scratch({"a": "b"}, "c-1") == {"a": "b"}
    assert "white space" in capsys.readouterr().err
    assert not (root.parent / "with space").exists()


def test_an_owner_in_a_pid_namespace_of_its_own_is_alive_while_anything_runs_there(
    root: Path,
) -> None:
    # A "host" of the namespaces launcher: its container is PID 1 of a process table of its
    # own, so its PID and start time say nothing here; its namespace does.
    if shutil.which("unshare") is None or not _SEES_EVERY_PROCESS:
        pytest.skip("needs unshare and root in the initial PID namespace, as the launcher has")
    host = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "sleep", "60"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        namespace = ""
        while not namespace and time.monotonic() < deadline:
            for child in Path(f"/proc/{host.pid}/task/{host.pid}/children").read_text().split():
                namespace = os.readlink(f"/proc/{child}/ns/pid")
            time.sleep(0.05)
        assert namespace.startswith("pid:[")
        assert namespace != os.readlink("/proc/self/ns/pid")
        theirs = _owned_by(root / "jvm-c-1-x", f"1 12345 {namespace}")
        assert owner_alive(theirs) is True
        assert sweep(root) == []
    finally:
        os.killpg(host.pid, signal.SIGKILL)
        host.wait(30)
    deadline = time.monotonic() + 10
    while owner_alive(theirs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sweep(root) == [theirs]


_CONTAINER = """
import sys
from pyspark import SparkConf
from pyspark.java_gateway import launch_gateway
from spark_elastic.runtime.container.scratch import with_scratch

options = with_scratch({}, "c-1")["spark.driver.extraJavaOptions"]
conf = SparkConf(loadDefaults=False).set("spark.driver.extraJavaOptions", options)
gateway = launch_gateway(conf)
gateway.jvm.org.rocksdb.RocksDB.loadLibrary()
print(gateway.proc.pid, gateway.jvm.java.lang.System.getProperty("java.io.tmpdir"), flush=True)
sys.stdin.read()
"""


def test_a_killed_containers_jvm_files_are_swept_when_the_next_container_starts(
    root: Path,
) -> None:
    container = subprocess.Popen(
        [sys.executable, "-c", _CONTAINER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert container.stdout is not None
        jvm, tmpdir = container.stdout.readline().decode().split()
        scratch = Path(tmpdir)
        assert scratch.parent == root
        assert list(scratch.glob("librocksdbjni*.so")), list(scratch.iterdir())
    finally:
        os.killpg(container.pid, signal.SIGKILL)  # the container and its JVM, as a fence does
        container.wait(30)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{jvm}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)

    assert sweep() == [scratch]  # as the next container starts

    assert not scratch.exists()
