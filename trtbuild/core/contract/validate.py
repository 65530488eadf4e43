"""Check what trtbuild emits against a release's contract.

Every checker returns a list of `Violation`s (empty: accepted); `raise_first` turns the first into
the one-line UserError the CLI prints (exit 2). Nothing here imports torch or tensorrt_llm: draft
checkpoints are read from their safetensors headers.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trtbuild.core.contract.model import Contract, Violation
from trtbuild.core.errors import UserError
from trtbuild.core.safetensors_header import read_header

_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,),
                                       "list": (list, tuple, set), "dict": (dict,)}


def raise_first(violations: Iterable[Violation], fix: str | None = None) -> None:
    for violation in violations:
        raise UserError(violation.line(), fix=fix)


def _type_ok(value: Any, kind: str) -> bool:
    if kind in ("any", "section", "speculative"):
        return True
    allowed = _TYPES.get(kind, (object,))
    if isinstance(value, bool) and bool not in allowed:
        return False  # True is an int in Python, not in pydantic's strict-ish fields
    return isinstance(value, allowed)


def _check_value(where: str, value: Any, spec: Mapping[str, Any], fact: str) -> list[Violation]:
    if value is None:
        return [] if spec.get("nullable") or spec.get("type") not in ("section",) else \
            [Violation(where, "null is not accepted", fact)]
    kind = str(spec.get("type", "any"))
    if not _type_ok(value, kind):
        return [Violation(where, f"{value!r} is not a {kind}", fact)]
    out: list[Violation] = []
    enum = spec.get("enum")
    if enum is not None and value not in enum:
        out.append(Violation(where, f"{value!r} is not one of {', '.join(map(str, enum))}", fact))
    if "min" in spec and isinstance(value, int | float) and value < spec["min"]:
        out.append(Violation(where, f"{value} is below the minimum {spec['min']}", fact))
    if "max" in spec and isinstance(value, int | float) and value > spec["max"]:
        out.append(Violation(where, f"{value} is above the maximum {spec['max']}", fact))
    return out


# --- LLM() arguments ------------------------------------------------------------------------------

def check_llm_args(options: Mapping[str, Any], contract: Contract,
                   where: str = "llm_api_options.yaml") -> list[Violation]:
    """The keys of an options YAML / model.yaml (less triton_config) against the release's LLM()."""
    spec = contract.section("llm_args")
    fact = contract.fact(spec.get("source"))
    fields: dict[str, Any] = spec.get("fields", {})
    sections: dict[str, Any] = spec.get("sections", {})
    out: list[Violation] = []
    for key, value in options.items():
        field = f"{where}:{key}"
        if key not in fields:
            out.append(Violation(field, f"is not an LLM() argument of TensorRT-LLM {contract.version}", fact))
            continue
        out += _check_value(field, value, fields[key], fact)
        if fields[key].get("type") == "section" and isinstance(value, Mapping):
            out += _check_section(key, value, sections.get(key, {}), contract, field, fact)
        if fields[key].get("type") == "speculative" and value is not None:
            out += check_speculative(value, contract, field)
    return out


def _check_section(name: str, value: Mapping[str, Any], spec: Mapping[str, Any], contract: Contract,
                   where: str, fact: str) -> list[Violation]:
    out: list[Violation] = []
    for key, item in value.items():
        if key not in spec:
            out.append(Violation(f"{where}.{key}", f"is not a field of {name} in TensorRT-LLM {contract.version}",
                                 fact))
            continue
        out += _check_value(f"{where}.{key}", item, spec[key], fact)
    if name == "cuda_graph_config":
        out += _cuda_graph_rule(value, contract, where)
    return out


