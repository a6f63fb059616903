"""A job is defined in Python and loaded by name; a bad definition is one clear line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from spark_elastic.errors import ArgumentError, ArgumentTypeError, JobDefinitionError
from spark_elastic.runtime.inputs import KafkaInput, LogInput
from spark_elastic.runtime.job import Job, load_job
from spark_elastic.runtime.sinks import ParquetSink

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "jobs" / "click_counts.py"


def identity(df: object) -> object:
    return df


def make_job(**changes: object) -> Job:
    fields: dict[str, object] = {
        "name": "clicks",
        "input": LogInput("/data/log", ("clicks",)),
        "elasticity_factor": 4,
        "checkpoint_root": "/data/cp",
        "sink": ParquetSink("/data/out"),
        "transform": identity,
    }
    return Job(**{**fields, **changes})  # type: ignore[arg-type]


def test_the_example_job_loads_by_file_and_attribute() -> None:
    job = load_job(f"{EXAMPLE}:job")
    assert job.name == "clicks"
    assert job.stateful
    assert job.plan({"clicks": 4}).task_count == 16


def test_the_attribute_defaults_to_job() -> None:
    assert load_job(str(EXAMPLE)).name == "clicks"


def test_a_job_loads_by_module_and_attribute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_jobs.py").write_text(
        "from spark_elastic import Job, LogInput, ParquetSink\n"
        "counts = Job(name='c', input=LogInput('/l', ('t',)), elasticity_factor=2,\n"
        "             checkpoint_root='/cp', sink=ParquetSink('/o'), transform=lambda df: df)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert load_job("my_jobs:counts").name == "c"
    finally:
        sys.modules.pop("my_jobs", None)


@pytest.mark.parametrize(
    ("source", "attribute", "message"),
    [
        ("raise RuntimeError('boom')\n", "job", "failed to import: RuntimeError: boom"),
        ("x = 1\n", "job", "has no attribute 'job'"),
        ("job = 42\n", "job", "expected a spark_elastic Job, found int"),
        ("import no_such_module_here\n", "job", "No module named 'no_such_module_here'"),
    ],
)
def test_a_job_that_cannot_be_loaded_is_one_line(
    tmp_path: Path, source: str, attribute: str, message: str
) -> None:
    path = tmp_path / "broken.py"
    path.write_text(source)
    with pytest.raises(JobDefinitionError, match=message) as info:
        load_job(f"{path}:{attribute}")
    assert "\n" not in str(info.value)


def test_a_missing_file_or_module_is_named() -> None:
    with pytest.raises(JobDefinitionError, match="no such file"):
        load_job("/nowhere/jobs.py:job")
    with pytest.raises(JobDefinitionError, match="no module named 'nowhere_jobs'"):
        load_job("nowhere_jobs:job")


def test_a_job_needs_exactly_one_kind_of_logic() -> None:
    with pytest.raises(
        ArgumentError, match="exactly one of a stateless transform and a TaskProcessor"
    ):
        make_job(transform=None)


def test_the_order_is_offset_timestamp_or_the_default() -> None:
    assert make_job().order is None  # by timestamp for several topics, by offset for one
    assert make_job(order="timestamp").order == "timestamp"
    with pytest.raises(ArgumentError, match=r"Job.order: .*'time'.*'offset', 'timestamp'"):
        make_job(order="time")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_task_idle_ms": -1}, r"Job.max_task_idle_ms: expected a non-negative .* found -1"),
        ({"bootstrap": "profiles"}, r"Job.bootstrap: expected a sequence of input topic names"),
        ({"max_task_idle_ms": 100}, r"Job.max_task_idle_ms/bootstrap: expected a TaskProcessor"),
        (
            {"max_task_idle_ms": 100, "processor": "held", "order": "offset"},
            r"Job.order: expected 'timestamp' .*above 0.* reads 2\), found 'offset'",
        ),
        (
            {"max_task_idle_ms": 100, "processor": "held", "input": "one topic"},
            r"Job.order: expected 'timestamp' .* the job reads 1\), found None",
        ),
        (
            {"bootstrap": ["users"], "processor": "held"},
            r"Job.bootstrap: expected input topics of the job \['clicks', 'profiles'\]",
        ),
        (
            {"bootstrap": ["clicks", "profiles"], "processor": "held"},
            r"Job.bootstrap: expected some but not all input topics",
        ),
    ],
    ids=["negative", "string", "stateless", "offset", "one-topic", "unknown", "every-input"],
)
def test_holding_records_back_is_refused_where_a_job_cannot_do_it(
    changes: dict[str, object], message: str
) -> None:
    from enrichment import example_processor

    changes = dict(changes)
    if changes.pop("processor", None):
        changes.update(transform=None, processor=example_processor())
    changes["input"] = LogInput(
        "/data/log", ("clicks",) if changes.pop("input", None) else ("clicks", "profiles")
    )
    with pytest.raises((ArgumentError, ArgumentTypeError), match=message):
        make_job(**changes)
    ok = make_job(
        input=LogInput("/data/log", ("clicks", "profiles")),
        transform=None,
        processor=example_processor(),
        max_task_idle_ms=100,
        bootstrap=["profiles"],
    )
    assert ok.holds_back
    assert ok.bootstrap == ("profiles",)


@pytest.mark.parametrize("factor", [3, 0, 2048])
def test_the_factor_is_a_power_of_two_up_to_1024(factor: int) -> None:
    with pytest.raises(ArgumentError):
        make_job(elasticity_factor=factor)


def test_checkpoint_roots_are_local_paths_or_uris_of_file_systems_that_create_if_absent() -> None:
    assert make_job(checkpoint_root="file:///data/cp").checkpoint_root == "/data/cp"
    assert make_job(checkpoint_root="s3a://bucket/cp/").checkpoint_root == "s3a://bucket/cp"
    assert make_job(checkpoint_root="hdfs://nn:8020/cp").checkpoint_root == "hdfs://nn:8020/cp"
    with pytest.raises(ArgumentError) as refused:
        make_job(checkpoint_root="s3://bucket/cp")
    assert str(refused.value) == (
        "Job.checkpoint_root: expected a local path or a URI of a file system that can create "
        "a file only if absent (abfs:, abfss:, file:, gs:, hdfs:, s3a:, viewfs:), found "
        "'s3://bucket/cp'"
    )


def test_a_parquet_sink_is_on_a_file_system_that_can_publish_without_overwriting() -> None:
    assert ParquetSink("hdfs://nn:8020/out").path == "hdfs://nn:8020/out"
    assert ParquetSink("s3a://bucket/out").path == "s3a://bucket/out"
    assert ParquetSink("file:///data/out").path == "file:///data/out"
    with pytest.raises(ArgumentError) as refused:
        ParquetSink("ftp://host/out")
    assert str(refused.value) == (
        "ParquetSink.path: expected a local path or a URI of a file system that can create a "
        "file only if absent (abfs:, abfss:, file:, gs:, hdfs:, s3a:, viewfs:), found "
        "'ftp://host/out'"
    )


def test_a_sink_must_have_write() -> None:
    with pytest.raises(ArgumentTypeError, match=r"Job\.sink: expected a Sink"):
        make_job(sink="/data/out")


def test_a_job_reads_the_embedded_log_or_kafka_and_nothing_else() -> None:
    kafka = KafkaInput("127.0.0.1:9092", ("clicks",), max_records_per_batch=500)
    assert make_job(input=kafka).input is kafka
    with pytest.raises(ArgumentTypeError, match=r"Job\.input: expected a LogInput or KafkaInput"):
        make_job(input="/data/log")
