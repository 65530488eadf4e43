"""The NVIDIA Dynamo contract: the frontend / dynamo.trtllm flags and DynamoGraphDeployment fields trtbuild emits.

One YAML data file per Dynamo release (`dynamo-<version>.yaml`), written by hand from upstream text (the
release's PyPI wheel, the operator's Go types, upstream's example manifests), each fact naming its source.
Emitters read the flag names and the CRD facts from here; `trtbuild.deploy.dynamo` checks its manifests
against it. The TensorRT-LLM release the Dynamo image ships is `release.tensorrt_llm`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DATA_DIR = Path(__file__).parent
DEFAULT_DYNAMO_VERSION = "1.6.1"


@dataclass(frozen=True)
class DynamoContract:
    version: str
    data: dict[str, Any]
    path: Path

    def fact(self, source_id: str) -> str:
        """The upstream text a fact was read from (path@commit or wheel path#sha256)."""
        return str(self.data["sources"][source_id])

    @property
    def image(self) -> str:
        return str(self.data["release"]["image"])

    @property
    def tensorrt_llm(self) -> str:
        return str(self.data["release"]["tensorrt_llm"])

    def worker_flag(self, name: str) -> str:
        return str(self.data["trtllm_worker"]["flags"][name])

    def frontend_flag(self, name: str) -> str:
        return str(self.data["frontend"]["flags"][name])

    @property
    def graph(self) -> dict[str, Any]:
        return dict(self.data["graph_deployment"])


def dynamo_contract_files() -> list[Path]:
    return sorted(DATA_DIR.glob("dynamo-*.yaml"))


def load_dynamo_contract(version: str = DEFAULT_DYNAMO_VERSION) -> DynamoContract:
    path = DATA_DIR / f"dynamo-{version}.yaml"
    if not path.is_file():
        known = ", ".join(p.stem.removeprefix("dynamo-") for p in dynamo_contract_files())
        raise ValueError(f"no Dynamo contract for {version!r} (known: {known})")
    data = yaml.safe_load(path.read_text())
    if str(data.get("version")) != version:
        raise ValueError(f"{path.name}: version {data.get('version')!r} != file name's {version!r}")
    return DynamoContract(version=version, data=data, path=path)
