"""Which way imports run. The capability packages are libraries: importing every module of one, in a fresh
interpreter, loads no Temporal, no pipeline and no local-stack module (``make lint`` checks the same statically
with import-linter; this proves it at run time, lazy imports included once their module is loaded). And the
graph of imports between the top-level packages, read from every module's source by grimp (import-linter's
library; imports inside functions and under ``TYPE_CHECKING`` included), has no circle and runs one way:
``infra`` -> ``pipeline`` -> the capabilities -> ``evidence``."""

from __future__ import annotations

import json
import subprocess
import sys

import grimp
import pytest

CAPABILITIES = ["reviews", "environments", "browser", "repair", "evidence"]
FORBIDDEN = ("temporalio", "pipeline", "infra")

PROBE = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
names = [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "loaded": sorted(sys.modules)}))
"""


@pytest.mark.parametrize("package", CAPABILITIES)
def test_a_capability_loads_no_temporal_pipeline_or_infra_module(package: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, package], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    seen = json.loads(out)
    assert seen["imported"], f"{package} has no modules to import"
    leaked = [m for m in seen["loaded"] if m.split(".")[0] in FORBIDDEN]
    assert not leaked, f"importing {package} loaded {leaked}"


TOP_LEVEL = ["infra", "pipeline", "reviews", "repair", "browser", "environments", "evidence"]
"""The top-level packages, from the local stack down to the shared value types."""

RANK = {"infra": 0, "pipeline": 1, "reviews": 2, "repair": 2, "browser": 2, "environments": 2, "evidence": 3}
"""Which way imports run between them: a package imports only those of its rank (the capabilities may use
one another, as import-linter's ``:`` layer allows, but never in a circle) or of a higher one."""


def package_imports(graph: grimp.ImportGraph, depth: int) -> dict[str, set[str]]:
    """The packages each package (a module's first ``depth`` name parts) imports, function-level and
    ``TYPE_CHECKING`` imports included, imports within one package left out."""

    def package(module: str) -> str:
        return ".".join(module.split(".")[:depth])

    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        source = package(module)
        edges.setdefault(source, set())
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.split(".")[0] in RANK and package(imported) != source:
                edges[source].add(package(imported))
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``edges`` (its packages, the first repeated at the end), or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


@pytest.fixture(scope="module")
def import_graph() -> grimp.ImportGraph:
    return grimp.build_graph(*TOP_LEVEL, cache_dir=None)


def test_no_import_circle_between_top_level_packages_and_imports_run_one_way(
    import_graph: grimp.ImportGraph,
) -> None:
    edges = package_imports(import_graph, depth=1)
    print("imports between top-level packages:")
    for source in TOP_LEVEL:
        print(f"  {source} -> {', '.join(sorted(edges.get(source, ()))) or '(none)'}")

    assert set(edges) == set(TOP_LEVEL)
    assert find_cycle(edges) is None
    upward = sorted((s, t) for s, targets in edges.items() for t in targets if RANK[t] < RANK[s])
    assert not upward, f"imports against the layers: {upward}"
    # Not vacuous: the stack is built on the product, the product on its capabilities and their value types.
    assert {"pipeline"} <= edges["infra"] and {"environments", "evidence", "reviews"} <= edges["pipeline"]


def test_the_cycle_finder_finds_a_circle_and_accepts_a_ladder() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