def _cuda_graph_rule(value: Mapping[str, Any], contract: Contract, where: str) -> list[Violation]:
    llm = contract.section("llm_args")
    rule = llm.get("rules", {}).get("cuda_graph_both")
    fact = contract.fact(llm.get("rules_source"))
    sizes, top = value.get("batch_sizes"), value.get("max_batch_size") or 0
    if not sizes or not top:
        return []
    if rule == "max_batch_size_must_equal_max" and top == max(sizes):
        return []
    if rule == "max_batch_size_must_equal_max":
        return [Violation(f"{where}.max_batch_size", f"{top} must equal max(batch_sizes) {max(sizes)} when "
                          "both are given", fact)]
    # batch_sizes_must_equal_generated: the release rejects the pair unless batch_sizes is exactly its
    # own generated list for max_batch_size; trtbuild never relies on that and writes one of the two.
    return [Violation(f"{where}", "batch_sizes and max_batch_size are both set; TensorRT-LLM "
                      f"{contract.version} rejects that unless batch_sizes equals the list it generates "
                      "from max_batch_size: give one of the two", fact)]


def check_speculative(spec: Mapping[str, Any], contract: Contract,
                      where: str = "llm_api_options.yaml:speculative_config") -> list[Violation]:
    """speculative_config: decoding type known to the release, its fields, the required ones."""
    section = contract.section("speculative")
    fact = contract.fact(section.get("source"))
    types: dict[str, Any] = section.get("decoding_types", {})
    kind = spec.get("decoding_type")
    if kind not in types:
        return [Violation(f"{where}.decoding_type", f"{kind!r} is not a decoding type of TensorRT-LLM "
                          f"{contract.version} (it knows {', '.join(types)})", fact)]
    known = types[kind]
    out: list[Violation] = []
    for key, value in spec.items():
        if key == "decoding_type":
            continue
        if key not in known.get("fields", []):
            out.append(Violation(f"{where}.{key}", f"is not a field of decoding type {kind} in TensorRT-LLM "
                                 f"{contract.version}", fact))
        elif key in known.get("positive", []) and (not isinstance(value, int) or value <= 0):
            out.append(Violation(f"{where}.{key}", f"{value!r} must be a positive integer for {kind}", fact))
    aliases = section.get("aliases", {})
    present = {aliases.get(k, k) for k in spec}
    for key in known.get("required", []):
        if key not in present:
            out.append(Violation(f"{where}.{key}", f"is required for decoding type {kind} in TensorRT-LLM "
                                 f"{contract.version}", fact))
    return out


# --- command lines --------------------------------------------------------------------------------

def check_serve_argv(argv: list[str], contract: Contract, where: str = "launch/serve.sh") -> list[Violation]:
    """Flags of a trtllm-serve command line (argv[0] is trtllm-serve)."""
    serve = contract.section("trtllm_serve")
    fact = contract.fact(serve.get("source"))
    options = set(serve.get("options", []))
    out: list[Violation] = []
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        flag = arg.split("=", 1)[0]
        if flag not in options:
            out.append(Violation(f"{where}:{flag}", f"is not a trtllm-serve option of TensorRT-LLM "
                                 f"{contract.version}", fact))
        if flag == "--backend" and i + 1 < len(argv) and argv[i + 1] not in serve.get("backends", []):
            out.append(Violation(f"{where}:--backend", f"{argv[i + 1]!r} is not a backend of TensorRT-LLM "
                                 f"{contract.version} (it has {', '.join(serve.get('backends', []))})",
                                 contract.fact(serve.get("backends_source", serve.get("source")))))
    return out


# --- Triton LLM-API model ------------------------------------------------------------------------

def check_model_yaml(data: Mapping[str, Any], contract: Contract,
                     where: str = "model.yaml") -> list[Violation]:
    triton = contract.section("triton_llmapi")
    fact = contract.fact(triton.get("model_yaml_source"))
    out: list[Violation] = []
    config = data.get("triton_config")
    if not isinstance(config, Mapping):
        return [Violation(f"{where}:triton_config", "is missing; the LLM-API model reads it at load", fact)]
    for key in config:
        if key not in triton.get("triton_config_keys", []):
            out.append(Violation(f"{where}:triton_config.{key}", "is not read by the LLM-API model", fact))
    for key in triton.get("triton_config_required", []):
        if key not in config:
            out.append(Violation(f"{where}:triton_config.{key}", "is required by the LLM-API model", fact))
    args = {k: v for k, v in data.items() if k != "triton_config"}
    return out + check_llm_args(args, contract, where)


