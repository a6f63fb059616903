"""Register ``DataFrame.withVirtualTasks`` for classic and Spark Connect DataFrames.

Both ``pyspark.sql.classic.dataframe.DataFrame`` and
``pyspark.sql.connect.dataframe.DataFrame`` derive from
``pyspark.sql.dataframe.DataFrame``, so one attribute on that base serves
both without importing Spark Connect. Like polars' namespaces, registration
refuses to shadow a name that already exists.

``import spark_elastic`` does not import pyspark for this: if pyspark's
DataFrame module is not loaded yet, a one-shot import hook registers the
method right after it is (so ``spark-elastic plan`` never loads pyspark).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from spark_elastic.dataplane.transforms import with_virtual_tasks

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["METHOD_NAME", "register_dataframe_method", "register_when_pyspark_loads"]

METHOD_NAME = "withVirtualTasks"
_MARK = "__spark_elastic__"
_DATAFRAME_MODULE = "pyspark.sql.dataframe"


@functools.wraps(with_virtual_tasks)
def _with_virtual_tasks_method(self: DataFrame, *args: Any, **kwargs: Any) -> DataFrame:
    return self.transform(with_virtual_tasks(*args, **kwargs))


setattr(_with_virtual_tasks_method, _MARK, True)


def register_dataframe_method() -> bool:
    """Add ``withVirtualTasks`` to Spark DataFrames unless the name is taken.

    Runs on the driver. Returns whether the method is (now) ours; warns and
    leaves the existing attribute alone otherwise.
    """
    try:
        from pyspark.sql.dataframe import DataFrame
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return False
    return _register_on(DataFrame)


def _register_on(base: type) -> bool:
    for owner in (base, *base.__subclasses__()):
        existing = owner.__dict__.get(METHOD_NAME)
        if existing is not None and not getattr(existing, _MARK, False):
            warnings.warn(
                f"spark_elastic: {owner.__module__}.{owner.__qualname__} already has an attribute "
                f"{METHOD_NAME!r}; not overriding it. Use "
                "df.transform(spark_elastic.with_virtual_tasks(...)) instead.",
                RuntimeWarning,
                stacklevel=4,
            )
            return False
    setattr(base, METHOD_NAME, _with_virtual_tasks_method)
    return True


def register_when_pyspark_loads() -> None:
    """Register now if pyspark's DataFrame is loaded, else as soon as it is."""
    if _DATAFRAME_MODULE in sys.modules:
        register_dataframe_method()
    elif not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of ``pyspark.sql.dataframe`` to register the method after it runs."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _DATAFRAME_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _register_on(module.DataFrame)
