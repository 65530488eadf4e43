"""A module's code version: the hash of every project module it really imports (its import closure).

A stage's cache key holds the code version of its module, so editing any module the stage can reach
rebuilds it, and editing one it cannot reach does not. The closure is read from the source with
`ast` (nothing is imported), over every import statement of a module, those inside functions and
`if TYPE_CHECKING:` blocks included:

- `import a.b.c` and `from a.b.c import x` reach `a.b.c`; `from a.b import c` reaches `a.b` and,
  when `c` is a module, `a.b.c`; relative imports are resolved against the importing module's package;
- a string that spells a project module (`"trtbuild.runtime.target"`, as lazy `importlib` tables
  write them) reaches it, and so does a dotted string naming one below the file's own top package
  (`"gemm_weight_shuffle.kernel"` in plugins/common/kernels.py, whose bundled copy has another root);
- the top-level `plugins` package is indexed beside `trtbuild`: the runtime runs its kernels
  (runtime/gemm_plugin.py, reached from the quantize export check and the draft's acceptance run),
  so an edit under plugins/ re-keys every stage whose closure reaches them;
- a string naming a sibling source file (`"local_model.py"`, which the deploy stage copies into its
  artifact) puts that file's bytes in the version, but not its imports: they run in the server, not
  in the stage.

A package's `__init__` is reached when the package itself is imported (`from trtbuild.runtime import
Generator`), not merely because one of its submodules is: `trtbuild/app/stages.py` (the registry
that imports every stage) would otherwise put all stages in every stage's closure.
Files are hashed as bytes; what is parsed and hashed is cached per process by (path, size, mtime).
"""

from __future__ import annotations

import ast
import hashlib
from functools import cache
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the trtbuild package
# The project's packages under the root: trtbuild, and the top-level `plugins` package whose kernels
# the runtime runs (runtime/gemm_plugin.py: the quantize export check, the draft's acceptance run).
PACKAGE: tuple[str, ...] = ("trtbuild", "plugins")


def module_files(root: Path = PROJECT_ROOT, package: str | tuple[str, ...] = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of `package` (one or several) under `root`."""
    index: dict[str, Path] = {}
    packages = (package,) if isinstance(package, str) else package
    for file in sorted(f for name in packages for f in (root / name).rglob("*.py")):
        parts = file.relative_to(root).with_suffix("").parts
        if "__pycache__" in parts or not all(p.isidentifier() for p in parts):
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        index[name] = file
    return index


def import_graph(root: Path = PROJECT_ROOT, package: str | tuple[str, ...] = PACKAGE) -> dict[str, set[str]]:
    """Module -> the project modules it imports (see the module docstring for what counts)."""
    index = module_files(root, package)
    return {name: _edges(name, file, index)[0] for name, file in index.items()}


def closure(module: str, root: Path = PROJECT_ROOT, package: str | tuple[str, ...] = PACKAGE) -> list[str]:
    """`module` and every project module it reaches through imports, sorted."""
    index = module_files(root, package)
    if module not in index:
        raise KeyError(f"{module} is not a module of {package} under {root}")
    seen, todo = {module}, [module]
    while todo:
        current = todo.pop()
        imports, files = _edges(current, index[current], index)
        seen.update(files)  # copied as data: hashed, not followed
        for target in imports - seen:
            seen.add(target)
            todo.append(target)
    return sorted(seen)


def code_version(module: str, root: Path = PROJECT_ROOT, package: str | tuple[str, ...] = PACKAGE) -> str:
    """Hash of the bytes of every module in `module`'s closure (with their paths)."""
    index = module_files(root, package)
    digest = hashlib.sha256()
    for name in closure(module, root, package):
        file = index[name]
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        digest.update(_file_digest(*_stat_key(file)).encode())
    return digest.hexdigest()[:16]


def _stat_key(file: Path) -> tuple[str, int, int]:
    st = file.stat()
    return str(file), st.st_size, st.st_mtime_ns


@cache
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _edges(name: str, file: Path, index: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(modules `name` imports, modules whose source file it names as data)."""
    found = _references(*_stat_key(file), is_package=file.name == "__init__.py", module=name)
    imports, files = set(), set()
    for ref in found:
        if ref.startswith("file:"):
            sibling = file.with_name(ref.removeprefix("file:"))
            files.update(n for n, f in index.items() if f == sibling)
        elif ref in index:
            imports.add(ref)
    return imports - {name}, files - {name}


@cache
def _references(path: str, size: int, mtime_ns: int, *, is_package: bool, module: str) -> frozenset[str]:
    """Every module name an import statement or a module-name string of the file could reach, and
    `file:NAME.py` for strings naming a sibling source file (resolved against the index later)."""
    tree = ast.parse(Path(path).read_bytes(), filename=path)
    package = module if is_package else module.rpartition(".")[0]
    refs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            refs.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            if base is None:
                continue
            refs.add(base)
            refs.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text.endswith(".py") and "/" not in text and text[:-3].isidentifier():
                refs.add(f"file:{text}")
            elif all(part.isidentifier() for part in text.split(".")):
                refs.add(text)
                if "." in text:  # relative to the file's top package (plugins/common/kernels.py names
                    refs.add(f"{module.split('.')[0]}.{text}")  # "gemm_weight_shuffle.kernel")
    return frozenset(refs)


def _absolute(module: str | None, level: int, package: str) -> str | None:
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    if module:
        base.append(module)
    return ".".join(base) or None
