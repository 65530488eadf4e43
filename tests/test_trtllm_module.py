"""The bundle's TensorRT-LLM module against stand-ins of each recorded release's calling convention.

TensorRT-LLM cannot be installed here, so tests/trtllm_standins/ holds a minimal stand-in of each
release's Linear / FP8QDQLinearMethod / loader loop, built from the signatures recorded in each
contract's fp8_linear section (trtbuild/core/contract/; stand-ins, not TensorRT-LLM). The module is the one a
bundle ships (written by trtbuild.engine.plugin_module.write_module) and runs in a fresh process
whose PYTHONPATH starts with the bundle's trtllm_module/, as a server's would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from trtbuild.core.contract import available_versions, module_conventions
from trtbuild.engine import plugin_module

STANDINS = Path(__file__).parent / "trtllm_standins"
RELEASES = {"1.1.0": "rel_1_1", "1.2.1": "rel_1_2_1", "main-0004396": "rel_main"}


def test_a_stand_in_for_every_contract() -> None:
    assert sorted(RELEASES) == sorted(available_versions())


def write_bundle_module(tmp: Path, kernels: dict[str, str] | None = None, **extra: str) -> Path:
    settings = SimpleNamespace(kernels=kernels or {"sm_90a": "spatial_partition"},
                               linears=["attention", "dense"], max_tokens=16)
    hf = {"hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
          "intermediate_size": 160}
    config = plugin_module.module_config(settings, hf, tensor_parallel=1)
    config["cpu_arch"] = next(iter(settings.kernels))  # CPU tensors get this arch's tiles (tests only)
    config.update(extra)
    plugin_module.write_module(tmp, config)
    return tmp / plugin_module.MODULE_DIR


def run_scenario(module_dir: Path, release: str, dtype: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(module_dir), str(STANDINS / RELEASES[release]), str(STANDINS)]))
    proc = subprocess.run([sys.executable, str(STANDINS / "scenario.py"), dtype], env=env, cwd=module_dir,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bundle_module(tmp_path_factory.mktemp("bundle"))


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_dispatch_and_load_time_shuffle(module_dir: Path, release: str) -> None:
    out = run_scenario(module_dir, release, "float32")
    assert out["report"][f"release:{release}"] == 1  # selected from tensorrt_llm.__version__
    assert out["imported"] == []  # nothing from trtbuild or the repository's plugins/ package
    # 1.1 / 1.2: one copy (the plugin owns the weight, TensorRT-LLM's tensor is released, its kernel serves
    # prefill too); main's apply can ask for an NCCL-window output only TensorRT-LLM's GEMM writes: two copies.
    one_copy = not release.startswith("main")
    for name, entry in out["linears"].items():
        assert entry["prepared"], name
        assert entry["kernel"] == "spatial_partition"
        assert entry["role"] == ("attention" if name in ("qkv_proj", "o_proj") else "dense")
        assert entry["owns_weight"] is one_copy
        assert entry["weight_layout"][1] == "torch.float8_e4m3fn"
        # The plugin's tensor is the tile layout of the weight TensorRT-LLM loads (tests pad to 128 x 128).
        assert entry["shuffled_equals_weight"] and entry["shuffled_is_layout_of_weight"]
        n, k = entry["weight_shape"]
        tiles = -(-n // 128) * 128 * (-(-k // 128) * 128)  # the shuffled tensor: [N, K] zero-padded to tiles
        if one_copy:  # one weight tensor per patched linear after post_load_weights: the plugin's
            assert entry["weight_layout"][0][0] == 0 and entry["fp8_bytes"] == tiles, entry
        else:
            assert entry["weight_layout"][0] == [n, k] and entry["fp8_bytes"] == n * k + tiles, entry
        for tokens, run in entry["runs"].items():
            plugin = one_copy or int(tokens) <= 16
            assert run["path"] == ("plugin" if plugin else "own"), (name, tokens)
            assert run["own_gemm_called"] is (not plugin), (name, tokens)
            assert run["dtype"] == "torch.float32"
            # Same fp8 operands, float32 accumulation on both paths: equal up to summation order.
            assert run["max_abs_vs_own"] <= 1e-5 * max(1.0, run["ref_scale"]), (name, tokens, run)
            assert run["max_abs_vs_ref"] <= 1e-5 * max(1.0, run["ref_scale"]), (name, tokens, run)
    assert out["three_d"] == {"shape": [2, 4, (4 + 2 * 2) * 24], "plugin": True}
    assert out["reload_reshuffled"]
    assert out["reload_fp8_bytes"] == out["linears"]["o_proj"]["fp8_bytes"]  # still one copy after a reload
    assert out["attention_only"] == {"qkv_proj": True, "o_proj": True, "gate_up_proj": False,
                                     "down_proj": False}
    assert out["deselected_weight_restored"]
    assert out["report"].get("weight released", 0) >= (4 if one_copy else 0)
    if release.startswith("main"):
        assert out["window_output_plugin"] is False


def test_bfloat16_outputs_match_within_one_rounding(module_dir: Path) -> None:
    out = run_scenario(module_dir, "1.1.0", "bfloat16")
    for entry in out["linears"].values():
        for run in entry["runs"].values():
            assert run["dtype"] == "torch.bfloat16"
            # bf16 keeps 8 bits: the two float32 sums may round to neighbouring bf16 values.
            assert run["max_abs_vs_own"] <= 2 ** -7 * run["ref_scale"] + 1e-6


def test_gemm_weight_shuffle_tiles(tmp_path: Path) -> None:
    module_dir = write_bundle_module(tmp_path, {"sm_89": "gemm_weight_shuffle"})
    out = run_scenario(module_dir, "1.1.0", "float32")
    for entry in out["linears"].values():
        assert entry["kernel"] == "gemm_weight_shuffle"
        assert entry["shuffled_equals_weight"]
        assert entry["runs"]["1"]["path"] == "plugin"


def test_release_selection_by_version() -> None:
    from plugins.trtllm_module.patch import ConventionError, select_release

    releases = module_conventions()
    assert select_release("1.1.0", releases) == "1.1.0"
    assert select_release("1.1.0rc5", releases) == "1.1.0"
    assert select_release("1.2.1", releases) == "1.2.1"
    assert select_release("1.2.0rc8", releases) == "1.2.1"
    assert select_release("1.3.0rc24", releases) == "main-0004396"
    with pytest.raises(ConventionError, match="no recorded TensorRT-LLM convention matches version 1.0.0"):
        select_release("1.0.0", releases)


def test_signature_drift_is_a_clear_error() -> None:
    from plugins.trtllm_module.patch import ConventionError, patch_linear_module

    class Method:
        def apply(self, module, input, bias, extra):  # noqa: ANN001, ANN201 - a drifted signature
            return None

    class Linear:
        def post_load_weights(self):  # noqa: ANN201
            return None

    fake = types.SimpleNamespace(Linear=Linear, FP8QDQLinearMethod=Method)
    conv = module_conventions()["main-0004396"]["linear"]
    with pytest.raises(ConventionError, match=r"Method.apply takes .* recorded"):
        patch_linear_module(fake, conv, {"releases": {}})


def test_off_switch_leaves_trtllm_alone(module_dir: Path) -> None:
    env = dict(os.environ, TRTBUILD_GEMM="off", PYTHONPATH=os.pathsep.join(
        [str(module_dir), str(STANDINS / "rel_1_1"), str(STANDINS)]))
    code = ("from tensorrt_llm._torch.modules import linear as L\n"
            "print(hasattr(L.FP8QDQLinearMethod.apply, '__wrapped__'))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_shipped_files_match_the_repository(module_dir: Path) -> None:
    package = module_dir / plugin_module.PACKAGE
    for rel in plugin_module.SHIPPED:
        if rel != "__init__.py":
            assert (package / rel).read_bytes() == (Path(__file__).parents[1] / "plugins" / rel).read_bytes()
    config = json.loads((package / "config.json").read_text())
    assert config["releases"] == module_conventions()
    assert config["o_proj_in_features"] == [96] and config["down_proj_in_features"] == [160]


def start_server(module_dir: Path, release: str, *args: str,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env or {}), PYTHONPATH=os.pathsep.join(
        [str(module_dir), str(STANDINS / RELEASES[release]), str(STANDINS)]))
    env.pop("TRTBUILD_GEMM", None)
    return subprocess.run([sys.executable, str(STANDINS / "server_start.py"), *args], env=env, cwd=module_dir,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_server_log_says_the_plugin_is_there(tmp_path: Path, module_dir: Path, release: str) -> None:
    """Issue 37.2: one line per server process, on stderr through the module's own handler (trtllm-serve and
    Triton configure no Python logging): the release, how many linears are patched, the kernel per shape,
    fallbacks; the same counts as JSON where TRTBUILD_GEMM_REPORT_DIR points."""
    reports = tmp_path / "reports"
    done = start_server(module_dir, release, env={"TRTBUILD_GEMM_REPORT_DIR": str(reports)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    lines = [line for line in done.stderr.splitlines() if "FP8 linears patched" in line]
    assert len(lines) == 1, done.stderr
    line = lines[0]
    installed = out["version"]
    assert line.startswith(f"trtbuild_gemm: pid {out['pid']}, TensorRT-LLM {installed} (convention {release})")
    assert ": 1 FP8 linears patched (attention 1)" in line  # server_start.py loads one o_proj
    assert "spatial_partition: 160x96 x1 attention" in line and "fallbacks: none" in line
    (report,) = reports.glob("trtbuild_gemm.*.json")
    data = json.loads(report.read_text())
    assert report.name == f"trtbuild_gemm.{out['pid']}.json"
    assert data["patched"] == 1 and data["convention"] == release and data["installed"] == installed
    assert data["kernels"] == {"spatial_partition": [{"n": 160, "k": 96, "role": "attention", "linears": 1}]}


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_server_comes_up_in_upstreams_import_order(module_dir: Path, release: str) -> None:
    """The stand-ins of 1.1.0 and 1.2.1 import the models (hence the linear module) before their version,
    as upstream's tensorrt_llm/__init__.py does (contract: package_import): the module picks the release
    from the distribution's metadata (or the version module) and patches, and the process comes up."""
    from trtbuild.core.contract import load_contract

    contract = load_contract(release)
    order = contract.section("package_import")
    if order:  # a release whose package imports the linear module before setting __version__
        assert "tensorrt_llm._torch.modules.linear" in order["before_version"]
        init = (STANDINS / RELEASES[release] / "tensorrt_llm" / "__init__.py").read_text()
        assert init.index("\nimport tensorrt_llm._torch.models") < init.index("\nfrom .version import __version__")
    done = start_server(module_dir, release)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["patched"] and out["prepared"]
    assert out["report"][f"release:{release}"] == 1 and out["report"]["plugin"] == 2
    assert out["max_abs_vs_own"] <= 1e-5 * max(1.0, out["ref_scale"])


