"""The job model and the messages between coordinator and containers: strict JSON both ways."""

from __future__ import annotations

from typing import Any

import pytest

from spark_elastic.errors import ProtocolError
from spark_elastic.runtime.protocol import (
    ContainerModel,
    HeartbeatReply,
    JobModel,
    ProgressReport,
    Registration,
    TaskProgress,
    validate_container_id,
)

MODEL = JobModel(
    version=7,
    job="clicks",
    elasticity_factor=2,
    partitions={"clicks": 2},
    containers=(
        ContainerModel("clicks-c1", ("Partition 0_0_2", "Partition 0_1_2"), 1, "/cp/000001"),
        ContainerModel("clicks-c4", ("Partition 1_0_2",), 4, "/cp/000004", ("/cp/000002",)),
    ),
)


def test_job_model_round_trips_through_json() -> None:
    assert JobModel.from_json(MODEL.to_json()) == MODEL
    assert MODEL.owner_of()["Partition 1_0_2"] == "clicks-c4"
    assert MODEL.container("clicks-c9") is None


def test_a_task_owned_by_two_containers_is_refused() -> None:
    document = MODEL.to_json()
    document["containers"][1]["tasks"].append("Partition 0_0_2")
    with pytest.raises(ProtocolError, match="owned by both 'clicks-c1' and 'clicks-c4'"):
        JobModel.from_json(document)


def test_warm_ups_round_trip_and_a_model_without_them_has_none() -> None:
    warming = JobModel(
        **{
            **MODEL.__dict__,
            "warmups": (
                ContainerModel("clicks-c5", ("Partition 0_0_4", "Partition 0_2_4"), 5, "/cp/5"),
            ),
        }
    )
    assert JobModel.from_json(warming.to_json()) == warming
    assert warming.warmup("clicks-c5") is not None
    assert warming.warmup("clicks-c1") is None
    stored_before = {k: v for k, v in MODEL.to_json().items() if k != "warmups"}
    assert JobModel.from_json(stored_before).warmups == ()
    twice = warming.to_json()
    twice["warmups"].append({**twice["warmups"][0], "containerId": "clicks-c6"})
    with pytest.raises(ProtocolError, match="warm-ups 'clicks-c5' and 'clicks-c6' both take"):
        JobModel.from_json(twice)
    same_id = warming.to_json()
    same_id["warmups"][0]["containerId"] = "clicks-c1"
    with pytest.raises(ProtocolError, match="container 'clicks-c1' appears twice"):
        JobModel.from_json(same_id)


def test_owners_stopping_for_a_move_round_trip_and_must_be_containers_of_the_model() -> None:
    stopping = JobModel(**{**MODEL.__dict__, "stopping": ("clicks-c1", "clicks-c4")})
    assert JobModel.from_json(stopping.to_json()) == stopping
    stored_before = {k: v for k, v in MODEL.to_json().items() if k != "stopping"}
    assert JobModel.from_json(stored_before).stopping == ()
    for bad in (["clicks-c9"], ["clicks-c4", "clicks-c1"], ["clicks-c1", "clicks-c1"], [1]):
        with pytest.raises(ProtocolError, match=r"jobModel\.stopping: expected sorted ids of "):
            JobModel.from_json({**MODEL.to_json(), "stopping": bad})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": -1}, "non-negative"),
        ({"version": True}, "expected an integer"),
        ({"extra": 1}, "unknown field 'extra'"),
        ({"partitions": {"clicks": 0}}, "count >= 1"),
        ({"containers": "c1"}, "expected a list"),
    ],
)
def test_malformed_job_models_are_one_line_naming_the_field(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ProtocolError, match=message) as info:
        JobModel.from_json({**MODEL.to_json(), **change})
    assert "\n" not in str(info.value)


def test_a_missing_field_is_named() -> None:
    document = MODEL.to_json()
    del document["job"]
    with pytest.raises(ProtocolError, match="missing field 'job'"):
        JobModel.from_json(document)


@pytest.mark.parametrize("bad", ["", "-x", "a b", "a/b", "x" * 129, 7, None, "é"])
def test_container_ids_are_url_and_file_safe(bad: object) -> None:
    with pytest.raises(ProtocolError, match="executionContainerId"):
        validate_container_id(bad)


def test_a_samza_heartbeat_reply_with_only_alive_parses() -> None:
    assert HeartbeatReply.from_json({"alive": False}) == HeartbeatReply(False)
    reply = HeartbeatReply(True, 10_000, 3)
    assert HeartbeatReply.from_json(reply.to_json()) == reply
    with pytest.raises(ProtocolError, match="true or false"):
        HeartbeatReply.from_json({"alive": 1})


def test_registration_and_progress_round_trip() -> None:
    registration = Registration("clicks-c1", 4242, "local-1700")
    assert Registration.from_json(registration.to_json()) == registration
    report = ProgressReport(
        "clicks-c1", 1, 12, 100, 50, (TaskProgress("Partition 0_0_2", {"clicks": {0: 88}}, 4),), 7
    )
    assert ProgressReport.from_json(report.to_json()) == report
    # A container of an earlier version says nothing of records processed without waiting.
    earlier = {k: v for k, v in report.to_json().items() if k != "recordsEnforced"}
    assert ProgressReport.from_json(earlier).records_enforced == 0
    with pytest.raises(ProtocolError, match="non-negative integer, found -1"):
        ProgressReport.from_json({**report.to_json(), "recordsEnforced": -1})
    timed = ProgressReport("clicks-c1", 1, 12, 100, 50, batch_duration_ms=640)
    assert ProgressReport.from_json(timed.to_json()) == timed
    refused = r"progress.batchDurationMs: expected a non-negative integer, found -5"
    with pytest.raises(ProtocolError, match=refused):
        ProgressReport.from_json({**timed.to_json(), "batchDurationMs": -5})


def test_progress_offsets_must_be_numbers() -> None:
    report = ProgressReport("c1", 0, 0, 0, 0, (TaskProgress("t", {"clicks": {0: 1}}),)).to_json()
    report["tasks"][0]["offsets"] = {"clicks": {"zero": 1}}
    with pytest.raises(ProtocolError, match="partition 'zero' is not a number"):
        ProgressReport.from_json(report)
    report["tasks"][0]["offsets"] = {"clicks": {"0": -5}}
    with pytest.raises(ProtocolError, match="offset >= 0"):
        ProgressReport.from_json(report)
