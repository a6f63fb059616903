"""The package has the shape ARCHITECTURE.md gives it: one-way dependencies, no cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "spark_elastic"

# Which packages each package may import (besides itself). `root` is spark_elastic/__init__.py
# and __main__.py, which re-export the public API; `udfs` is the top-level UDF package.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "model": {"errors"},
    "assignment": {"errors"},
    "log": {"errors", "udfs"},
    "dataplane": {"errors", "model", "udfs"},
    "state": {"errors", "model", "dataplane"},
    "runtime": {"errors", "model", "dataplane", "log", "state", "assignment"},
    "cli": {"errors", "model", "dataplane", "log", "state", "assignment", "runtime", "root"},
    "root": {"errors", "model", "dataplane", "log", "state", "assignment", "runtime", "cli"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported_modules(tree: ast.AST, current: str, is_package: bool) -> Iterator[str]:
    """Every module imported anywhere in ``tree`` (function bodies too), but not for typing."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if is_type_checking_block(node):
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = current.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # A module's parent packages are initialized before it runs, so importing names
            # from one (`from udfs import _batches` inside udfs) is no dependency on it.
            if not current.startswith(f"{prefix}."):
                yield prefix
            # `from spark_elastic.model import plan` imports the module spark_elastic.model.plan.
            yield from (f"{prefix}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))


def our_modules() -> dict[str, Path]:
    paths = [*PACKAGE.rglob("*.py"), *(ROOT / "udfs").rglob("*.py")]
    return {module_name(p): p for p in paths}


def import_graph() -> dict[str, set[str]]:
    modules = our_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        found = imported_modules(tree, name, path.name == "__init__.py")
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def concern(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "udfs":
        return "udfs"
    if len(parts) == 1 or parts[1] == "__main__":
        return "root"
    return parts[1]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a list of modules (first == last), or None: iterative DFS in sorted order."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)
    for start in sorted(graph):
        if colour[start] != white:
            continue
        path = [start]
        iterators = [iter(sorted(graph[start]))]
        colour[start] = grey
        while iterators:
            nxt = next(iterators[-1], None)
            if nxt is None:
                colour[path.pop()] = black
                iterators.pop()
            elif colour[nxt] == grey:
                return [*path[path.index(nxt) :], nxt]
            elif colour[nxt] == white:
                colour[nxt] = grey
                path.append(nxt)
                iterators.append(iter(sorted(graph[nxt])))
    return None


def test_the_import_graph_has_no_cycle() -> None:
    assert find_cycle(import_graph()) is None


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_walker_sees_imports_inside_functions_but_not_typing_only_ones() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from spark_elastic.state import processor\n"
        "def f():\n    from spark_elastic.log.embedded import EmbeddedLog\n"
        "from . import names\n"
    )
    found = set(imported_modules(ast.parse(source), "spark_elastic.model.plan", False))
    assert "spark_elastic.log.embedded" in found
    assert "spark_elastic.model.names" in found
    assert not any(m.startswith("spark_elastic.state") for m in found)


def test_dependencies_point_one_way_between_packages() -> None:
    against = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if (src := concern(module)) != (dst := concern(target))
        and dst not in ALLOWED.get(src, {"errors"})
    )
    assert against == []


def test_every_package_says_what_it_owns_and_may_import() -> None:
    packages = sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))
    assert packages, "no subpackages found"
    for package in packages:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        assert "May import" in doc, f"{package.name}/__init__.py does not say what it may import"
        assert package.name in ALLOWED, f"{package.name} has no place in ALLOWED"


def test_architecture_md_names_every_package() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    names = [f"spark_elastic.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")]
    assert [n for n in names if f"`{n}`" not in text] == []
    assert "`udfs`" in text


@pytest.mark.parametrize("heavy", ["pyspark", "pandas", "pyarrow", "py4j"])
def test_importing_the_package_loads_no_spark_pandas_or_arrow(heavy: str) -> None:
    probe = f"import spark_elastic, sys; print({heavy!r} in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"
