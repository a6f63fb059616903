"""Specification of a container JVM's compiler (``container/compiler.py``).

A container's JVM runs with C1 only unless its job chose a compiler, in its
Spark settings or in the environment the JVM reads; the last spec asks a
real gateway JVM started with those settings which level it stops at.
"""

from __future__ import annotations

import pytest

from spark_elastic.runtime.container.compiler import C1_ONLY, users_java_options, with_compiler

ENVIRONMENT = ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS")


@pytest.fixture(autouse=True)
def no_options_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite names its own compiler for every JVM it starts (tests/jvm.py).
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


def test_c1_only_comes_after_the_drivers_own_options_and_the_rest_is_kept() -> None:
    conf = {"spark.driver.extraJavaOptions": "-Xss16m", "spark.app.name": "x"}
    assert with_compiler(conf) == {
        "spark.driver.extraJavaOptions": f"-Xss16m {C1_ONLY}",
        "spark.app.name": "x",
    }
    assert with_compiler({}) == {"spark.driver.extraJavaOptions": C1_ONLY}
    assert conf["spark.driver.extraJavaOptions"] == "-Xss16m"  # a copy


@pytest.mark.parametrize(
    "choice",
    [
        "-XX:TieredStopAtLevel=4",
        "-XX:-TieredCompilation",
        "-XX:CompilationMode=high-only",
        "-Xint",
        "-Xcomp",
    ],
)
def test_a_job_that_chooses_a_compiler_keeps_its_choice(
    choice: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = {"spark.driver.extraJavaOptions": f"-Xss16m {choice}"}
    assert with_compiler(conf) == conf
    for name in ENVIRONMENT:
        with monkeypatch.context() as env:
            env.setenv(name, choice)
            assert with_compiler({}) == {}, name
            assert choice in users_java_options({})


def test_a_real_jvm_started_with_those_settings_stops_at_c1() -> None:
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    options = with_compiler({})["spark.driver.extraJavaOptions"]
    gateway = launch_gateway(
        SparkConf(loadDefaults=False).set("spark.driver.extraJavaOptions", options)
    )
    try:
        jvm = gateway.jvm  # type: ignore[attr-defined]
        bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
            jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
        )
        assert bean.getVMOption("TieredStopAtLevel").getValue() == "1"
    finally:
        gateway.close()  # type: ignore[attr-defined]
        gateway.proc.stdin.close()  # type: ignore[attr-defined]
        gateway.proc.wait(30)  # type: ignore[attr-defined]
