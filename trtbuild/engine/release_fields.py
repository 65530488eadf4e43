"""Options a release's contract does not confirm: never written for it, refused in one line.

A contract's `llm_args.not_at_release` maps an options-file field (dotted, e.g.
`kv_cache_config.tokens_per_block`) to the recipe setting that writes it. The field was seen only in
upstream snapshots from after the release branched, not at the release tag (contract sources), so a
bundle for that release leaves it out and a recipe that needs it is refused before anything is built.
"""

from __future__ import annotations

from typing import Any

from trtbuild.core.contract import Contract
from trtbuild.core.errors import UserError


def withheld(contract: Contract) -> dict[str, str]:
    """options-file field -> recipe setting, for the fields this release's bundle never writes."""
    section = contract.section("llm_args").get("not_at_release") or {}
    return {str(k): str(v) for k, v in section.items()}


def refuse_unless_written(contract: Contract, field: str, value: Any, default: Any) -> None:
    """Raise the one-line UserError when a recipe asks for `field` at a non-default `value` and the
    release withholds it."""
    recipe_setting = withheld(contract).get(field)
    if recipe_setting is None or value == default:
        return
    llm = contract.section("llm_args")
    raise UserError(
        f"{value!r} needs {field} in llm_api_options.yaml, which TensorRT-LLM "
        f"{contract.version} is not known to have (upstream: {contract.fact(llm.get('not_at_release_source'))})",
        field=recipe_setting,
        fix=f"leave it at {default!r}, or set engine.trtllm_version to a release whose contract has it")
