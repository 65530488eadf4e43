"""Loading a contract data file into a typed, read-only object.

The data files are the facts; this module only gives them names. A fact is cited by its source id
(`sources:` in the file) and rendered as the upstream path@commit in every violation message.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from trtbuild.core.errors import UserError

DATA_DIR = Path(__file__).parent
# The release inside the Triton image the deploy stage names by default (tritonserver:26.07-trtllm-python-py3:
# the newest image whose TensorRT-LLM has a contract; trtllm-1.2.1.yaml, release.triton_images).
DEFAULT_VERSION = "1.2.1"


@dataclass(frozen=True)
class Violation:
    """One thing trtbuild emits that the selected release would reject or ignore."""

    field: str  # what was emitted, e.g. llm_api_options.yaml:speculative_config.decoding_type
    message: str
    fact: str  # upstream path@commit the rule was read from

    def line(self) -> str:
        return f"{self.field}: {self.message} (upstream: {self.fact})"


class Contract:
    """Read-only view of one release's data file."""

    def __init__(self, data: dict[str, Any], path: Path) -> None:
        self.data = data
        self.path = path
        self.version: str = str(data["version"])
        self.sources: dict[str, str] = data["sources"]

    def fact(self, source_id: str | None) -> str:
        """The upstream path@commit of a source id (the id itself if it is not declared)."""
        if not source_id:
            return f"{self.path.name}"
        return self.sources.get(source_id, source_id)

    def section(self, name: str) -> dict[str, Any]:
        value = self.data.get(name)
        return value if isinstance(value, dict) else {}

    # --- names emitters write -------------------------------------------------------------------

    @property
    def eagle3_decoding_type(self) -> str:
        return str(self.section("speculative")["eagle3_decoding_type"])

    @property
    def draft_model_key(self) -> str:
        return str(self.section("speculative")["draft_model_key"])

    @property
    def serve_options_flag(self) -> str:
        return str(self.section("trtllm_serve")["options_file_flag"])

    @property
    def bench_options_flag(self) -> str:
        return str(self.section("trtllm_bench")["options_file_flag"])

    @property
    def draft_layer_prefix(self) -> str:
        return str(self.section("eagle3_draft")["layer_prefix"])

    @property
    def trtllm_build_available(self) -> bool:
        return bool(self.section("trtllm_build").get("available"))

    @property
    def triton_inputs(self) -> list[tuple[str, str, list[int], bool]]:
        return [(str(n), str(t), list(d), bool(o)) for n, t, d, o in self.section("triton_llmapi")["inputs"]]

    @property
    def triton_outputs(self) -> list[tuple[str, str, list[int]]]:
        return [(str(n), str(t), list(d)) for n, t, d in self.section("triton_llmapi")["outputs"]]

    def request_field(self, name: str) -> str:
        """The Triton LLM-API model's input name for a trtbuild request field (max_tokens, stream, ...)."""
        return str(self.section("triton_llmapi")["request"][name])

    @property
    def request_fields(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.section("triton_llmapi")["request"].items()}

    @property
    def custom_module_flag(self) -> str | None:
        """trtllm-serve's option that imports an out-of-tree module directory (None: the release has none)."""
        flag = self.section("custom_modules").get("serve_flag")
        return str(flag) if flag else None

    @property
    def fp8_linear(self) -> dict[str, Any]:
        """The FP8 linear's class / method names and signatures the GEMM-plugin module patches."""
        return self.section("fp8_linear")

    @property
    def python_pins(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.section("release").get("python", {}).items()}


def contract_files() -> list[Path]:
    return sorted(DATA_DIR.glob("trtllm-*.yaml"))


def available_versions() -> list[str]:
    return [p.stem.removeprefix("trtllm-") for p in contract_files()]


# What the GEMM-plugin module needs of a release's fp8_linear section (plugins/trtllm_module/patch.py).
MODULE_KEYS = ("module", "linear_class", "fp8_method_class", "apply_params", "load_hook", "output_buffer_kind",
               "min_latency")


def module_conventions() -> dict[str, dict[str, Any]]:
    """{version: {version_match, linear, source}} of every contract: what the bundle's module ships, so
    that it picks the convention of the TensorRT-LLM it finds at run time (from its distribution metadata,
    never from the half-imported package)."""
    out: dict[str, dict[str, Any]] = {}
    for version in available_versions():
        contract = load_contract(version)
        linear = contract.fp8_linear
        if not linear:
            continue
        out[version] = {"version_match": str(linear["version_match"]), "source": contract.fact(linear.get("source")),
                        "linear": {k: linear[k] for k in MODULE_KEYS if k in linear}}
    return out


@cache
def load_contract(version: str = DEFAULT_VERSION) -> Contract:
    """The contract of `version` (e.g. "1.1.0"); a UserError names the versions there are."""
    import yaml

    path = DATA_DIR / f"trtllm-{version}.yaml"
    if not path.is_file():
        raise UserError(f"no TensorRT-LLM contract for version {version!r}", field="engine.trtllm_version",
                        fix=f"use one of: {', '.join(available_versions())} (docs/gpu-path.md: adding a release)")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or str(data.get("version")) != version:
        raise UserError(f"contract file {path.name} does not declare version {version!r}",
                        file=str(path), field="version")
    return Contract(data, path)
