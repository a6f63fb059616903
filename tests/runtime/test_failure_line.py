"""What a failed container says is the cause the operator needs, in one line."""

from __future__ import annotations

from spark_elastic.runtime.container.client import first_line

# What `str(query.exception())` was when a KafkaSink could not publish (abridged).
# ruff: noqa: E501
SINK_FAILED = """An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/x/spark_elastic/runtime/sinks.py", line 191, in write
    raise SinkError(f"{unsent} records not sent within {self.timeout_s:g} s")
spark_elastic.errors.SinkError: 2000 records not sent within 30 s

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/x/spark_elastic/runtime/sinks.py", line 199, in write
    raise SinkError(
spark_elastic.errors.SinkError: KafkaSink: batch 3 of clicks-c1 was not published to 'click-counts' on 127.0.0.1:39253: 2000 records not sent within 30 s

=== Streaming Query ===
Identifier: clicks-clicks-c1 [id = e05a98a0, runId = 704b2e4a]
Current Committed Offsets: {KafkaV2[Assign[clicks-0, clicks-1]]: {"clicks":{"0":2108}}}
py4j.Py4JException: not the cause
"""


class StreamingQueryException(Exception):  # noqa: N818 - pyspark's name
    """As pyspark names it."""


def test_a_query_that_died_in_python_names_what_the_python_code_raised() -> None:
    assert first_line(StreamingQueryException(SINK_FAILED)) == (
        "StreamingQueryException: SinkError: KafkaSink: batch 3 of clicks-c1 was not published "
        "to 'click-counts' on 127.0.0.1:39253: 2000 records not sent within 30 s"
    )


def test_any_other_error_is_its_type_and_first_line() -> None:
    assert first_line(ValueError("bad value\nmore")) == "ValueError: bad value"
    assert first_line(RuntimeError("")) == "RuntimeError"
    assert first_line("already a line") == "already a line"