def check_triton_io(inputs: Iterable[Mapping[str, Any]], contract: Contract,
                    where: str = "config.pbtxt") -> list[Violation]:
    """Declared inputs (name, data_type) must be the LLM-API model's inputs of this release."""
    triton = contract.section("triton_llmapi")
    fact = contract.fact(triton.get("io_source"))
    known = {name: dtype for name, dtype, _, _ in contract.triton_inputs}
    out: list[Violation] = []
    for row in inputs:
        dtype_value = row["data_type"]
        name, dtype = str(row["name"]), str(getattr(dtype_value, "name", dtype_value))
        if name not in known:
            out.append(Violation(f"{where}:input.{name}", f"is not an input of the LLM-API model of "
                                 f"TensorRT-LLM {contract.version}", fact))
        elif known[name] != dtype:
            out.append(Violation(f"{where}:input.{name}", f"data_type {dtype} but the model declares "
                                 f"{known[name]}", fact))
    return out


def check_triton_parameters(parameters: Mapping[str, Any], contract: Contract,
                            where: str = "config.pbtxt") -> list[Violation]:
    """config.pbtxt `parameters` of the LLM-API model: only those the release's model reads."""
    triton = contract.section("triton_llmapi")
    fact = contract.fact(triton.get("parameters_source", triton.get("model_yaml_source")))
    known = set(triton.get("parameters", []))
    return [Violation(f"{where}:parameters.{key}", f"is not read by the LLM-API model of TensorRT-LLM "
                      f"{contract.version}", fact) for key in parameters if key not in known]


def check_request(body: Mapping[str, Any], contract: Contract, where: str = "request") -> list[Violation]:
    """A generate / infer request body for the LLM-API model: every field must be one of its inputs."""
    triton = contract.section("triton_llmapi")
    fact = contract.fact(triton.get("request_source"))
    known = {name for name, _, _, _ in contract.triton_inputs}
    return [Violation(f"{where}:{key}", f"is not an input of the LLM-API model of TensorRT-LLM "
                      f"{contract.version}, which ignores it", fact)
            for key in body if key not in known]


# --- checkpoints ----------------------------------------------------------------------------------

def check_draft_tensors(names: Iterable[str], contract: Contract,
                        where: str = "draft/model.safetensors") -> list[Violation]:
    draft = contract.section("eagle3_draft")
    fact = contract.fact(draft.get("source"))
    names = set(names)
    prefixes = [p for p in draft.get("accepted_layer_prefixes", []) if any(n.startswith(p) for n in names)]
    out: list[Violation] = []
    if not prefixes:
        found = sorted({n.split(".", 2)[0] + "." + n.split(".", 2)[1] + "." for n in names if n.count(".") >= 2
                        and not n.startswith(("fc.", "norm.", "lm_head."))})
        return [Violation(where, f"decoder layer tensors are named {', '.join(found) or 'nothing'}*; TensorRT-LLM "
                          f"{contract.version} loads {draft.get('layer_prefix')}*", fact)]
    for name in draft.get("required_tensors", []):
        if name not in names:
            out.append(Violation(f"{where}:{name}", "is missing", fact))
    for name in draft.get("layer_tensors", []):
        if prefixes[0] + name not in names:
            out.append(Violation(f"{where}:{prefixes[0]}{name}", "is missing", fact))
    return out


def check_draft_dir(directory: Path, contract: Contract, where: str = "draft") -> list[Violation]:
    names: list[str] = []
    for file in sorted(Path(directory).glob("*.safetensors")):
        names += list(read_header(file))
    out = check_draft_tensors(names, contract, f"{where}/model.safetensors")
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        config = None
    if isinstance(config, dict):
        out += check_draft_config(config, contract, f"{where}/config.json")
        out += check_hf_config(config, contract, f"{where}/config.json", family="llama")
    return out


