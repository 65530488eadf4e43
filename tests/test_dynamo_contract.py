"""The Dynamo 1.6.1 contract against the installed release: every flag it records is one that the installed
ai-dynamo 1.6.1 defines, every `sources` entry read from the wheel names the installed file's RECORD hash, and
the TensorRT-LLM pin is the wheel's own Requires-Dist."""

from __future__ import annotations

import ast
import base64
import hashlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trtbuild.core.contract.dynamo import load_dynamo_contract

dynamo_dist = pytest.importorskip("dynamo.frontend") and importlib.metadata.distribution("ai-dynamo")


def _site() -> Path:
    return Path(str(dynamo_dist.locate_file("")))


def _defined_flags(*relpaths: str) -> set[str]:
    """Every `flag_name=` / `obsolete_flag=` string and plain add_argument('--x') in the given wheel files."""
    flags: set[str] = set()
    for rel in relpaths:
        for path in sorted(_site().glob(rel)):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.keyword) and node.arg in {"flag_name", "obsolete_flag"}
                        and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                    flags.add(node.value.value)
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                    for arg in node.args:
                        if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                            flags.add(str(arg.value))
    return flags


def test_installed_release_is_the_contracts() -> None:
    contract = load_dynamo_contract()
    assert dynamo_dist.version == contract.version
    assert importlib.metadata.version("ai-dynamo-runtime") == contract.version


def test_wheel_sources_name_the_installed_files() -> None:
    contract = load_dynamo_contract()
    record = {}
    for line in (dynamo_dist.read_text("RECORD") or "").splitlines():
        path, digest, _size = line.rsplit(",", 2)
        record[path] = digest
    checked = 0
    for source_id, text in contract.data["sources"].items():
        m = re.match(r"pypi:ai-dynamo==([^:]+):(\S+?)#sha256=(\S+)", text)
        if not m:
            continue
        version, rel, digest = m.groups()
        assert version == contract.version, source_id
        assert record[rel] == f"sha256={digest}", f"{source_id}: RECORD says {record[rel]}"
        actual = base64.urlsafe_b64encode(hashlib.sha256((_site() / rel).read_bytes()).digest()).rstrip(b"=").decode()
        assert actual == digest, f"{source_id}: the installed {rel} is not the recorded file"
        checked += 1
    assert checked >= 5


def test_worker_flags_exist_in_dynamo_trtllm() -> None:
    contract = load_dynamo_contract()
    defined = _defined_flags("dynamo/trtllm/backend_args.py")
    assert "--model" in defined  # the parse found the group at all
    missing = {k: v for k, v in contract.data["trtllm_worker"]["flags"].items() if v not in defined}
    assert not missing, f"dynamo.trtllm 1.6.1 does not define {missing}"
    assert "--not-a-dynamo-flag" not in defined


def test_frontend_flags_and_choices_exist_in_dynamo_frontend() -> None:
    contract = load_dynamo_contract()
    defined = _defined_flags("dynamo/frontend/frontend_args.py", "dynamo/common/configuration/groups/*.py")
    missing = {k: v for k, v in contract.data["frontend"]["flags"].items() if v not in defined}
    assert not missing, f"dynamo.frontend 1.6.1 does not define {missing}"
    help_text = subprocess.run([sys.executable, "-m", "dynamo.frontend", "--help"], capture_output=True, text=True,
                               timeout=120, check=True).stdout
    fe = contract.data["frontend"]
    for flag, key in (("--router-mode", "router_modes"), ("--discovery-backend", "discovery_backends"),
                      ("--request-plane", "request_planes")):
        assert f"[{flag} {{{','.join(fe[key])}}}]" in help_text, f"{flag}: choices differ from the contract's {fe[key]}"


def test_trtllm_pin_is_the_wheels() -> None:
    contract = load_dynamo_contract()
    pins = [r for r in dynamo_dist.requires or [] if r.startswith("tensorrt-llm")]
    assert pins == [f"tensorrt-llm=={contract.tensorrt_llm}; extra == \"trtllm\""] or \
        pins == [f"tensorrt-llm=={contract.tensorrt_llm}; extra == 'trtllm'"], pins


def test_unknown_version_is_one_line() -> None:
    with pytest.raises(ValueError, match="no Dynamo contract for '0.0.0' .known: 1.6.1"):
        load_dynamo_contract("0.0.0")
