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

_LIBRARY = {"errors", "model", "dataplane", "log", "state", "assignment", "runtime", "storage"}
"""Every package under the CLI and the package root, which both may import all of them."""

# Which packages each package may import (besides itself). `root` is spark_elastic/__init__.py
# and __main__.py, which re-export the public API; `udfs` is the top-level UDF package.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "model": {"errors"},
    "assignment": {"errors"},
    "storage": {"errors"},
    "log": {"errors", "udfs"},
    "dataplane": {"errors", "model", "udfs"},
    "state": {"errors", "model", "dataplane", "storage"},
    "runtime": {"errors", "model", "dataplane", "log", "state", "assignment", "storage"},
    "cli": {*_LIBRARY, "root"},
    "root": {*_LIBRARY, "cli"},
}

# Inside runtime: the coordinator and the container are two packages that talk over HTTP only.
# Each may import the shared modules, never the other; the shared ones import neither.
RUNTIME_SIDES = {"coordinator", "container"}
RUNTIME_SHARED = {"protocol", "lease", "job", "inputs", "sinks", "keys", "growth"}
# What a coordinator never loads: it starts no JVM and needs no dataframes.
HEAVY = ("pyspark", "pandas", "pyarrow", "py4j")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported_modules(
    tree: ast.AST, current: str, is_package: bool, in_functions: bool = True
) -> Iterator[str]:
    """Every module imported anywhere in ``tree`` (function bodies too, unless not
    ``in_functions``: then only what importing the module runs), but not for typing."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if is_type_checking_block(node):
            continue
        if not in_functions and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
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


def all_imports(in_functions: bool) -> dict[str, set[str]]:
    """Every module of ours and what it imports, third-party modules included."""
    graph: dict[str, set[str]] = {}
    for name, path in our_modules().items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = set(imported_modules(tree, name, path.name == "__init__.py", in_functions))
    return graph


def loaded_on_import(module: str, at_import: dict[str, set[str]]) -> set[str]:
    """Every module importing ``module`` loads: what its module-level code imports, and their
    parent packages, transitively (imports inside functions run only when called)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for step in [".".join(parts[:i]) for i in range(1, len(parts) + 1)]:
            if step not in seen:
                seen.add(step)
                todo.extend(at_import.get(step, ()))
    return seen


def runtime_part(module: str) -> str | None:
    """``coordinator``, ``container`` or a shared module's name for a module under
    spark_elastic.runtime (``""`` for the package itself); None for any other module."""
    parts = module.split(".")
    if parts[:2] != ["spark_elastic", "runtime"]:
        return None
    return parts[2] if len(parts) > 2 else ""