def test_a_kernel_the_containers_triton_cannot_build_falls_back_with_one_line(tmp_path: Path) -> None:
    """The real launch path (patched apply -> the Triton kernel, run by the interpreter on CPU) with a
    Triton that lacks tl.make_tensor_descriptor (the TMA kernel cannot be built): one logged line, the
    call and every later one answered by TensorRT-LLM's own GEMM, the process keeps serving."""
    module_dir = write_bundle_module(tmp_path, cpu_kernel="interpret")
    working = start_server(module_dir, "1.2.1")
    assert working.returncode == 0, working.stderr[-3000:]
    ok = json.loads(working.stdout.strip().splitlines()[-1])
    assert ok["report"]["plugin"] == 2 and ok["max_abs_vs_own"] <= 1e-4 * max(1.0, ok["ref_scale"])

    broken = start_server(module_dir, "1.2.1", "no-descriptor")
    assert broken.returncode == 0, broken.stderr[-3000:]
    out = json.loads(broken.stdout.strip().splitlines()[-1])
    assert out["prepared"] and out["report"].get("plugin", 0) == 0
    assert out["report"]["fallback:spatial_partition"] == 1 and out["report"]["own"] == 2
    assert out["max_abs_vs_own"] == 0.0 and out["again_vs_own"] == 0.0
    lines = [line for line in broken.stderr.splitlines() if "cannot run" in line]
    assert len(lines) == 1 and "spatial_partition cannot run with this Triton" in lines[0], broken.stderr
    assert "make_tensor_descriptor" in lines[0]
    # The startup line (written at the first forward, before the failing call) and nothing else.
    assert [line for line in broken.stderr.splitlines() if "trtbuild_gemm" in line] == [
        line for line in broken.stderr.splitlines() if "FP8 linears patched" in line or "cannot run" in line
        or "linears run" in line]