def check_draft_config(config: Mapping[str, Any], contract: Contract,
                       where: str = "draft/config.json") -> list[Violation]:
    """Keys the release's draft model reads from the draft's config.json with no default."""
    draft = contract.section("eagle3_draft")
    fact = contract.fact(draft.get("config_required_source"))
    return [Violation(f"{where}:{key}", f"is missing; TensorRT-LLM {contract.version}'s EAGLE-3 draft model "
                      "reads it without a default (AttributeError at load)", fact)
            for key in draft.get("config_required", []) if key not in config]


def _family(config: Mapping[str, Any]) -> str:
    kind = str(config.get("model_type") or "")
    return "llama4" if kind.startswith("llama4") else "llama"


def check_hf_config(config: Mapping[str, Any], contract: Contract, where: str = "target/config.json",
                    family: str | None = None) -> list[Violation]:
    """RoPE keys where the release's transformers reads them (top-level rope_theta / rope_scaling)."""
    hf = contract.section("hf_config")
    fact = contract.fact(hf.get("source"))
    family = family or _family(config)
    spec = hf.get(family, {})
    text = config.get("text_config") if spec.get("text_config") and isinstance(config.get("text_config"),
                                                                                 Mapping) else config
    prefix = f"{where}:" + ("text_config." if text is not config else "")
    out: list[Violation] = []
    if spec.get("rope_keys") != "top_level":
        return out
    params = text.get("rope_parameters") if isinstance(text.get("rope_parameters"), Mapping) else {}
    scaling = text.get("rope_scaling")
    has_rope = "rope_theta" in text or "rope_theta" in params or params
    for key in spec.get("required", []):
        if has_rope and key not in text:
            out.append(Violation(f"{prefix}{key}", "is missing at the top level (only in rope_parameters?); "
                                 f"the transformers of TensorRT-LLM {contract.version} falls back to its default",
                                 fact))
    kind = str(params.get("rope_type") or params.get("type") or "default")
    if kind != "default" and not (isinstance(scaling, Mapping) and (scaling.get("rope_type") or scaling.get("type"))):
        for key in spec.get("scaled_requires", []):
            out.append(Violation(f"{prefix}{key}", f"is missing but rope_parameters has rope_type {kind}; the "
                                 f"transformers of TensorRT-LLM {contract.version} would run without it", fact))
    return out


def check_plugin_sources(texts: Mapping[str, str], contract: Contract) -> list[Violation]:
    """Module sources shipped into the server ({path: text}) must not import what the release dropped."""
    plugins = contract.section("python_plugins")
    if plugins.get("plugin_base_exported") is not False:
        return []
    fact = contract.fact(plugins.get("source"))
    return [Violation(name, f"imports PluginBase from tensorrt_llm, which TensorRT-LLM "
                      f"{contract.version} no longer exports", fact)
            for name, text in texts.items() if "import PluginBase" in text or "tensorrt_llm.PluginBase" in text]


# --- the GEMM-plugin module ------------------------------------------------------------------------

def _flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