def runtime_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports between the coordinator's and the container's side of runtime, either way,
    and from a shared runtime module into either side."""
    against = []
    for module, targets in graph.items():
        src = runtime_part(module)
        for target in targets:
            dst = runtime_part(target)
            if src in (None, "") or dst is None or dst == src:
                continue
            if (src in RUNTIME_SIDES and dst not in RUNTIME_SHARED) or (
                src in RUNTIME_SHARED and dst in RUNTIME_SIDES
            ):
                against.append(f"{module} imports {target}")
    return sorted(against)


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


def test_the_coordinator_and_the_container_import_only_the_shared_runtime_modules() -> None:
    assert runtime_violations(import_graph()) == []


def test_every_runtime_module_is_on_a_side_or_shared() -> None:
    parts = {runtime_part(m) for m in our_modules()} - {None, ""}
    assert parts - RUNTIME_SIDES - RUNTIME_SHARED == set()


def test_the_runtime_rule_refuses_an_import_across_the_sides() -> None:
    graph = {
        "spark_elastic.runtime.coordinator.supervisor": {
            "spark_elastic.runtime.protocol",
            "spark_elastic.runtime.container.run",
        },
        "spark_elastic.runtime.container.run": {"spark_elastic.runtime.coordinator.stores"},
        "spark_elastic.runtime.protocol": {"spark_elastic.runtime.container"},
        "spark_elastic.runtime.container.query": {"spark_elastic.runtime.lease"},
    }
    assert runtime_violations(graph) == [
        "spark_elastic.runtime.container.run imports spark_elastic.runtime.coordinator.stores",
        "spark_elastic.runtime.coordinator.supervisor imports spark_elastic.runtime.container.run",
        "spark_elastic.runtime.protocol imports spark_elastic.runtime.container",
    ]


def test_the_coordinator_neither_imports_nor_loads_spark_pandas_or_arrow() -> None:
    anywhere, at_import = all_imports(in_functions=True), all_imports(in_functions=False)
    coordinator = [m for m in anywhere if runtime_part(m) == "coordinator"]
    assert coordinator, "no coordinator modules found"
    found = {
        module: heavy
        for module in coordinator
        if (
            heavy := sorted(
                {m.split(".")[0] for m in anywhere[module] | loaded_on_import(module, at_import)}
                & set(HEAVY)
            )
        )
    }
    assert found == {}


def test_every_package_says_what_it_owns_and_may_import() -> None:
    packages = sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))
    assert packages, "no subpackages found"
    for package in packages:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        assert "May import" in doc, f"{package.name}/__init__.py does not say what it may import"
        assert package.name in ALLOWED, f"{package.name} has no place in ALLOWED"


def test_each_runtime_side_says_what_it_owns_and_may_import() -> None:
    for side in sorted(RUNTIME_SIDES):
        init = PACKAGE / "runtime" / side / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc, f"runtime/{side}/__init__.py does not say what it may import"


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


# Moving, linking and copying files is the file layer's (spark_elastic/storage): the steps a
# local disk has and an object store does not. Elsewhere only these, each on files that are
# not a job's checkpoints, forks, snapshots, seeds, fences or output.
FILE_STEPS_ALLOWED = {
    # The embedded log's own segments and its gate files: a broker's files, on the host that
    # runs it (log/ may not import storage: dependencies point one way).
    ("spark_elastic.log.embedded", "os.rename"),
    ("spark_elastic.log.embedded", "os.replace"),
    ("spark_elastic.log.gate", "os.replace"),
    # A plan file the user names (save_plan), read back by the user.
    ("spark_elastic.model.plan", "os.replace"),
    # The driver's own temporary directory of files Spark ships to executors.
    ("spark_elastic.state.shipped", "shutil.rmtree"),
    # Looking java up on PATH touches no file.
    ("spark_elastic.dataplane.session", "shutil.which"),
    # A container JVM's class archive, in its host's cache: the host's file, not a job's.
    ("spark_elastic.runtime.container.class_archive", "os.replace"),
    # A dead container JVM's temporary files, on its host: the host's files, not a job's.
    ("spark_elastic.runtime.container.scratch", "shutil.rmtree"),
    # A local session's Spark home of links, in its host's cache: the host's, not a job's.
    ("spark_elastic.dataplane.spark_home", "<path>.symlink_to"),
    ("spark_elastic.dataplane.spark_home", "os.rename"),
    ("spark_elastic.dataplane.spark_home", "shutil.rmtree"),
    ("spark_elastic.dataplane.spark_home", "shutil.which"),
}
_OS_FILE_STEPS = {"rename", "renames", "replace", "link", "symlink"}
_PATH_FILE_STEPS = {"rename", "hardlink_to", "symlink_to", "link_to"}


def file_steps(tree: ast.AST) -> Iterator[str]:
    """Each ``os.rename``-like, ``shutil.*`` or ``Path.rename``-like step named in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil"):
            for alias in node.names:
                if node.module == "shutil" or alias.name in _OS_FILE_STEPS:
                    yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner == "shutil" or (owner == "os" and node.attr in _OS_FILE_STEPS):
                yield f"{owner}.{node.attr}"
            elif owner not in ("os", "shutil") and node.attr in _PATH_FILE_STEPS:
                yield f"<path>.{node.attr}"


def test_only_the_file_layer_moves_links_or_copies_job_files() -> None:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if module.startswith("spark_elastic.storage"):
            continue
        found |= {(module, step) for step in file_steps(ast.parse(path.read_text()))}
    assert sorted(found - FILE_STEPS_ALLOWED) == []
    assert sorted(FILE_STEPS_ALLOWED - found) == [], "an allowance no module needs any more"


def test_the_file_step_finder_sees_each_way_of_naming_a_step() -> None:
    source = (
        "import os, shutil\nfrom os import link\nfrom shutil import copytree\n"
        "os.replace(a, b)\nshutil.rmtree(c)\nPath(d).rename(e)\nf = os.link\n"
        "os.path.join(a, b)\nname.replace('a', 'b')\n"
    )
    assert sorted(file_steps(ast.parse(source))) == [
        "<path>.rename",
        "os.link",
        "os.link",
        "os.replace",
        "shutil.copytree",
        "shutil.rmtree",
    ]


MAX_RUNTIME_CLASS_LINES = 500
"""No class of the running system is longer: each concern in a room of its own."""


def classes_longer_than(limit: int, folder: Path) -> list[str]:
    """``module.Class (N lines)`` of every class in ``folder`` longer than ``limit`` lines."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(folder)}:{node.name} ({length} lines)")
    return found


def test_no_class_of_the_running_system_is_over_500_lines() -> None:
    assert classes_longer_than(MAX_RUNTIME_CLASS_LINES, PACKAGE / "runtime") == []


def test_the_class_length_rule_finds_a_long_class(tmp_path: Path) -> None:
    methods = "".join(f"    def m{i}(self) -> int:\n        return {i}\n\n" for i in range(200))
    (tmp_path / "long.py").write_text(f"class Long:\n{methods}")
    long_ones = classes_longer_than(MAX_RUNTIME_CLASS_LINES, tmp_path)
    assert [entry.rsplit(":", 1)[1] for entry in long_ones] == ["Long (600 lines)"]
