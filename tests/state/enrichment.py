"""The example two-stream job's processor for the specs of time order (issue #26).

``examples/jobs/enriched_clicks.py`` enriches each click with its user's
latest profile update; ``test_time_order.py`` and ``test_hold_back.py`` run
its processor under ``with_task_state`` and compare with single passes.
"""

from __future__ import annotations

from pathlib import Path

from spark_elastic import TaskProcessor
from spark_elastic.runtime.job import load_job_and_module

ENRICHED = "user string, click_offset long, partition int, profile string"
"""The processor's output schema."""
EXAMPLE = Path(__file__).parents[2] / "examples" / "jobs" / "enriched_clicks.py"


def example_processor() -> TaskProcessor:
    """``examples/jobs/enriched_clicks.py``'s processor, pickled by value as containers do."""
    from pyspark import cloudpickle

    job, module = load_job_and_module(str(EXAMPLE) + ":job")
    cloudpickle.register_pickle_by_value(module)
    assert job.processor is not None
    return job.processor
