"""The public API documents itself: numpydoc sections on everything ``spark_elastic`` exports."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import spark_elastic
import udfs


def public_callables(module: Any) -> Iterator[tuple[str, Callable[..., Any]]]:
    """Every exported function, and every public method of every exported class."""
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isfunction(obj):
            yield name, obj
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                if isinstance(value, classmethod | staticmethod):
                    value = value.__func__
                if not member.startswith("_") and inspect.isfunction(value):
                    yield f"{name}.{member}", value


def missing_sections(func: Callable[..., Any]) -> list[str]:
    doc = inspect.getdoc(func) or ""
    signature = inspect.signature(func)
    missing = []
    if not doc:
        missing.append("a docstring")
    if [p for p in signature.parameters if p not in ("self", "cls")] and "Parameters" not in doc:
        missing.append("Parameters")
    returns = signature.return_annotation
    if returns not in (None, "None", inspect.Signature.empty) and "Returns" not in doc:
        missing.append("Returns")
    return missing


def test_every_public_callable_has_numpydoc_parameters_and_returns() -> None:
    undocumented = {
        f"{module.__name__}.{name}": missing
        for module in (spark_elastic, udfs)
        for name, func in public_callables(module)
        if (missing := missing_sections(func))
    }
    assert undocumented == {}