def check_module_launch(argv: list[str], python_path: str | None, module: str | None, contract: Contract,
                        where: str = "launch/serve.sh") -> list[Violation]:
    """How a trtllm-serve launch loads the bundle's GEMM-plugin module (`module`, None: no plugin).

    Releases whose trtllm-serve has a custom-module flag get it; every release gets the module's
    directory on PYTHONPATH, since the executor's MPI workers inherit sys.path but not imports."""
    section = contract.section("custom_modules")
    flag = contract.custom_module_flag
    fact = contract.fact(section.get("source"))
    out: list[Violation] = []
    passed = [v.removeprefix("./") for v in _flag_values(argv, "--custom_module_dirs")]
    if passed and flag != "--custom_module_dirs":
        out.append(Violation(f"{where}:--custom_module_dirs", f"trtllm-serve of TensorRT-LLM {contract.version} "
                             "has no such option (load the module through PYTHONPATH)", fact))
    if module is None:
        return out
    if flag and module not in [v.removeprefix("./") for v in _flag_values(argv, flag)]:
        out.append(Violation(f"{where}:{flag}", f"TensorRT-LLM {contract.version} imports out-of-tree modules "
                             f"with {flag}, but the command does not pass {module}", fact))
    if not python_path or not module.startswith(python_path.rstrip("/") + "/"):
        out.append(Violation(f"{where}:PYTHONPATH", f"must hold the module's directory: TensorRT-LLM "
                             f"{contract.version}'s executor workers get sys.path, not the server's imports "
                             f"({section.get('workers')})", contract.fact(section.get("workers_source"))))
    if not contract.fp8_linear:
        out.append(Violation("engine.gemm_plugin", f"the TensorRT-LLM {contract.version} contract records no "
                             "FP8-linear convention for the module to patch", contract.fact(None)))
    return out


def check_module_environment(script: str, python_path: str, contract: Contract, where: str,
                             *, triton: bool = False) -> list[Violation]:
    """A launcher script must export PYTHONPATH with the module's directory (`python_path` as written)."""
    section = contract.section("custom_modules")
    exported = [line for line in script.splitlines() if line.startswith("export PYTHONPATH=")]
    if any(python_path in line for line in exported):
        return []
    if triton:
        hook = section.get("triton_llmapi")
        why = (f"the LLM-API Triton model of TensorRT-LLM {contract.version} imports user code only as "
               f"{hook}" if hook else f"the LLM-API Triton model of TensorRT-LLM {contract.version} imports "
               "no user module")
        return [Violation(f"{where}:PYTHONPATH", f"does not hold {python_path}: {why}, so PYTHONPATH's "
                          "sitecustomize is the module's only way in", contract.fact(section.get("triton_source")))]
    return [Violation(f"{where}:PYTHONPATH", f"does not hold {python_path}: the executor workers of TensorRT-LLM "
                      f"{contract.version} import only what their environment brings "
                      f"({section.get('workers')})", contract.fact(section.get("workers_source")))]


# --- Llama 4 targets ---------------------------------------------------------------------------------

def check_llama4_target(config: Mapping[str, Any], contract: Contract,
                        where: str = "target/config.json") -> list[Violation]:
    """A Llama 4 target's config.json against the release's Llama 4 model classes: a registered
    architecture and the text_config it swaps in. (The keys it reads come through transformers'
    Llama4TextConfig, which defaults every absent one, so they are recorded, not required.)
    Other families: nothing to check here."""
    if _family(config) != "llama4":
        return []
    section = contract.section("llama4_model")
    if not section:
        return []
    fact = contract.fact(section.get("source"))
    out: list[Violation] = []
    archs = [str(a) for a in config.get("architectures") or []]
    registered = [str(a) for a in section.get("architectures", [])]
    if not any(a in registered for a in archs):
        out.append(Violation(f"{where}:architectures", f"{archs} has no model class in TensorRT-LLM "
                             f"{contract.version}'s PyTorch backend (Llama 4 loads as {registered} only)", fact))
    text = config.get("text_config")
    if section.get("needs_text_config") and not isinstance(text, Mapping):
        out.append(Violation(f"{where}:text_config", "is missing; TensorRT-LLM "
                             f"{contract.version}'s Llama 4 model builds from config.text_config", fact))
    return out


def _scalars(file: Path, header: Mapping[str, Any], names: Iterable[str]) -> dict[str, bytes]:
    """The raw bytes of small tensors (the F32 scalars an NVFP4 linear carries), read by offset."""
    out: dict[str, bytes] = {}
    with file.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        for name in names:
            start, end = header[name]["data_offsets"]
            f.seek(8 + length + start)
            out[name] = f.read(end - start)
    return out


