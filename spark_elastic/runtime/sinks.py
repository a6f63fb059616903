"""Sinks beyond the file system: :class:`KafkaSink`, a job's output as records of a Kafka topic.

Owns writing a micro-batch's rows to Kafka in one transaction that becomes
visible only after the container's lease check (``context.fence()``), as
:class:`~spark_elastic.runtime.job.ParquetSink`'s rename does.

May import :mod:`spark_elastic.errors` and :mod:`spark_elastic.runtime.job`
(the :class:`~spark_elastic.runtime.job.BatchContext` a sink is given);
pyspark and confluent-kafka only inside functions, so a job file that names
a ``KafkaSink`` loads neither in the coordinator.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_elastic.errors import ArgumentError, ArgumentTypeError, FencedError, SinkError
from spark_elastic.runtime.job import (
    _AUTHENTICATION_FAILED,
    AT_LEAST_ONCE,
    BatchContext,
    _bootstrap_servers,
    _check_timeout,
    _client_options,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# One transactional producer per (servers, transactional id) in a container's driver: a
# producer's init_transactions is a round trip to the transaction coordinator, once.
_PRODUCERS: dict[tuple[str, str], Any] = {}
_PRODUCERS_LOCK = threading.Lock()


@dataclass(frozen=True)
class KafkaSink:
    """Each micro-batch's rows as records of a Kafka topic, published in one transaction.

    The container's driver produces the batch's records inside a Kafka
    transaction, calls ``context.fence()`` (the container's lease check) and
    only then commits: a container paused past its lease aborts and
    publishes nothing to ``read_committed`` consumers, as :class:`ParquetSink`
    renames nothing. Records are keyed by :attr:`key` and partitioned as
    Kafka's Java producer does (murmur2). Output is at-least-once
    (:data:`~spark_elastic.runtime.job.AT_LEAST_ONCE`): after a failover, a
    batch the old owner committed to Kafka but not to Spark may be published
    again by its successor.

    A row's value is its ``value`` column if the output has one (string or
    binary), else the whole row as JSON (Spark's ``to_json``, so every Spark
    type has its JSON form).

    Attributes
    ----------
    bootstrap_servers
        ``host:port[,host:port...]``.
    topic
        The output topic; it must exist (its partition count is the producer's).
    key
        The column whose value keys each record (cast to a string unless
        binary), or None for records without a key.
    kafka_options
        librdkafka producer settings (security protocol, SASL...), except
        ``bootstrap.servers`` and ``transactional.id``.
    timeout_s
        Bound on each transaction step (init, commit, abort).

    Runs on the container's driver, once per micro-batch; the batch is
    collected there (``DataFrame.toArrow``), so a batch must fit the
    driver's memory: bound it with the input's ``max_records_per_batch``.
    """

    bootstrap_servers: str
    topic: str
    key: str | None = None
    kafka_options: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    guarantee = AT_LEAST_ONCE

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "bootstrap_servers", _bootstrap_servers(self.bootstrap_servers, "KafkaSink")
        )
        if not isinstance(self.topic, str):
            raise ArgumentTypeError.wrong_type("KafkaSink.topic", "a topic name", self.topic)
        if not self.topic:
            raise ArgumentError.invalid("KafkaSink.topic", "a topic name", self.topic)
        if self.key is not None and not isinstance(self.key, str):
            raise ArgumentTypeError.wrong_type("KafkaSink.key", "a column name or None", self.key)
        if self.key == "":
            raise ArgumentError.invalid("KafkaSink.key", "a column name or None", self.key)
        options = _client_options("KafkaSink.kafka_options", self.kafka_options)
        if "transactional.id" in options:
            raise ArgumentError.invalid(
                "KafkaSink.kafka_options",
                "no 'transactional.id' (each container sets its own)",
                options,
            )
        object.__setattr__(self, "kafka_options", options)
        _check_timeout("KafkaSink.timeout_s", self.timeout_s)

    def write(self, batch: DataFrame, context: BatchContext) -> None:
        """Publish one micro-batch (container driver, once per batch).

        Parameters
        ----------
        batch
            The batch's output rows.
        context
            Batch id, writer, and the fence checked before the commit.

        Raises
        ------
        FencedError
            The lease no longer allows a write: the transaction was aborted.
        SinkError
            The output has no :attr:`key` column, or Kafka refused the
            records or the transaction (the cause in one line).
        """
        records = list(self._records(batch))
        producer = self._producer(context.container_id)
        try:
            producer.begin_transaction()
            for key, value in records:
                self._produce(producer, key, value)
            # Everything sent before the lease check, so that only the commit's round trip
            # lies between the check and the batch becoming visible (the write budget).
            unsent = producer.flush(self.timeout_s)
            if unsent:
                raise SinkError(f"{unsent} records not sent within {self.timeout_s:g} s")
            context.fence()
            producer.commit_transaction(self.timeout_s)
        except FencedError:
            self._abort(producer, context.container_id)
            raise
        except Exception as exc:
            self._abort(producer, context.container_id)
            raise SinkError(
                f"KafkaSink: batch {context.batch_id} of {context.container_id} was not "
                f"published to {self.topic!r} on {self.bootstrap_servers}: {_first_line(exc)}"
            ) from exc

    def _records(self, batch: DataFrame) -> Iterator[tuple[bytes | None, bytes | None]]:
        """``(key, value)`` of each row, as bytes."""
        from pyspark.sql import functions as F

        columns = batch.columns
        if self.key is not None and self.key not in columns:
            raise SinkError(
                f"KafkaSink.key: expected a column of the job's output, found {self.key!r} "
                f"not among {columns}"
            )
        value = F.col("value") if "value" in columns else F.to_json(F.struct(*columns))
        key = F.lit(None) if self.key is None else F.col(self.key)
        table = batch.select(key.alias("k"), value.alias("v")).toArrow()
        for k, v in zip(table.column("k").to_pylist(), table.column("v").to_pylist(), strict=True):
            yield _bytes(k), _bytes(v)  # a null value is a tombstone, as Kafka has it

    def _produce(self, producer: Any, key: bytes | None, value: bytes | None) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                producer.produce(self.topic, key=key, value=value)
                return
            except BufferError:
                # The producer's queue is full: let it send, then try again, for a while.
                if time.monotonic() > deadline:
                    raise SinkError(
                        f"the producer's queue stayed full for {self.timeout_s:g} s"
                    ) from None
                producer.poll(0.1)

    def _producer(self, container_id: str) -> Any:
        transactional_id = _tid(container_id, self.topic)
        cache_key = (self.bootstrap_servers, transactional_id)
        with _PRODUCERS_LOCK:
            producer = _PRODUCERS.get(cache_key)
            if producer is None:
                from confluent_kafka import Producer

                refused: list[str] = []

                def on_error(error: Any) -> None:
                    # A refused login is only said here: init_transactions just times out.
                    if error.code() in _AUTHENTICATION_FAILED:
                        refused.append(error.str())

                producer = Producer(
                    {
                        **self.kafka_options,
                        "bootstrap.servers": self.bootstrap_servers,
                        "transactional.id": transactional_id,
                        # Java's partitioner: keys land where the `spark` hash expects.
                        "partitioner": "murmur2_random",
                        "logger": logging.getLogger("spark_elastic.kafka"),
                        "error_cb": on_error,
                    }
                )
                try:
                    producer.init_transactions(self.timeout_s)
                except Exception as exc:
                    producer.poll(0)  # serves the error callbacks librdkafka has queued
                    if refused:
                        raise SinkError(
                            f"KafkaSink.kafka_options: expected credentials the brokers accept, "
                            f"found them refused at {self.bootstrap_servers} ({refused[-1]})"
                        ) from exc
                    raise SinkError(
                        f"KafkaSink.bootstrap_servers: expected a Kafka broker that starts a "
                        f"transaction within {self.timeout_s:g} s, found none at "
                        f"{self.bootstrap_servers} ({_first_line(exc)})"
                    ) from exc
                _PRODUCERS[cache_key] = producer
            return producer

    def _abort(self, producer: Any, container_id: str) -> None:
        try:
            producer.abort_transaction(self.timeout_s)
        except Exception:
            # A producer that cannot abort (fenced, fatal) is dropped: the next batch
            # starts a new one, whose init_transactions aborts what this one left open.
            with _PRODUCERS_LOCK:
                _PRODUCERS.pop((self.bootstrap_servers, _tid(container_id, self.topic)), None)


def _tid(container_id: str, topic: str) -> str:
    """A container's transactional id: its own, so no two containers fence each other in
    Kafka (the lease fences a zombie); a restarted process of the same container resumes it."""
    return f"spark-elastic-{container_id}-{topic}"


def _bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
