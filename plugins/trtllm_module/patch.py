"""The patch of TensorRT-LLM's Linear / FP8QDQLinearMethod, written against recorded conventions.

`config` (the bundle's config.json) carries everything that differs per deployment and release:

    kernels      {arch: plugin}                  which kernel each GPU arch runs
    linears      ["attention", "dense"]          which FP8 linears use it
    max_tokens   16                              the plugin path's largest token count
    o_proj_in_features / down_proj_in_features   per-rank in_features telling o_proj from down_proj
    releases     {version: convention}           every contract's fp8_linear (see select_release)
    cpu_arch     (tests only) the arch whose tiles CPU tensors get
    cpu_kernel   (tests only) "interpret": CPU tensors run the Triton kernel in the interpreter instead
                 of the op's torch reference, so a kernel that cannot be built fails as on a GPU

One copy of each weight: on releases whose apply has no output-buffer argument (1.1, 1.2), the shuffled
tensor replaces TensorRT-LLM's weight after load (TensorRT-LLM's tensor is released) and the plugin's
kernel serves every token count of that linear, prefill included; it is unshuffled back whenever
TensorRT-LLM needs it (a reload, a call the kernel cannot take, a kernel that cannot run here). Config
`own_weight: false` keeps both copies (the plugin then serves up to `max_tokens` only).

The module never stops the server: a kernel that cannot be built or run by the installed Triton, a
TensorRT-LLM whose classes differ from the recorded convention, or a failing weight shuffle each log
one line and leave TensorRT-LLM's own GEMM in place.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import os
import sys
import weakref
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG = logging.getLogger("trtbuild_gemm")
_STATE_ATTR = "_trtbuild_gemm"
_PATCHED_FLAG = "__trtbuild_gemm_patched__"
_COUNTS: Counter = Counter()  # "prepared:<kernel>:<role>", "plugin", "own", "skipped:<why>", "fallback:<kernel>"
_BROKEN: dict[str, str] = {}  # kernel -> why it cannot run here (every later call keeps TensorRT-LLM's GEMM)
_PREPARED: weakref.WeakSet = weakref.WeakSet()  # linears holding a shuffled copy (freed when their kernel breaks)
_SHAPES: Counter = Counter()  # (kernel, role, n, k) of every linear prepared in this process
_ANNOUNCED: list[bool] = [False]  # the startup line (startup.announce) is written once per process


class ConventionError(RuntimeError):
    """The installed TensorRT-LLM does not match the convention the bundle was written for."""


# --- which release ----------------------------------------------------------------------------------

def _major_minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    digits = ["".join(ch for ch in p if ch.isdigit()) or "0" for p in parts[:2]]
    return int(digits[0]), int(digits[1]) if len(digits) > 1 else 0


def installed_version() -> str:
    """The installed TensorRT-LLM's release, without touching the `tensorrt_llm` package object.

    The linear module is imported while `tensorrt_llm/__init__.py` still runs (1.1 and 1.2 import
    `_torch.models` before `from .version import __version__`), so `tensorrt_llm.__version__` may not
    exist yet: read the distribution's metadata, else the package's own version module."""
    try:
        return importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:  # a source checkout on sys.path
        return str(importlib.import_module("tensorrt_llm.version").__version__)


def select_release(version: str, releases: dict[str, dict[str, Any]]) -> str:
    """The key of the convention for an installed release (`version_match`: "1.1", "1.2" or ">=1.3")."""
    for key, conv in releases.items():
        match = str(conv.get("version_match", ""))
        if match.startswith(">="):
            if _major_minor(version) >= _major_minor(match[2:]):
                return key
        elif match and (version == match or version.startswith(match + ".")):
            return key
    known = ", ".join(f"{k} ({v.get('version_match')})" for k, v in releases.items())
    raise ConventionError(f"trtbuild_gemm: no recorded TensorRT-LLM convention matches version {version} "
                          f"(recorded: {known}); rebuild the bundle for this release or set TRTBUILD_GEMM=off")


# --- the per-linear state ---------------------------------------------------------------------------

@dataclass
class _Plugin:
    kernel: str
    op: Any  # torch.ops.trtbuild.<op>
    weight: Any  # [NT, KT, BN, BK] fp8, shuffled from the linear's weight at load
    n: int
    k: int
    max_tokens: int
    role: str
    min_tokens: int = 1  # above what TensorRT-LLM's min-latency kernels take (they bypass quant_method.apply)
    owns_weight: bool = False  # TensorRT-LLM's [N, K] tensor was released: the plugin serves every token count


def _role(linear: Any, config: dict[str, Any]) -> str | None:
    """attention (fused qkv, o_proj) or dense (fused gate_up, down_proj); None when unknown."""
    mode = getattr(getattr(linear, "weights_loading_config", None), "weight_mode", None)
    mode = getattr(mode, "value", mode)
    if mode == "fused_qkv_linear":
        return "attention"
    if mode == "fused_gate_up_linear":
        return "dense"
    in_features = getattr(linear, "in_features", None)
    is_o = in_features in config.get("o_proj_in_features", ())
    is_down = in_features in config.get("down_proj_in_features", ())
    if is_o and is_down:
        return "attention|dense"
    return "attention" if is_o else "dense" if is_down else None


def _arch_of(device: Any, config: dict[str, Any]) -> str | None:
    if device.type != "cuda":
        return config.get("cpu_arch")
    import torch

    from ..common.arch import arch_of_capability

    return arch_of_capability(*torch.cuda.get_device_capability(device))


def _matches(linear: Any, rule: dict[str, Any]) -> bool:
    for key, want in rule.items():
        if key in ("linear", "tokens"):
            continue
        have = getattr(linear, "in_features" if key == "in_features_multiple_of" else key, None)
        if have is None or (have % want != 0 if key == "in_features_multiple_of" else have != want):
            return False
    return True


def first_plugin_token(linear: Any, min_latency: dict[str, Any] | None) -> int:
    """The smallest token count at which `linear` calls quant_method.apply: 1, or for a Llama 4
    min-latency linear one more than its own kernels take (contract: fp8_linear.min_latency)."""
    if not min_latency or not any(c.__name__ == min_latency["linear_class"] for c in type(linear).__mro__):
        return 1
    for rule in min_latency["own_kernels_up_to"]:
        if _matches(linear, rule):
            return int(rule["tokens"]) + 1
    return 1


def prepare(linear: Any, method_cls: type, config: dict[str, Any],
            min_latency: dict[str, Any] | None = None, own_weight: bool = False) -> _Plugin | None:
    """Shuffle a selected FP8 linear's weight into the plugin layout (once per weight load); nothing for a
    linear that never reaches quant_method.apply at the plugin's token counts.

    `own_weight` (releases whose apply has no output-buffer argument, config `own_weight` not false): when
    TensorRT-LLM calls apply for every token count of this linear (no min-latency kernels of its own), the
    shuffled tensor replaces TensorRT-LLM's weight, which is released: one copy per linear. Its kernel then
    serves prefill too; if it cannot run, the weight is unshuffled back (`_restore`)."""
    import torch

    from ..common.arch import ARCHS
    from ..common.layout import shuffle

    _restore(linear)
    linear.__dict__.pop(_STATE_ATTR, None)
    if type(getattr(linear, "quant_method", None)) is not method_cls:
        return None
    role = _role(linear, config)
    wanted = set(config.get("linears", ()))
    if role is None or not wanted & set(role.split("|")):
        _COUNTS[f"skipped:role {role}"] += 1
        return None
    weight, weight_scale = getattr(linear, "weight", None), getattr(linear, "weight_scale", None)
    if weight is None or weight.dtype != torch.float8_e4m3fn or weight.dim() != 2 or \
            weight_scale is None or weight_scale.numel() != 1:
        _COUNTS["skipped:not per-tensor fp8"] += 1
        return None
    if getattr(linear, "input_scale", None) is None or getattr(linear, "force_dynamic_quantization", False):
        _COUNTS["skipped:dynamic input scale"] += 1  # apply would never take the plugin path
        return None
    arch = _arch_of(weight.device, config)
    kernel = config.get("kernels", {}).get(arch) if arch else None
    if kernel is None:
        _COUNTS[f"skipped:no kernel for {arch}"] += 1
        return None
    if kernel in _BROKEN:
        _COUNTS[f"skipped:{kernel} cannot run here"] += 1
        return None
    first = first_plugin_token(linear, min_latency)
    if first > int(config["max_tokens"]):
        _COUNTS["skipped:min-latency kernels"] += 1  # TensorRT-LLM's own kernels take all of 1..max_tokens
        return None
    spec = ARCHS[arch]
    n, k = weight.shape
    with torch.no_grad():
        shuffled = shuffle(weight.detach(), spec.block_n, spec.block_k)
    state = _Plugin(kernel, _kernel_call(kernel, weight.device, config), shuffled, int(n), int(k),
                    int(config["max_tokens"]), role, first)
    linear.__dict__[_STATE_ATTR] = state
    _PREPARED.add(linear)
    if own_weight and first == 1 and config.get("own_weight", True):
        _release(linear, state)
    if not any(key.startswith("prepared:") for key in _COUNTS):
        LOG.info("trtbuild_gemm: FP8 %s linears run %s for <= %d tokens", "/".join(sorted(wanted)),
                 kernel, state.max_tokens)
    _COUNTS[f"prepared:{kernel}:{role}"] += 1
    _SHAPES[(kernel, role, int(n), int(k))] += 1
    return state


def _release(linear: Any, state: _Plugin) -> None:
    """Drop TensorRT-LLM's [N, K] weight storage (the Parameter object stays, holding an empty tensor):
    the shuffled tensor is the only copy. The CUDA caching allocator gets the block back at once, so
    the KV cache TensorRT-LLM sizes after loading can take it."""
    import torch

    weight = linear.weight
    weight.data = torch.empty((0, state.k), dtype=weight.dtype, device=weight.device)
    state.owns_weight = True
    _COUNTS["weight released"] += 1
    if weight.device.type == "cuda":
        torch.cuda.empty_cache()


def _restore(linear: Any) -> None:
    """Give a linear whose weight the plugin owns its standard [N, K] tensor back (unshuffled), before
    TensorRT-LLM reads or reloads it, or when its kernel cannot run; the plugin state stays."""
    from ..common.layout import unshuffle

    state = linear.__dict__.get(_STATE_ATTR)
    if state is None or not state.owns_weight:
        return
    linear.weight.data = unshuffle(state.weight, state.n, state.k)
    state.owns_weight = False
    _COUNTS["weight restored"] += 1


def _kernel_call(kernel: str, device: Any, config: dict[str, Any]) -> Any:
    """torch.ops.trtbuild.<op> (the Triton kernel on CUDA); on CPU, the kernel itself in Triton's
    interpreter when config says cpu_kernel: interpret (tests), else the op (its torch reference)."""
    from ..common.kernels import run, torch_op

    if device.type != "cuda" and config.get("cpu_kernel") == "interpret":
        return functools.partial(run, kernel)
    return torch_op(kernel)


def _give_up(kernel: str, exc: BaseException) -> None:
    """The kernel cannot be built or run by this process's Triton: one line, then TensorRT-LLM's GEMM
    for every linear that used it (their shuffled copies are dropped)."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    _BROKEN[kernel] = f"{type(exc).__name__}: {first}"
    for linear in list(_PREPARED):
        state = linear.__dict__.get(_STATE_ATTR)
        if state is not None and state.kernel == kernel:
            _restore(linear)
            del linear.__dict__[_STATE_ATTR]
    LOG.warning("trtbuild_gemm: %s cannot run with this Triton (%s); FP8 linears use TensorRT-LLM's own GEMM",
                kernel, _BROKEN[kernel])