def check_nvfp4_checkpoint(directory: Path, contract: Contract, where: str = "target") -> list[Violation]:
    """An NVFP4 checkpoint (hf_quant_config.json quant_algo NVFP4) against the release's NVFP4 loader:
    the config fields it reads, the group size, every NVFP4 linear's tensors (dtype, shape), the
    static input_scale where the release requires one, and equal input_scale / weight_scale_2 within
    each group of linears it fuses into one GEMM. Other checkpoints: nothing to check here."""
    spec = contract.section("nvfp4")
    quant_file = Path(directory) / "hf_quant_config.json"
    try:
        quant = json.loads(quant_file.read_text()).get("quantization") or {}
    except (OSError, json.JSONDecodeError, AttributeError):
        return []
    if not spec or quant.get("quant_algo") != spec["quant_algo"]:
        return []
    fact = contract.fact(spec.get("source"))
    config_fact = contract.fact(spec.get("config_source"))
    qwhere = f"{where}/hf_quant_config.json:quantization"
    out: list[Violation] = []
    if quant.get("group_size") != spec["group_size"]:
        out.append(Violation(f"{qwhere}.group_size", f"is {quant.get('group_size')!r}; TensorRT-LLM "
                             f"{contract.version}'s NVFP4 linear uses blocks of {spec['group_size']}", fact))
    if not isinstance(quant.get("exclude_modules", []), list):
        out.append(Violation(f"{qwhere}.exclude_modules", "is not a list of module names", config_fact))
    headers = {file: read_header(file) for file in sorted(Path(directory).glob("*.safetensors"))}
    where_of = {name: file for file, header in headers.items() for name in header}
    info = {name: headers[file][name] for name, file in where_of.items()}
    linears = sorted(name[:-len(".weight_scale_2")] for name in info if name.endswith(".weight_scale_2"))
    group = int(spec["group_size"])
    for prefix in linears:
        weight, scale = info.get(f"{prefix}.weight"), info.get(f"{prefix}.weight_scale")
        if weight is None or scale is None or weight["dtype"] != "U8" or scale["dtype"] != "F8_E4M3":
            out.append(Violation(f"{where}:{prefix}", "an NVFP4 linear needs a U8 weight (packed e2m1 pairs) and an "
                                 f"F8_E4M3 weight_scale; found {weight and weight['dtype']} / {scale and scale['dtype']}",
                                 fact))
            continue
        rows, half = weight["shape"]
        if (half * 2) % group or scale["shape"] != [rows, half * 2 // group]:
            out.append(Violation(f"{where}:{prefix}.weight_scale", f"has shape {scale['shape']} for a weight of "
                                 f"{rows} x {half * 2} (in_features must be a multiple of {group}: one scale per "
                                 f"{group})", fact))
        if spec.get("input_scale_required") and f"{prefix}.input_scale" not in info:
            out.append(Violation(f"{where}:{prefix}.input_scale", f"is missing; TensorRT-LLM {contract.version}'s "
                                 "NVFP4 linear takes a static (calibrated) input scale only", fact))
    for members in spec.get("fused_groups", []):
        parents = {p.rpartition(".")[0] for p in linears if p.rpartition(".")[2] in members}
        for parent in sorted(parents):
            names = [f"{parent}.{m}" for m in members if f"{parent}.{m}" in linears]
            for suffix in ("input_scale", "weight_scale_2"):
                keys = [f"{n}.{suffix}" for n in names if f"{n}.{suffix}" in info]
                values = {k: _scalars(where_of[k], headers[where_of[k]], [k])[k] for k in keys}
                if len(set(values.values())) > 1:
                    out.append(Violation(f"{where}:{parent}.{{{','.join(members)}}}.{suffix}", "differ; TensorRT-LLM "
                                         f"{contract.version} loads {', '.join(members)} into one GEMM and asserts "
                                         "they are equal", fact))
    return out
