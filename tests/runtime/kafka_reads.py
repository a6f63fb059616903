"""A ``KafkaInput``'s reader (Spark's Kafka source, or ours) reading a topic, in a new process.

``spark.jars`` must be set before a session starts, and the suite's shared
session has none: :func:`read_with_spark` runs a short ``availableNow``
query in a new interpreter with the connector's jars and returns what it read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from spark_elastic import KafkaInput

# argv: the input as JSON (KafkaInput's fields), its partition count, the connector's jars
# and a checkpoint directory. Prints what the query read as JSON.
_READ_WITH_SPARK = """
import json, sys
from jvm import TEST_JAVA_OPTIONS
from spark_elastic import KafkaInput
from spark_elastic.dataplane.session import local_session

fields, partitions, jars, checkpoint = sys.argv[1:]
source = KafkaInput(**json.loads(fields))
topic = source.topics[0]
spark = local_session("kafka-source-spec", conf={
    "spark.jars": jars,
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.extraJavaOptions": TEST_JAVA_OPTIONS,
})
rows = source.stream_reader(spark, {topic: list(range(int(partitions)))}).load()
query = (
    rows.selectExpr(
        "CAST(key AS STRING) AS key", "partition", "offset", "CAST(value AS STRING) AS value",
        "topic", "unix_millis(timestamp) AS millis", "timestampType",
    )
    .writeStream.format("memory").queryName("landed")
    .option("checkpointLocation", checkpoint)
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination(240)
assert not query.isActive, "the availableNow query did not finish in 240 s"
assert query.exception() is None, query.exception()
landed = [tuple(r) for r in spark.sql("SELECT key, partition, offset FROM landed").collect()]
full = [tuple(r) for r in spark.sql("SELECT * FROM landed").collect()]
batches = sum(1 for p in query.recentProgress if p["numInputRows"] > 0)
print(json.dumps({"spark": spark.version, "rows": landed, "batches": batches, "full": full}))
"""


def read_with_spark(
    source: KafkaInput, partitions: int, jars: list[str], workdir: Path
) -> dict[str, Any]:
    """Every record of ``source``'s first topic, read by its reader with ``availableNow``.

    Returns
    -------
    dict
        ``spark`` (its version), ``rows`` (``[key, partition, offset]`` each),
        ``full`` (``[key, partition, offset, value, topic, timestamp ms,
        timestampType]`` each) and ``batches`` (micro-batches that read records).
    """
    fields = {
        "bootstrap_servers": source.bootstrap_servers,
        "topics": list(source.topics),
        "max_records_per_batch": source.max_records_per_batch,
        "kafka_options": dict(source.kafka_options),
        "admin_options": dict(source.admin_options),
        "reader": source.reader,
    }
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _READ_WITH_SPARK,
            json.dumps(fields),
            str(partitions),
            ",".join(jars),
            str(workdir / "checkpoint"),
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    read: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return read
