"""Java options of the Spark applications the tests start, as measured on 2 cores.

The suite is CPU-bound: two workers and the containers they launch share two
cores, so every CPU-second a JVM spends compiling or collecting is one the
specs wait for.
"""

TEST_JAVA_OPTIONS = "-Xss16m -XX:TieredStopAtLevel=1"
"""The test session's JVM runs short Spark jobs: the C1 compiler alone compiles less and
gets them going sooner (about 12% off a file of Spark specs). The serial collector saved
nothing there (`tests/state/test_stateful_rescale.py`: 258 and 259 CPU-seconds)."""

SHORT_LIVED_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Spark applications that live a few minutes and mostly start up: C1 alone and the serial
collector took the autoscaler's end-to-end spec from 296 to 198 CPU-seconds (190 s to
148 s). Not for production: C1 alone made long-running queries about 15% slower in the
benchmarks, which keep Spark's defaults. conftest.py makes them Spark's default driver
options (``spark.driver.defaultJavaOptions`` in a ``SPARK_CONF_DIR`` of its own) for every
process the specs start: CLI commands, the example, Spark Connect servers."""

CONTAINER_JAVA_OPTIONS = f"-Xss16m {SHORT_LIVED_JAVA_OPTIONS}"
"""Containers in end-to-end specs: short-lived, and their stateful queries need the stack."""

CONTAINER_CONF = (
    "--conf",
    f"spark.driver.extraJavaOptions={CONTAINER_JAVA_OPTIONS}",
    "--conf",
    f"spark.executor.extraJavaOptions={CONTAINER_JAVA_OPTIONS}",
)
"""``job run`` options giving every container (and a cluster's executors) those options."""
