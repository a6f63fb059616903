"""Java options of the Spark applications the tests start, as measured on 2 cores.

The suite is CPU-bound: two workers and the containers they launch share two
cores, so every CPU-second a JVM spends compiling or collecting is one the
specs wait for.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / ".cache" / "cds" / "spark.jsa"
"""The class-data archive of Spark's classes that ``make cds`` (tests/cds.py) makes.

Its class path must match theirs, and may hold no directory that is not empty: so the
specs pass their default Java options in ``SPARK_SUBMIT_OPTS`` rather than a
``SPARK_CONF_DIR`` of their own, which Spark would put on the class path."""

ARCHIVE_OPTIONS = (
    # The JVM's own warnings (one says so when it cannot use the archive) go to stderr, not
    # into the stdout of the CLI commands the specs read.
    f"-XX:SharedArchiveFile={ARCHIVE} -Xlog:disable -Xlog:all=warning:stderr"
    if ARCHIVE.is_file() and not any(c.isspace() for c in str(ARCHIVE))  # options split there
    else ""
)
"""Map Spark's classes from the archive, when there is one: a session and its first query
took 8 to 10 CPU-seconds instead of 16 to 18 (tests/cds.py)."""

TEST_JAVA_OPTIONS = f"-Xss16m -XX:TieredStopAtLevel=1 {ARCHIVE_OPTIONS}".strip()
"""The test session's JVM runs short Spark jobs: the C1 compiler alone compiles less and
gets them going sooner (about 12% off a file of Spark specs). The serial collector saved
nothing there (`tests/state/test_stateful_rescale.py`: 258 and 259 CPU-seconds)."""

SHORT_LIVED_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Spark applications that live a few minutes and mostly start up: C1 alone and the serial
collector took the autoscaler's end-to-end spec from 296 to 198 CPU-seconds (190 s to
148 s). Not for production: C1 alone made long-running queries about 15% slower in the
benchmarks, which keep Spark's defaults. conftest.py puts them (with the archive's) in
``SPARK_SUBMIT_OPTS``, which Spark's launcher puts before a driver's extraJavaOptions, for
every process the specs start: CLI commands, the example, Spark Connect servers."""

SHORT_LIVED_OPTIONS = f"{SHORT_LIVED_JAVA_OPTIONS} {ARCHIVE_OPTIONS}".strip()
"""Those options and the archive's."""

CONTAINER_JAVA_OPTIONS = f"-Xss16m {SHORT_LIVED_OPTIONS}"
"""Containers in end-to-end specs: short-lived, and their stateful queries need the stack."""

CONTAINER_CONF = (
    # One core each: two workers' stories run up to eight containers on the 2 cores, and
    # each container on local[2] ran two Python state workers side by side. Alone, the
    # stateful story took 520 s instead of 593 (its live changes 53-99 s, from 62-118).
    *("--master", "local[1]"),
    "--conf",
    f"spark.driver.extraJavaOptions={CONTAINER_JAVA_OPTIONS}",
    "--conf",
    f"spark.executor.extraJavaOptions={CONTAINER_JAVA_OPTIONS}",
)
"""``job run`` options giving every container one local core (a spec's own ``--master``
after them wins) and those Java options (to a cluster's executors too)."""
