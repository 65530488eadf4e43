"""Dependencies point one way: no import circle in trtbuild/, and only the orchestration imports the stages.

The graph is read here with `ast`, independently of trtbuild.code_version: every `import` and
`from ... import` statement of every module, those inside functions and `if TYPE_CHECKING:` included
(a circle that only closes at call time is still a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import trtbuild

PACKAGE_DIR = Path(trtbuild.__file__).resolve().parent
# The top level that runs stages: the CLI, the pipeline, the recipe schema (composed of the stages'
# configs) and the cross-stage checks (each stage's `preflight`, and rules over the stages' order).
ORCHESTRATION = {"trtbuild.cli", "trtbuild.pipeline", "trtbuild.recipe", "trtbuild.preflight",
                 "trtbuild.crosschecks"}


def _modules() -> dict[str, Path]:
    found = {}
    for file in PACKAGE_DIR.rglob("*.py"):
        parts = file.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, file in modules.items():
        package = name if file.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_walk_sees_imports_inside_functions():
    # stages/engine.py imports the bundle builder only inside `run`: the graph must still have it.
    assert "trtbuild.trtllm.bundle" in _graph()["trtbuild.stages.engine"]


def test_no_import_circle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_orchestration_imports_the_stages():
    upward = {name: sorted(t for t in targets if t == "trtbuild.stages" or t.startswith("trtbuild.stages."))
              for name, targets in _graph().items()
              if not name.startswith("trtbuild.stages") and name not in ORCHESTRATION}
    assert {name: targets for name, targets in upward.items() if targets} == {}


def test_the_code_version_graph_has_every_import_edge():
    """trtbuild.code_version's graph (what stage keys hash) holds every edge this independent walk finds."""
    from trtbuild.code_version import import_graph

    theirs = import_graph()
    missing = {name: sorted(targets - theirs.get(name, set())) for name, targets in _graph().items()}
    assert {name: targets for name, targets in missing.items() if targets} == {}


def test_the_openai_front_takes_plain_inputs():
    """openai_api/ serves what it is given; reading a deploy artifact (triton/) is the serve command's job."""
    graph = _graph()
    reaching = {name: sorted(t for t in targets if t.startswith("trtbuild.triton"))
                for name, targets in graph.items() if name.startswith("trtbuild.openai_api")}
    assert {name: targets for name, targets in reaching.items() if targets} == {}


def test_every_stage_config_lives_below_the_stages():
    """The packages that do a stage's work read its config, so it cannot live in trtbuild/stages/."""
    from trtbuild.stages import all_stages

    inside = {s.name: s.config_cls.__module__ for s in all_stages()
              if s.config_cls.__module__.startswith("trtbuild.stages")}
    assert inside == {}
