"""Specification of a container JVM's class archive (``container/class_archive.py``).

The first container of a host records its JVM's classes and later ones map
them; only a complete archive is ever put in place, one container records at
a time, and a job's own sharing options win. The in-process specs stand a
real child process in for the JVM (it writes its "archive" when its stdin
closes, as pyspark's gateway JVM exits and dumps then); the last runs two
real gateway JVMs, the first recording and the second mapping (about 5 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_elastic.runtime.container import class_archive
from spark_elastic.runtime.container.class_archive import (
    ENV,
    RETRY_S,
    STALE_S,
    archive_dir,
    archive_key,
    finish,
    java_options,
    with_class_archive,
)

JAVA = sys.executable  # any real file: the key reads its path and modification time


@pytest.fixture
def archives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "archives"
    monkeypatch.setenv(ENV, str(directory))
    # The suite's own archive (tests/cds.py) is named there for every JVM it starts.
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    yield directory
    class_archive._CURRENT.clear()


def _exits_writing(path: Path | None, code: int = 0) -> subprocess.Popen[bytes]:
    """A process that, as the gateway JVM does, exits when its stdin closes, writing
    ``path`` first (the archive a recording JVM writes at exit)."""
    script = (
        "import sys; sys.stdin.read(); "
        + (f"open({str(path)!r}, 'wb').write(b'classes'); " if path is not None else "")
        + f"sys.exit({code})"
    )
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)


def test_the_archives_live_in_the_users_cache_unless_the_environment_says_where_or_off() -> None:
    assert archive_dir({ENV: "off"}) is None
    assert archive_dir({ENV: " OFF "}) is None
    assert archive_dir({ENV: "/srv/archives"}) == Path("/srv/archives")
    assert archive_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/spark-elastic/class-archives")


def test_the_key_changes_with_the_jars_the_jvm_loads(tmp_path: Path) -> None:
    (tmp_path / "jars").mkdir()
    (tmp_path / "jars" / "spark-core.jar").write_bytes(b"")
    base = archive_key(JAVA, str(tmp_path), {})
    assert archive_key(JAVA, str(tmp_path), {}) == base
    assert archive_key(JAVA, str(tmp_path), {"spark.jars": "/k/kafka.jar"}) != base
    (tmp_path / "jars" / "hadoop.jar").write_bytes(b"")
    assert archive_key(JAVA, str(tmp_path), {}) != base


def test_the_first_container_records_and_a_second_meanwhile_runs_without(
    archives: Path, tmp_path: Path
) -> None:
    first = java_options(JAVA, str(tmp_path), {})
    assert first.startswith("-XX:ArchiveClassesAtExit=")
    recording = Path(first.split()[0].split("=", 1)[1])
    assert recording.parent == archives
    assert recording.name.endswith(f".{os.getpid()}.partial")
    # Another container of the host while the first records: no second recording.
    assert java_options(JAVA, str(tmp_path), {}) == ""


def test_the_archive_options_come_after_the_drivers_own_and_the_rest_is_kept(
    archives: Path,
) -> None:
    conf = {"spark.driver.extraJavaOptions": "-Xss16m", "spark.ui.enabled": "false"}
    out = with_class_archive(conf, JAVA)
    assert out["spark.ui.enabled"] == "false"
    assert out["spark.driver.extraJavaOptions"].startswith("-Xss16m -XX:ArchiveClassesAtExit=")
    assert conf["spark.driver.extraJavaOptions"] == "-Xss16m"  # the caller's is left as it was


def test_a_complete_archive_goes_into_place_and_the_next_container_maps_it(
    archives: Path, tmp_path: Path
) -> None:
    first = java_options(JAVA, str(tmp_path), {})
    recording = Path(first.split()[0].split("=", 1)[1])
    finish(_exits_writing(recording))
    final = archives / f"{archive_key(JAVA, str(tmp_path), {})}.jsa"
    assert final.read_bytes() == b"classes"
    assert sorted(p.name for p in archives.iterdir()) == [final.name]  # no claim, no partial
    second = java_options(JAVA, str(tmp_path), {})
    assert second.startswith(f"-XX:SharedArchiveFile={final} ")
    finish(None)  # a mapping container's exit leaves the archive as it is
    assert final.read_bytes() == b"classes"


def test_an_archive_whose_jvm_did_not_exit_cleanly_is_never_put_in_place(
    archives: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A JVM given a truncated archive crashes: only one its JVM finished with 0 is used.
    first = java_options(JAVA, str(tmp_path), {})
    recording = Path(first.split()[0].split("=", 1)[1])
    finish(_exits_writing(recording, code=1))
    key = archive_key(JAVA, str(tmp_path), {})
    assert [p.name for p in archives.iterdir()] == [f"{key}.failed"]
    # A set-up the JVM cannot archive would slow every start that records in vain: for a
    # day, containers run without, and say why.
    assert java_options(JAVA, str(tmp_path), {}) == ""
    assert "the last recording failed (the JVM exited with 1" in capsys.readouterr().err
    old = time.time() - RETRY_S - 1
    os.utime(archives / f"{key}.failed", (old, old))
    assert java_options(JAVA, str(tmp_path), {}).startswith("-XX:ArchiveClassesAtExit=")


def test_a_jvm_that_exits_cleanly_without_writing_an_archive_counts_as_a_failure(
    archives: Path, tmp_path: Path
) -> None:
    java_options(JAVA, str(tmp_path), {})
    finish(_exits_writing(None))
    key = archive_key(JAVA, str(tmp_path), {})
    assert "the JVM wrote no archive" in (archives / f"{key}.failed").read_text()
    assert java_options(JAVA, str(tmp_path), {}) == ""


def test_a_killed_recorders_claim_and_partial_archive_are_taken_over_when_stale(
    archives: Path, tmp_path: Path
) -> None:
    java_options(JAVA, str(tmp_path), {})
    class_archive._CURRENT.clear()  # the recorder was killed: it never finished
    key = archive_key(JAVA, str(tmp_path), {})
    partial = archives / f"{key}.99999.partial"
    partial.write_bytes(b"half")
    assert java_options(JAVA, str(tmp_path), {}) == ""  # its claim is fresh
    old = time.time() - STALE_S - 1
    os.utime(archives / f"{key}.recording", (old, old))
    os.utime(partial, (old, old))
    assert java_options(JAVA, str(tmp_path), {}).startswith("-XX:ArchiveClassesAtExit=")
    assert not partial.exists()


def test_a_job_that_sets_its_own_sharing_options_keeps_them_and_off_turns_it_off(
    archives: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for theirs in ("-XX:SharedArchiveFile=/a.jsa", "-Xshare:off", "-XX:ArchiveClassesAtExit=/b"):
        assert java_options(JAVA, str(tmp_path), {"spark.driver.extraJavaOptions": theirs}) == ""
    for variable in ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS"):
        with monkeypatch.context() as environment:
            environment.setenv(variable, "-Xss16m -XX:SharedArchiveFile=/suite.jsa")
            assert java_options(JAVA, str(tmp_path), {}) == ""
    monkeypatch.setenv(ENV, "off")
    assert java_options(JAVA, str(tmp_path), {}) == ""
    assert not archives.exists()


def test_an_unwritable_directory_is_said_and_the_container_runs_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(ENV, str(blocker / "archives"))
    assert java_options(JAVA, str(tmp_path), {}) == ""
    assert "no class archive:" in capsys.readouterr().err


def test_a_real_gateway_jvm_records_its_classes_and_the_next_one_maps_them(
    archives: Path,
) -> None:
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    from spark_elastic.dataplane.session import find_java

    spark_home = os.environ.get("SPARK_HOME") or str(Path(__import__("pyspark").__file__).parent)
    java = find_java()

    def gateway_with(options: str) -> object:
        conf = SparkConf(loadDefaults=False).set("spark.driver.extraJavaOptions", options)
        return launch_gateway(conf)

    recording = java_options(java, spark_home, {})
    assert recording.startswith("-XX:ArchiveClassesAtExit=")
    first = gateway_with(recording)
    first.jvm.java.lang.System.getProperty("java.version")  # type: ignore[attr-defined]
    first.close()  # type: ignore[attr-defined]
    finish(first.proc)  # type: ignore[attr-defined]
    final = archives / f"{archive_key(java, spark_home, {})}.jsa"
    assert final.stat().st_size > 1_000_000

    mapping = java_options(java, spark_home, {})
    assert mapping.startswith(f"-XX:SharedArchiveFile={final}")
    loads = archives.parent / "class-loads.txt"
    second = gateway_with(f"{mapping} -Xlog:class+load=info:file={loads}")
    try:
        second.jvm.java.lang.System.getProperty("java.version")  # type: ignore[attr-defined]
    finally:
        second.close()  # type: ignore[attr-defined]
        second.proc.stdin.close()  # type: ignore[attr-defined]
        second.proc.wait(30)  # type: ignore[attr-defined]
    # Spark's own classes came from the recorded archive (its "top" layer), not the jars
    # (lambdas' classes are made as they are first called, in either case).
    spark_lines = [
        line
        for line in loads.read_text().splitlines()
        if " org.apache.spark." in line and "$$Lambda" not in line
    ]
    assert spark_lines
    shared = [line for line in spark_lines if "source: shared objects file (top)" in line]
    others = [line for line in spark_lines if line not in shared]
    assert len(shared) > len(spark_lines) / 2, others[:5]