def _run_plugin(state: _Plugin, module: Any, input: Any, bias: Any) -> Any:
    import torch

    if input.dtype == torch.float8_e4m3fn:
        qinput = input
    else:
        qinput, _ = torch.ops.tensorrt_llm.static_quantize_e4m3_per_tensor(input, module.input_scale)
    out_dtype = module.dtype or input.dtype
    y = state.op(qinput, state.weight, module.input_scale, module.weight_scale, state.n, state.k, out_dtype)
    if bias is not None:
        y = y + bias
    return y


# --- the patch --------------------------------------------------------------------------------------

def _check(conv: dict[str, Any], linear_cls: type, method_cls: type) -> None:
    """Raise ConventionError unless the classes have the recorded methods and parameters."""
    apply_params = list(inspect.signature(method_cls.apply).parameters)
    want = list(conv["apply_params"])
    problems = []
    if apply_params[:len(want)] != want:
        problems.append(f"{method_cls.__name__}.apply takes {apply_params}, recorded {want}")
    hook = conv["load_hook"]
    owner = linear_cls if hook["owner"] == conv["linear_class"] else method_cls
    if not callable(getattr(owner, hook["method"], None)):
        problems.append(f"{owner.__name__} has no {hook['method']}")
    elif list(inspect.signature(getattr(owner, hook["method"])).parameters)[:len(hook["params"])] != \
            list(hook["params"]):
        problems.append(f"{owner.__name__}.{hook['method']} does not take {hook['params']}")
    if problems:
        raise ConventionError("trtbuild_gemm: TensorRT-LLM differs from the recorded convention: "
                              + "; ".join(problems) + " (rebuild the bundle for this release, or set "
                              "TRTBUILD_GEMM=off to serve with TensorRT-LLM's own GEMMs)")


