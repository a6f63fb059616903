"""Register ``DataFrame.withVirtualTasks`` for classic and Spark Connect DataFrames.

Both ``pyspark.sql.classic.dataframe.DataFrame`` and
``pyspark.sql.connect.dataframe.DataFrame`` derive from
``pyspark.sql.dataframe.DataFrame``, so one attribute on that base serves
both without importing Spark Connect. Like polars' namespaces, registration
refuses to shadow a name that already exists.
"""

from __future__ import annotations

import functools
import warnings
from typing import TYPE_CHECKING, Any

from spark_elastic._transforms import with_virtual_tasks

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["METHOD_NAME", "register_dataframe_method"]

METHOD_NAME = "withVirtualTasks"
_MARK = "__spark_elastic__"


@functools.wraps(with_virtual_tasks)
def _with_virtual_tasks_method(self: DataFrame, *args: Any, **kwargs: Any) -> DataFrame:
    return self.transform(with_virtual_tasks(*args, **kwargs))


setattr(_with_virtual_tasks_method, _MARK, True)


def register_dataframe_method() -> bool:
    """Add ``withVirtualTasks`` to Spark DataFrames unless the name is taken.

    Runs on the driver at ``import spark_elastic``. Returns whether the method
    is (now) ours; warns and leaves the existing attribute alone otherwise.
    """
    try:
        from pyspark.sql.dataframe import DataFrame
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return False
    owners = [DataFrame, *DataFrame.__subclasses__()]
    for owner in owners:
        existing = owner.__dict__.get(METHOD_NAME)
        if existing is not None and not getattr(existing, _MARK, False):
            warnings.warn(
                f"spark_elastic: {owner.__module__}.{owner.__qualname__} already has an attribute "
                f"{METHOD_NAME!r}; not overriding it. Use "
                "df.transform(spark_elastic.with_virtual_tasks(...)) instead.",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
    setattr(DataFrame, METHOD_NAME, _with_virtual_tasks_method)
    return True
