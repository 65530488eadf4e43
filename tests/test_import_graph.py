"""Dependencies point one way: cli -> app -> sections -> runtime -> core, and no import circle.

The graph is read here with `ast`, independently of trtbuild.core.code_version: every `import` and
`from ... import` statement of every module, those inside functions and `if TYPE_CHECKING:` included
(a circle that only closes at call time is still a circle, and a lazy upward import is still upward).

The layers (docs/architecture.md):
    cli/      one module per command                                  may import everything below
    app/      the static Recipe, pipeline, stage registry, rules spanning sections
    model/ quantize/ draft/ engine/ deploy/   one package per recipe section; a section imports its own
              package, the runtime, core, and another section's `config` module (pydantic only), never
              another section's work
    serve/    beside the sections: the server, fronts, clients, load generation; imports runtime, core
              and sections' `config` modules
    runtime/  the CPU executor; imports core
    core/     stage API, cache, code version, errors, formats, contracts, data sources; imports core
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import trtbuild

PACKAGE_DIR = Path(trtbuild.__file__).resolve().parent
SECTIONS = ("model", "quantize", "draft", "engine", "deploy")
RANK = {"core": 0, "runtime": 1, **dict.fromkeys(SECTIONS, 2), "serve": 2, "app": 3, "cli": 4}
# Copied into the Triton repository by the deploy stage (hashed as data, never imported by trtbuild):
# it runs inside tritonserver's python backend, where it drives serve's text generation.
RUNS_IN_THE_SERVER = {"trtbuild.deploy.local_model"}
# Own imports inside functions, across the package: the dependency picture is read at the top of files;
# what stays lazy is heavy (a section's work the CLI must not pay for) or a tool's entry point.
MAX_IMPORTS_IN_FUNCTIONS = 60
HEAVY = ("torch", "transformers", "modelopt", "tensorrt_llm", "triton", "pytriton", "safetensors", "tokenizers")


def _modules() -> dict[str, Path]:
    found = {}
    for file in PACKAGE_DIR.rglob("*.py"):
        parts = file.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return found


def _imports(name: str, file: Path) -> list[tuple[str, bool]]:
    """(imported name, inside a function) for every import statement of the module."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, *([child.module] if child.module else [])])
                found.append((base, in_function))
                found.extend((f"{base}.{alias.name}", in_function) for alias in child.names)
            visit(child, inner)

    visit(ast.parse(file.read_text()), False)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {t for t, _ in _imports(name, file) if t in modules and t != name}
            for name, file in modules.items()}


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


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _allowed(source: str, target: str) -> bool:
    """May `source` import `target` (both trtbuild modules)?"""
    src, dst = _layer(source), _layer(target)
    if dst is None:  # trtbuild/__init__.py
        return True
    if src is None or src == dst:
        return src is not None or RANK[dst] == 0
    if dst in SECTIONS and target == f"trtbuild.{dst}.config":
        return RANK[src] >= 2  # a peer section's (or serve's) typed config: pydantic only
    if dst in SECTIONS and target == f"trtbuild.{dst}":
        return RANK[src] > 2  # the package itself (its __init__ docstring): from above only
    if src in SECTIONS or src == "serve":
        return RANK[dst] < 2  # runtime and core; never another section's work, nor serve
    return RANK[dst] < RANK[src]


def test_every_module_is_in_a_layer():
    loose = sorted(n for n in _modules() if n.count(".") == 1 and _layer(n) not in RANK)
    assert loose == [], "a module at the top of trtbuild/ belongs in a layer: " + ", ".join(loose)


def test_dependencies_point_one_way():
    wrong = {name: sorted(t for t in targets if not _allowed(name, t))
             for name, targets in _graph().items() if name not in RUNS_IN_THE_SERVER}
    assert {name: targets for name, targets in wrong.items() if targets} == {}


def test_the_direction_rule_refuses_what_it_should():
    assert _allowed("trtbuild.engine.checks", "trtbuild.draft.config")
    assert not _allowed("trtbuild.engine.checks", "trtbuild.draft.format")  # another section's work
    assert not _allowed("trtbuild.engine.checks", "trtbuild.app.recipe")  # upward
    assert not _allowed("trtbuild.runtime.target", "trtbuild.model.config")
    assert not _allowed("trtbuild.core.cache", "trtbuild.runtime.target")
    assert not _allowed("trtbuild.deploy.deploy", "trtbuild.serve.textgen")
    assert not _allowed("trtbuild.serve.commands", "trtbuild.deploy.deploy")
    assert not _allowed("trtbuild.app.pipeline", "trtbuild.cli.root")
    assert _allowed("trtbuild.cli.build", "trtbuild.app.pipeline")
    assert _allowed("trtbuild.app.recipe", "trtbuild.engine.stage")
    assert _allowed("trtbuild.serve.front", "trtbuild.runtime.target")


def test_the_walk_sees_imports_inside_functions():
    lazy = {t for t, inside in _imports("trtbuild.draft.build", _modules()["trtbuild.draft.build"]) if inside}
    assert "trtbuild.draft.train" in lazy  # the training loop (torch, ModelOpt) is imported only when it trains
    assert "trtbuild.draft.train" in _graph()["trtbuild.draft.build"]


def test_no_import_circle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_own_imports_sit_at_the_top_of_files():
    modules = _modules()
    inside = sorted(f"{name} -> {t}" for name, file in modules.items()
                    for t, lazy in _imports(name, file) if lazy and t in modules)
    # an `import a.b` and a `from a import b` both count once per statement target
    assert len(inside) <= MAX_IMPORTS_IN_FUNCTIONS, "\n".join(inside)


def test_the_code_version_graph_has_every_import_edge():
    """trtbuild.core.code_version's graph (what stage keys hash) holds every edge this independent walk finds."""
    from trtbuild.core.code_version import import_graph

    theirs = import_graph()
    missing = {name: sorted(targets - theirs.get(name, set())) for name, targets in _graph().items()}
    assert {name: targets for name, targets in missing.items() if targets} == {}


def test_the_openai_front_takes_plain_inputs():
    """serve/openai_api/ serves what it is given; reading a deploy artifact is the serve command's job."""
    graph = _graph()
    reaching = {name: sorted(t for t in targets if t.startswith(("trtbuild.deploy", "trtbuild.serve"))
                             and not t.startswith("trtbuild.serve.openai_api") and t != "trtbuild.serve.listener")
                for name, targets in graph.items() if name.startswith("trtbuild.serve.openai_api")}
    assert {name: targets for name, targets in reaching.items() if targets} == {}


def test_every_section_is_a_package_with_its_config_and_stage():
    from trtbuild.app.recipe import Recipe
    from trtbuild.app.stages import all_stages

    modules = _modules()
    for section in SECTIONS:
        assert f"trtbuild.{section}.config" in modules and f"trtbuild.{section}.stage" in modules
    assert {s.name: s.config_cls.__module__ for s in all_stages()} == {s: f"trtbuild.{s}.config" for s in SECTIONS}
    # The static Recipe's fields are the sections' config classes, one each.
    fields = {name: field.annotation for name, field in Recipe.model_fields.items() if name in SECTIONS}
    assert fields == {s.name: s.config_cls | None for s in all_stages()}


@pytest.mark.parametrize("module", [f"trtbuild.{s}.config" for s in SECTIONS] + ["trtbuild.app.recipe"])
def test_config_modules_import_nothing_heavy(module):
    """A section's config (and the Recipe built from them) loads without torch, transformers, ModelOpt."""
    code = (f"import sys, {module}; heavy = {HEAVY!r}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
