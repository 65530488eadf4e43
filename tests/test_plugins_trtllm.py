"""The TensorRT-LLM Python plugins: valid Python that registers the right name and launches the
plugin's own Triton kernel (tensorrt_llm is not installable here, so the source is inspected)."""

from __future__ import annotations

import ast
import importlib
import importlib.util

import pytest

from trtbuild import plugins


def plugin_class(tree: ast.Module) -> ast.ClassDef:
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    assert len(classes) == 1
    return classes[0]


@pytest.mark.parametrize("name", plugins.available())
def test_trtllm_plugin_source(name: str) -> None:
    plugin = plugins.get(name)
    source = plugin.trtllm_python_plugin
    tree = ast.parse(source)
    cls = plugin_class(tree)

    # @trtllm_plugin("<name>") on a PluginBase subclass.
    [decorator] = cls.decorator_list
    assert isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "trtllm_plugin"
    assert [a.value for a in decorator.args] == [plugin.trtllm_plugin_name]
    assert [ast.unparse(b) for b in cls.bases] == ["PluginBase"]
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    assert {"__init__", "shape_dtype_inference", "forward"} <= methods.keys()
    # trtllm_plugin() reads this annotation at class creation: it must be the class, not a string.
    assert ast.unparse(methods["shape_dtype_inference"].returns) == "SymTensor"
    assert not any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body)

    imports = {alias.asname or alias.name: node.module for node in tree.body
               if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert imports["PluginBase"] == "tensorrt_llm"
    assert imports["trtllm_plugin"] == imports["SymTensor"] == "tensorrt_llm.python_plugin"

    # forward launches the same Triton kernel object the plugin's torch op and AOT build use.
    calls = [n for n in ast.walk(methods["forward"]) if isinstance(n, ast.Call)
             and ast.unparse(n.func) == "launch_fp8_gemm"]
    assert len(calls) == 1
    kernel_name = ast.unparse(calls[0].args[0])
    launched = getattr(importlib.import_module(imports[kernel_name]), kernel_name)
    assert launched is plugin.triton_kernel()
    launcher = importlib.import_module(imports["launch_fp8_gemm"]).launch_fp8_gemm
    assert launcher.__module__ == "plugins.common.launch"
    keywords = {kw.arg: ast.unparse(kw.value) for kw in calls[0].keywords}
    assert keywords.get("out") == "out"  # writes TensorRT's output buffer
    assert (keywords.get("tma") == "True") == plugin.uses_tma


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None, reason="tensorrt_llm installed")
def test_plugin_module_needs_tensorrt_llm_and_registry_does_not_import_it() -> None:
    for name in plugins.available():
        plugins.get(name)
        with pytest.raises(ModuleNotFoundError, match="tensorrt_llm"):
            importlib.import_module(plugins.get(name).trtllm_plugin_module)