def _buffer_param(conv: dict[str, Any], signature: inspect.Signature) -> tuple[str, int, Any] | None:
    """(name, index in *args, default) of apply's output-buffer parameter, when the release has one.

    A non-default value asks for a special output buffer (an NCCL window feeding an all-reduce):
    that call keeps TensorRT-LLM's GEMM, which knows how to write there."""
    kind = conv.get("output_buffer_kind")
    if not kind:
        return None
    name = kind["param"]
    names = list(signature.parameters)
    return name, names.index(name) - 4, signature.parameters[name].default  # after self, module, input, bias


def patch_linear_module(linear_module: Any, conv: dict[str, Any], config: dict[str, Any]) -> None:
    """Wrap FP8QDQLinearMethod.apply and the post-load hook of `linear_module` (once)."""
    linear_cls = getattr(linear_module, conv["linear_class"])
    method_cls = getattr(linear_module, conv["fp8_method_class"])
    if getattr(method_cls, _PATCHED_FLAG, False):
        return
    _check(conv, linear_cls, method_cls)
    own_apply = method_cls.apply
    buffer = _buffer_param(conv, inspect.signature(own_apply))

    @functools.wraps(own_apply)
    def apply(self: Any, module: Any, input: Any, bias: Any, *args: Any, **kwargs: Any) -> Any:
        if not _ANNOUNCED[0]:  # the first forward (TensorRT-LLM's warm-up at server start): say what runs
            _announce()
        state = module.__dict__.get(_STATE_ATTR)
        if state is not None and getattr(input, "dim", None) is not None and input.dim() >= 1:
            tokens = input.numel() // max(1, input.shape[-1])
            top = tokens if state.owns_weight else state.max_tokens  # one copy: prefill runs the kernel too
            if (state.min_tokens <= tokens <= top and module.input_scale is not None
                    and state.kernel not in _BROKEN
                    and not getattr(module, "force_dynamic_quantization", False)
                    and (buffer is None or kwargs.get(buffer[0], args[buffer[1]] if len(args) > buffer[1]
                                                     else buffer[2]) == buffer[2])):
                try:
                    y = _run_plugin(state, module, input, bias)
                except Exception as exc:  # the container's Triton cannot build it: serve on, without it
                    _give_up(state.kernel, exc)
                    _COUNTS[f"fallback:{state.kernel}"] += 1
                else:
                    _COUNTS["plugin"] += 1
                    return y
            elif state.owns_weight:  # a call the kernel cannot take: TensorRT-LLM gets its weight back
                _restore(module)
                _COUNTS["fallback:restored weight"] += 1
        _COUNTS["own"] += 1
        return own_apply(self, module, input, bias, *args, **kwargs)

    hook = conv["load_hook"]
    owner = linear_cls if hook["owner"] == conv["linear_class"] else method_cls
    own_hook = getattr(owner, hook["method"])

    own_weight = not conv.get("output_buffer_kind")  # an NCCL-window call needs TensorRT-LLM's weight

    @functools.wraps(own_hook)
    def post_load(self: Any, *args: Any, **kwargs: Any) -> Any:
        linear = self if owner is linear_cls else args[0]
        _restore(linear)  # TensorRT-LLM's own hook sees its weight
        result = own_hook(self, *args, **kwargs)
        try:
            prepare(linear, method_cls, config, conv.get("min_latency"), own_weight)
        except Exception as exc:  # never fail TensorRT-LLM's weight loading because of the plugin
            linear.__dict__.pop(_STATE_ATTR, None)
            if not _COUNTS[f"skipped:prepare failed: {type(exc).__name__}"]:
                LOG.warning("trtbuild_gemm: preparing a linear failed (%s: %s); it keeps TensorRT-LLM's GEMM",
                            type(exc).__name__, str(exc).splitlines()[0][:300] if str(exc) else "")
            _COUNTS[f"skipped:prepare failed: {type(exc).__name__}"] += 1
        return result

    own_load = getattr(linear_cls, "load_weights", None)
    if callable(own_load):
        @functools.wraps(own_load)
        def load_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
            _restore(self)  # a weight update copies into TensorRT-LLM's [N, K] tensor: give it back first
            return own_load(self, *args, **kwargs)

        linear_cls.load_weights = load_weights
    method_cls.apply = apply
    setattr(owner, hook["method"], post_load)
    setattr(method_cls, _PATCHED_FLAG, True)


