"""Writing recipe values into shell scripts as data, never as code.

Every value that came from a recipe is quoted with `shlex.quote`; only expansions trtbuild writes
itself (`${BUNDLE}`, `${TRTBUILD_PORT}`) are marked `Raw` and left to the shell. Defaults that a
variable may override are assigned on their own line (`X=${X:-'value'}`: the single quotes keep the
value literal in bash and POSIX sh). Environment values that came from `${env:NAME}` in the recipe
stay references (`"${NAME}"`), resolved by the shell at launch: a secret never lands in a file.
"""

from __future__ import annotations

import re
import shlex

# `${env:NAME}` / `${env:NAME:-default}`: recipe.py interpolates them, launch scripts keep them as references.
ENV_PATTERN = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Raw(str):
    """Shell text written by trtbuild itself (an expansion of its own), emitted verbatim."""


def quote(value: str | Raw) -> str:
    return str(value) if isinstance(value, Raw) else shlex.quote(value)


def word(*parts: str | Raw) -> Raw:
    """One shell word from literal parts (quoted) and Raw parts (verbatim), e.g. "${BUNDLE}":'/data'."""
    return Raw("".join(quote(p) for p in parts))


def expand(name: str) -> Raw:
    """A variable reference in double quotes, e.g. "${BUNDLE}"."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"not a shell variable name: {name!r}")
    return Raw(f'"${{{name}}}"')


def default_assignment(name: str, default: str) -> str:
    """`NAME=${NAME:-'default'}`: the environment may override, the recipe's value stays data."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"not a shell variable name: {name!r}")
    return f"{name}=${{{name}:-{shlex.quote(default)}}}\n"


def comment_safe(text: str) -> str:
    """A recipe value inside a `#` comment line: control characters (a newline ends the comment and
    starts a command) are replaced."""
    return _CONTROL.sub("?", text)


def sbatch_directives(*, job_name: str, nodes: int, tasks_per_node: int, gpus_per_node: int, time_limit: str,
                      output: str, partition: str | None, account: str | None) -> list[str]:
    """The #SBATCH lines of a launcher script. sbatch reads them, not the shell: recipes validate the
    values (no whitespace or control characters) and comment_safe keeps a newline from adding a line."""
    lines = [f"#SBATCH -J {job_name}", f"#SBATCH -N {nodes}", f"#SBATCH --ntasks-per-node={tasks_per_node}",
             f"#SBATCH --gpus-per-node={gpus_per_node}", f"#SBATCH -t {time_limit}", f"#SBATCH -o {output}"]
    if partition:
        lines.append(f"#SBATCH -p {partition}")
    if account:
        lines.append(f"#SBATCH -A {account}")
    return [comment_safe(line) for line in lines]


def has_control(text: str) -> bool:
    return bool(_CONTROL.search(text))


def env_word(template: str) -> Raw:
    """An engine.env value as one shell word: literal text quoted, `${env:NAME}` / `${env:NAME:-default}`
    as `${NAME}` / `${NAME:-default}` expanded at launch."""
    parts: list[str | Raw] = []
    pos = 0
    for match in ENV_PATTERN.finditer(template):
        if match.start() > pos:
            parts.append(template[pos:match.start()])
        name, default = match.group(1), match.group(2)
        if default is None:
            parts.append(Raw(f'"${{{name}}}"'))
        else:
            # `${NAME:-word}` in double quotes: escape what double quotes would still expand.
            escaped = re.sub(r'([\\"$`])', r"\\\1", default)
            parts.append(Raw(f'"${{{name}:-{escaped}}}"'))
        pos = match.end()
    if pos < len(template) or not parts:
        parts.append(template[pos:])
    return word(*parts)


def env_references(template: str) -> list[str]:
    """Names a value reads from the launch environment without a default (they must be set there)."""
    return [m.group(1) for m in ENV_PATTERN.finditer(template) if m.group(2) is None]


def env_exports(env: dict[str, str]) -> str:
    """`export` lines for engine.env; a reference without a default must be set at launch."""
    lines = []
    for key, value in sorted(env.items()):
        for name in env_references(value):
            lines.append(f': "${{{name}:?set {name} in the environment (engine.env.{key} reads it)}}"\n')
        lines.append(f"export {key}={env_word(value)}\n")
    return "".join(lines)
