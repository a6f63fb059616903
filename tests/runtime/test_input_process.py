"""The coordinator's calls to its input run in a child process it restarts: a C library's
abort in the client (librdkafka's, on a broker restart) is a failed call, never a dead
coordinator.

Real child processes, a stand-in input (``crashing_input.py``) that aborts or hangs on
demand; ``test_kafka_outage.py`` kills a real broker under the coordinator's cadence.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from crashing_input import CrashingInput
from standins import alive, wait_until

from spark_elastic.errors import InputError
from spark_elastic.runtime.coordinator.input_process import InputProcess


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[InputProcess]:
    """An input process over :class:`CrashingInput`, closed after the spec."""
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    process = InputProcess(CrashingInput(), call_s=3.0)
    try:
        yield process
    finally:
        process.close()


def test_calls_run_in_one_long_lived_child_and_return_what_the_input_returns(
    calls: InputProcess,
) -> None:
    assert calls.partition_counts() == {"clicks": 4}
    assert calls.end_offsets("clicks") == {0: 0, 1: 10, 2: 20, 3: 30}
    child = calls.call("pid")
    assert child == calls.pid != os.getpid()
    assert [calls.call("pid") for _ in range(3)] == [child] * 3
    assert calls.restarts == 0


def test_the_inputs_own_failure_comes_back_as_its_line(calls: InputProcess) -> None:
    with pytest.raises(InputError, match=r"^KafkaInput\.topics: expected existing topics"):
        calls.call("refuse")
    with pytest.raises(InputError, match=r"^RuntimeError: something else$"):
        calls.call("fail")
    assert calls.partition_counts() == {"clicks": 4}  # the same child answers on
    assert calls.restarts == 0


def test_an_abort_in_the_child_is_a_failed_call_and_a_new_child_answers_after_a_backoff(
    calls: InputProcess,
) -> None:
    first = calls.call("pid")
    with pytest.raises(InputError) as died:
        calls.call("abort")
    assert re.fullmatch(
        r"the input's client process died during abort \(killed by SIGABRT\); "
        r"a new one starts in 1 s",
        str(died.value),
    )
    assert not alive(first)
    # Within the backoff no child is started: a client that dies on every call would
    # otherwise start a process per call.
    with pytest.raises(InputError, match=r"died \(killed by SIGABRT\); a new one starts in"):
        calls.partition_counts()
    assert wait_until("a new child answering", lambda: _answers(calls), timeout=10)
    assert calls.call("pid") != first
    assert (calls.restarts, calls.last_death) == (1, "killed by SIGABRT")


def test_a_call_past_its_deadline_stops_the_hung_child(calls: InputProcess) -> None:
    hung = calls.call("pid")
    with pytest.raises(InputError, match=r"gave no answer to hang within 3 s; it was stopped"):
        calls.call("hang", 60)
    assert not alive(hung)
    assert wait_until("a new child answering", lambda: _answers(calls), timeout=10)


def test_closing_stops_the_child_and_refuses_later_calls(calls: InputProcess) -> None:
    child = calls.call("pid")
    calls.close()
    assert not alive(child)
    with pytest.raises(InputError, match="closed"):
        calls.partition_counts()


def _answers(calls: InputProcess) -> bool:
    try:
        return calls.partition_counts() == {"clicks": 4}
    except InputError:
        return False