# --- installing -------------------------------------------------------------------------------------

class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches a module right after it executes (TensorRT-LLM's linear module may load later)."""

    def __init__(self, targets: dict[str, Any]) -> None:
        self.targets = targets  # module name -> callback(module)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.targets:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, self.targets[name])
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, callback: Any) -> None:
        self.inner, self.callback = inner, callback

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        self.callback(module)


def _on_linear_import(config: dict[str, Any]) -> Any:
    def callback(module: Any) -> None:
        # Runs inside `import tensorrt_llm` (its __init__ imports the models, hence this module, before
        # its version): never read the half-initialised package, and never fail its import.
        try:
            version = installed_version()
            _COUNTS[f"installed:{version}"] += 1
            key = select_release(version, config["releases"])
            patch_linear_module(module, config["releases"][key]["linear"], config)
        except Exception as exc:
            _COUNTS[f"skipped:{type(exc).__name__}"] += 1
            LOG.error("trtbuild_gemm: not patching TensorRT-LLM (%s); FP8 linears use its own GEMM", exc)
            return
        _COUNTS[f"release:{key}"] += 1
    return callback


def _announce() -> None:
    _ANNOUNCED[0] = True
    try:
        from .startup import announce

        announce(LOG, dict(_COUNTS), dict(_SHAPES), dict(_BROKEN))
    except Exception as exc:  # never fail a forward because of the report
        LOG.warning("trtbuild_gemm: no startup summary (%s: %s)", type(exc).__name__, exc)