def test_min_latency_linears_get_the_plugin_only_where_they_call_quant_method_apply(tmp_path: Path) -> None:
    """Maverick at tp 8 with enable_min_latency: TensorRT-LLM's Llama4MinLatencyLinear runs its own kernels
    for qkv up to 8 tokens and for gate_up / down up to 16 (contract: fp8_linear.min_latency). The module
    prepares qkv from 9 tokens, o_proj from 1, and no shuffled copy of gate_up / down; `plan` says the same."""
    from trtbuild.core.contract import load_contract

    settings = SimpleNamespace(kernels={"sm_90a": "spatial_partition"}, linears=["attention", "dense"],
                               max_tokens=16)
    maverick = json.loads((Path(__file__).parents[1] / "recipes" / "standins" / "llama-4-maverick-17b-128e"
                           / "config.json").read_text())
    config = plugin_module.module_config(settings, maverick, tensor_parallel=8)
    config["cpu_arch"] = "sm_90a"
    plugin_module.write_module(tmp_path, config)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path / plugin_module.MODULE_DIR), str(STANDINS / "rel_1_2_1"), str(STANDINS)]))
    proc = subprocess.run([sys.executable, str(STANDINS / "min_latency.py")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["prepared"] == {"qkv_proj": 9, "o_proj": 1, "gate_up_proj": None, "down_proj": None}
    assert out["report"]["skipped:min-latency kernels"] == 2
    paths = out["paths"]
    assert [paths[f"qkv_proj:{t}"] for t in (1, 8, 9, 16)] == ["min-latency kernel"] * 2 + ["plugin"] * 2
    assert [paths[f"o_proj:{t}"] for t in (1, 8, 9, 16)] == ["plugin"] * 4
    for name in ("gate_up_proj", "down_proj"):
        assert [paths[f"{name}:{t}"] for t in (1, 8, 9, 16)] == ["min-latency kernel"] * 4

    ranges = plugin_module.plugin_token_ranges(settings, maverick, 8, True, load_contract("1.2.1"))
    assert ranges == {"fused qkv": (9, 16), "o_proj": (1, 16), "fused gate_up": None, "down_proj": None}
    plain = plugin_module.plugin_token_ranges(settings, maverick, 8, False, load_contract("1.2.1"))
    assert set(plain.values()) == {(1, 16)}


def test_plan_lists_the_linears_that_really_call_the_plugin(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trtbuild.cli import main

    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    root = Path(__file__).parents[1] / "recipes"
    lines = {}
    for name in ("llama-4-maverick-fp8-eagle3-tp8", "llama-3.1-8b-instruct-fp8-eagle3"):
        main(["plan", str(root / f"{name}.yaml"), "--set", f"output_dir={tmp_path / name}"])
        lines[name] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  sm_90a:")]
    maverick, llama = lines["llama-4-maverick-fp8-eagle3-tp8"][0], lines["llama-3.1-8b-instruct-fp8-eagle3"][0]
    assert "fused qkv 9..16, o_proj 1..16 " in maverick
    assert "fused gate_up, down_proj never call quant_method.apply at 1..16 tokens" in maverick
    assert "fused qkv 1..16, o_proj 1..16, fused gate_up 1..16, down_proj 1..16 " in llama
    assert "never call" not in llama