def _own_handler() -> None:
    """A stderr handler of the module's own: neither trtllm-serve nor Triton's python backend configures
    Python logging, so without it the module's lines would not show (failures included)."""
    if not any(getattr(h, "_trtbuild_gemm", False) for h in LOG.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._trtbuild_gemm = True  # type: ignore[attr-defined]
        LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    LOG.propagate = False


def install(config: dict[str, Any]) -> None:
    """Patch TensorRT-LLM's linear module now if imported, else when it is (idempotent)."""
    _own_handler()
    if os.environ.get("TRTBUILD_GEMM", "on").lower() in ("0", "off", "false", "no"):
        LOG.info("trtbuild_gemm: off (TRTBUILD_GEMM); FP8 linears keep TensorRT-LLM's GEMM")
        return
    modules = {conv["linear"]["module"] for conv in config["releases"].values()}
    callback = _on_linear_import(config)
    pending = {}
    for name in modules:
        if name in sys.modules:
            callback(sys.modules[name])
        else:
            pending[name] = callback
    if pending and not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(pending))


def install_from_file(path: str | Path) -> None:
    install(json.loads(Path(path).read_text()))


def report() -> dict[str, int]:
    """Counts so far: prepared linears per kernel and role, plugin / own dispatches, skips."""
    return dict(_COUNTS)
