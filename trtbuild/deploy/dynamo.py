"""The dynamo target: the bundle served by NVIDIA Dynamo's frontend and `dynamo.trtllm` workers.

dynamo/engine_args/agg.yaml        the bundle's LLM() options for `--extra-engine-args` (paths under
dynamo/engine_args/prefill.yaml    deploy.dynamo.bundle_mount; no `model`: the workers get --model);
dynamo/engine_args/decode.yaml     prefill / decode add what upstream's disaggregated configs add
dynamo/dgd_agg.yaml                Kubernetes: a ConfigMap with the engine args and a DynamoGraphDeployment
dynamo/dgd_disagg.yaml             (nvidia.com/v1beta1): Frontend + workers, or Frontend + prefill + decode;
                                   each worker has tp x pp GPUs, the bundle from a PersistentVolumeClaim at
                                   bundle_mount, its plugin module on PYTHONPATH, the HF token from a Secret
launch/dynamo_node.sh              one GPU node: runs the image with the bundle mounted read-only and
launch/dynamo_in_container.sh      starts the frontend and the workers (`agg` or `disagg`) inside it

Every name (flags, CRD fields, image) comes from the Dynamo contract (trtbuild/core/contract/dynamo-*.yaml);
the engine args are checked against the TensorRT-LLM contract of the bundle's release and the manifests
against the CRD facts (check_graph_deployment).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtbuild.core.bundle_info import BundleInfo
from trtbuild.core.contract import Violation, load_contract
from trtbuild.core.contract import validate as cv
from trtbuild.core.contract.dynamo import DynamoContract, load_dynamo_contract
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.shell import comment_safe, default_assignment, quote
from trtbuild.deploy.config import DeployConfig
from trtbuild.deploy.repo_trtllm import llmapi_model_yaml
from trtbuild.engine.config import EngineConfig

ENGINE_ARGS_DIR = "/etc/trtbuild/engine-args"  # where the ConfigMap is mounted in the worker pods
CONTAINER_DYNAMO = "/opt/trtbuild/dynamo"  # where dynamo_node.sh mounts deploy/dynamo
CONTAINER_LAUNCH = "/opt/trtbuild/launch"
ROLES = ("agg", "prefill", "decode")


def graph_name(model_name: str, mode: str) -> str:
    """A Kubernetes object name from deploy.model_name: lowercase, '-' for anything else."""
    base = re.sub(r"[^a-z0-9-]+", "-", model_name.lower()).strip("-") or "llm"
    return f"{base[:50].rstrip('-')}-{mode}"


def engine_args(config: Any, bundle: BundleInfo, max_batch_size: int, role: str,
                dynamo: DynamoContract) -> dict[str, Any]:
    """The LLM() options a `dynamo.trtllm` worker of this role loads with --extra-engine-args."""
    mounted = config.model_copy(update={"trtllm": config.trtllm.model_copy(
        update={"bundle_mount": config.dynamo.bundle_mount})})
    args = llmapi_model_yaml(mounted, bundle, max_batch_size)
    args.pop("triton_config")
    args.pop("model")  # the worker's --model
    if role != "agg":
        for key, value in dynamo.data["engine_args"]["disaggregated"][role].items():
            args[key] = value
    return args


def check_engine_args(args: Mapping[str, Any], bundle: BundleInfo, dynamo: DynamoContract,
                      where: str) -> list[Violation]:
    contract = load_contract(bundle.trtllm_version)
    disagg = dynamo.data["engine_args"]["disaggregated"]
    extra = set(disagg["extra_keys"])
    out = cv.check_llm_args({k: v for k, v in args.items() if k not in extra}, contract, where)
    transceiver = args.get("cache_transceiver_config")
    if transceiver is not None:
        backend = transceiver.get("backend") if isinstance(transceiver, Mapping) else None
        if backend not in disagg["cache_transceiver_backends"]:
            out.append(Violation(f"{where}:cache_transceiver_config.backend",
                                 f"{backend!r} is none of {disagg['cache_transceiver_backends']}",
                                 dynamo.fact(disagg["source"])))
    return out


def worker_argv(config: Any, bundle: BundleInfo, dynamo: DynamoContract, role: str, engine_args_path: str) -> list[str]:
    flag = dynamo.worker_flag
    argv = [flag("model"), bundle.mapped(bundle.served, config.dynamo.bundle_mount),
            flag("served_model_name"), config.model_name,
            flag("extra_engine_args"), engine_args_path,
            flag("tensor_parallel_size"), str(bundle.tensor_parallel),
            flag("pipeline_parallel_size"), str(bundle.pipeline_parallel)]
    if role != "agg":
        argv += [flag("disaggregation_mode"), role]
    if config.dynamo.router_mode == "kv":
        argv.append(flag("publish_kv_events"))
    return argv


def frontend_argv(config: Any, dynamo: DynamoContract) -> list[str]:
    return [dynamo.frontend_flag("router_mode"), config.dynamo.router_mode]


def _worker_env(config: Any, bundle: BundleInfo) -> list[dict[str, str]]:
    env = [{"name": k, "value": str(v)} for k, v in sorted(bundle.env.items())]
    if bundle.python_path:  # the bundle's GEMM-plugin module (its sitecustomize patches TensorRT-LLM's FP8 linears)
        env.append({"name": "PYTHONPATH", "value": bundle.mapped(bundle.python_path, config.dynamo.bundle_mount)})
    return env


def _component(name: str, kind: str, replicas: int, container: dict[str, Any],
               volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container]}
    if volumes:
        spec["volumes"] = volumes
    return {"name": name, "type": kind, "replicas": replicas, "podTemplate": {"spec": spec}}


def graph_deployment(config: Any, bundle: BundleInfo, dynamo: DynamoContract, mode: str) -> list[dict[str, Any]]:
    """[ConfigMap, DynamoGraphDeployment] for mode agg or disagg."""
    graph = dynamo.graph
    opts = config.dynamo
    name = graph_name(config.model_name, mode)
    roles = ["agg"] if mode == "agg" else ["prefill", "decode"]
    configmap_name = f"{name}-engine-args"
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": configmap_name},
                 "data": {f"{role}.yaml": f"__ENGINE_ARGS_{role}__" for role in roles}}

    def volumes() -> list[dict[str, Any]]:  # a fresh list per component: no YAML anchors in the manifest
        return [{"name": "bundle", "persistentVolumeClaim": {"claimName": opts.bundle_claim, "readOnly": True}},
                {"name": "engine-args", "configMap": {"name": configmap_name}}]
    main = graph["component"]["main_container"]
    frontend = _component("Frontend", "frontend", 1, {
        "name": main, "image": opts.image, "command": ["python3", "-m", dynamo.data["frontend"]["module"]],
        "args": frontend_argv(config, dynamo)})
    components = [frontend]
    replicas = {"agg": opts.workers, "prefill": opts.prefill_workers, "decode": opts.decode_workers}
    for role in roles:
        container: dict[str, Any] = {
            "name": main, "image": opts.image,
            "command": ["python3", "-m", dynamo.data["trtllm_worker"]["module"]],
            "args": worker_argv(config, bundle, dynamo, role, f"{ENGINE_ARGS_DIR}/{role}.yaml"),
            "envFrom": [{"secretRef": {"name": opts.hf_token_secret}}],
            "env": _worker_env(config, bundle),
            "resources": {"limits": {graph["gpu_resource"]: str(bundle.world_size)}},
            "volumeMounts": [{"name": "bundle", "mountPath": opts.bundle_mount, "readOnly": True},
                             {"name": "engine-args", "mountPath": ENGINE_ARGS_DIR, "readOnly": True}],
            "workingDir": opts.bundle_mount}
        if not container["env"]:
            del container["env"]
        components.append(_component("TRTLLMWorker" if role == "agg" else role, "worker" if role == "agg" else role,
                                     replicas[role], container, volumes()))
    dgd = {"apiVersion": graph["api_version"], "kind": graph["kind"], "metadata": {"name": name},
           "spec": {"backendFramework": "trtllm", "components": components}}
    return [configmap, dgd]


def check_graph_deployment(doc: Mapping[str, Any], dynamo: DynamoContract, bundle: BundleInfo,
                           where: str) -> list[Violation]:
    """A DynamoGraphDeployment against the CRD facts and the flags of the Dynamo contract."""
    graph = dynamo.graph
    comp_spec = graph["component"]
    fact, comp_fact = dynamo.fact(graph["source"]), dynamo.fact(comp_spec["source"])
    out: list[Violation] = []
    if doc.get("apiVersion") != graph["api_version"] or doc.get("kind") != graph["kind"]:
        out.append(Violation(f"{where}:apiVersion/kind", f"must be {graph['api_version']} {graph['kind']}", fact))
    spec = doc.get("spec") or {}
    if spec.get("backendFramework") not in graph["backend_frameworks"]:
        out.append(Violation(f"{where}:spec.backendFramework", f"is none of {graph['backend_frameworks']}", fact))
    components = spec.get("components") or []
    if not components or len(components) > graph["max_components"]:
        out.append(Violation(f"{where}:spec.components", f"needs 1 to {graph['max_components']} entries", fact))
    names = [str(c.get("name", "")).lower() for c in components]
    if len(set(names)) != len(names):
        out.append(Violation(f"{where}:spec.components", "names must be unique case-insensitively", fact))
    worker_flags = set(dynamo.data["trtllm_worker"]["flags"].values())
    frontend_flags = set(dynamo.data["frontend"]["flags"].values())
    for i, comp in enumerate(components):
        at = f"{where}:spec.components[{i}]"
        for key in comp:
            if key not in comp_spec["fields"]:
                out.append(Violation(f"{at}.{key}", "is not a field of the component", comp_fact))
        for key in comp_spec["required"]:
            if key not in comp:
                out.append(Violation(f"{at}.{key}", "is required", comp_fact))
        name = str(comp.get("name", ""))
        if len(name) > comp_spec["name_max_length"] or not re.fullmatch(comp_spec["name_pattern"], name):
            out.append(Violation(f"{at}.name", f"{name!r} does not match {comp_spec['name_pattern']} (<= 63)", comp_fact))
        if comp.get("type") not in comp_spec["types"]:
            out.append(Violation(f"{at}.type", f"{comp.get('type')!r} is none of {comp_spec['types']}", comp_fact))
        replicas = comp.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            out.append(Violation(f"{at}.replicas", "must be an integer >= 0", comp_fact))
        containers = ((comp.get("podTemplate") or {}).get("spec") or {}).get("containers") or []
        mains = [c for c in containers if c.get("name") == comp_spec["main_container"]]
        if len(mains) != 1 or not mains[0].get("image"):
            out.append(Violation(f"{at}.podTemplate.spec.containers", "needs one container named "
                                 f"{comp_spec['main_container']!r} with an image", comp_fact))
            continue
        container = mains[0]
        known = frontend_flags if comp.get("type") == "frontend" else worker_flags
        source = dynamo.fact(dynamo.data["frontend" if comp.get("type") == "frontend" else "trtllm_worker"]["source"])
        for arg in container.get("args", []):
            if str(arg).startswith("--") and arg not in known:
                out.append(Violation(f"{at}.args", f"{arg} is not a flag of Dynamo {dynamo.version}", source))
        if comp.get("type") != "frontend":
            gpus = (container.get("resources") or {}).get("limits", {}).get(graph["gpu_resource"])
            if gpus != str(bundle.world_size):
                out.append(Violation(f"{at}.resources.limits", f"{graph['gpu_resource']} must be tp x pp = "
                                     f"{bundle.world_size} (got {gpus!r})", comp_fact))
    return out


def in_container_script(config: Any, bundle: BundleInfo, dynamo: DynamoContract) -> str:
    """Runs inside the tensorrtllm-runtime image: the frontend and the workers of one node."""
    opts = config.dynamo
    ws = bundle.world_size
    lines = [
        "#!/usr/bin/env bash",
        "# Written by trtbuild. Runs inside Dynamo's tensorrtllm-runtime image (see dynamo_node.sh):",
        "#   dynamo_in_container.sh agg      frontend + deploy.dynamo.workers aggregated workers",
        "#   dynamo_in_container.sh disagg   frontend + prefill and decode workers",
        f"# Each worker gets {ws} GPU(s) (tensor_parallel x pipeline_parallel). No etcd / NATS: file discovery",
        "# in a fresh directory, TCP request plane. Ctrl-C / SIGTERM stops every process it started.",
        "set -euo pipefail",
        'MODE="${1:-agg}"',
        f'ENGINE_ARGS="{CONTAINER_DYNAMO}/engine_args"',
        'export DYN_FILE_KV="$(mktemp -d)"',
        "PIDS=()",
        'stop() { trap - INT TERM EXIT; kill -TERM "${PIDS[@]}" 2>/dev/null || true; wait || true; '
        'rm -rf "$DYN_FILE_KV"; }',
        "trap stop INT TERM EXIT",
    ]
    for env in _worker_env(config, bundle):
        lines.append(f"export {env['name']}={quote(env['value'])}")
    frontend = ["python3", "-m", dynamo.data["frontend"]["module"],
                dynamo.frontend_flag("http_port"), str(opts.http_port),
                dynamo.frontend_flag("discovery_backend"), "file", dynamo.frontend_flag("request_plane"), "tcp",
                *frontend_argv(config, dynamo)]
    lines.append(" ".join(shlex.quote(a) for a in frontend) + " & PIDS+=($!)")

    def worker(role: str) -> str:
        argv = ["python3", "-m", dynamo.data["trtllm_worker"]["module"],
                *worker_argv(config, bundle, dynamo, role, f"$ENGINE_ARGS/{role}.yaml")]
        return " ".join(a if a.startswith("$ENGINE_ARGS") else shlex.quote(a) for a in argv)

    lines += [
        "GPU=0",
        f"start_worker() {{ local role=$1; local gpus; gpus=$(seq -s, $GPU $((GPU + {ws} - 1))); GPU=$((GPU + {ws}))",
        '  case "$role" in',
        *[f'    {role}) CUDA_VISIBLE_DEVICES="$gpus" {worker(role)} & PIDS+=($!) ;;' for role in ROLES],
        "  esac; }",
        'case "$MODE" in',
        f"  agg) for _ in $(seq {opts.workers}); do start_worker agg; done ;;",
        f"  disagg) for _ in $(seq {opts.prefill_workers}); do start_worker prefill; done",
        f"          for _ in $(seq {opts.decode_workers}); do start_worker decode; done ;;",
        '  *) echo "usage: $0 agg|disagg" >&2; exit 2 ;;',
        "esac",
        "wait -n",  # the first process that ends stops the node
    ]
    return "\n".join(lines) + "\n"


def node_script(config: Any) -> str:
    opts = config.dynamo
    port = opts.http_port
    return (
        "#!/usr/bin/env bash\n"
        f"# Written by trtbuild: serves the bundle with Dynamo on this GPU node ({comment_safe(opts.image)}).\n"
        f"#   launch/dynamo_node.sh [agg|disagg]   OpenAI API on 127.0.0.1:{port}\n"
        "# Override the image with TRTBUILD_DYNAMO_IMAGE, the docker binary with DOCKER.\n"
        "set -euo pipefail\n"
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        'DEPLOY="$(dirname "$HERE")"\n'
        'BUNDLE="$(readlink -f "$DEPLOY/bundle")"\n'
        + default_assignment("TRTBUILD_DYNAMO_IMAGE", opts.image)
        + 'exec "${DOCKER:-docker}" run --rm --gpus all --ipc=host --shm-size=2g \\\n'
        "  --ulimit memlock=-1 --ulimit stack=67108864 \\\n"
        f"  -p {shlex.quote(f'127.0.0.1:{port}:{port}')} \\\n"
        f'  -v "$BUNDLE:{opts.bundle_mount}:ro" \\\n'
        f'  -v "$DEPLOY/dynamo:{CONTAINER_DYNAMO}:ro" \\\n'
        f'  -v "$HERE:{CONTAINER_LAUNCH}:ro" \\\n'
        f'  "$TRTBUILD_DYNAMO_IMAGE" bash {CONTAINER_LAUNCH}/dynamo_in_container.sh "${{1:-agg}}"\n'
    )


def write_dynamo_deployment(out: Path, config: Any, bundle: BundleInfo, max_batch_size: int) -> dict[str, Any]:
    """Writes dynamo/ and the two launchers under `out`; raises UserError on the first violation."""
    import yaml

    dynamo = load_dynamo_contract()
    fix = f"see docs/gpu-path.md (Dynamo {dynamo.version}, engine.trtllm_version: {bundle.trtllm_version})"
    root = out / "dynamo"
    (root / "engine_args").mkdir(parents=True)
    texts: dict[str, str] = {}
    for role in ROLES:
        args = engine_args(config, bundle, max_batch_size, role, dynamo)
        where = f"dynamo/engine_args/{role}.yaml"
        cv.raise_first(check_engine_args(args, bundle, dynamo, where), fix=fix)
        texts[role] = (f"# dynamo.trtllm --extra-engine-args ({role}): the bundle's LLM() options, paths under "
                       f"{config.dynamo.bundle_mount}. Written by trtbuild.\n"
                       + yaml.safe_dump(args, sort_keys=False, default_flow_style=False))
        (root / "engine_args" / f"{role}.yaml").write_text(texts[role])
    manifests = {}
    for mode in ("agg", "disagg"):
        configmap, dgd = graph_deployment(config, bundle, dynamo, mode)
        configmap["data"] = {key: texts[key.removesuffix(".yaml")] for key in configmap["data"]}
        where = f"dynamo/dgd_{mode}.yaml"
        cv.raise_first(check_graph_deployment(dgd, dynamo, bundle, where), fix=fix)
        header = (f"# Written by trtbuild: {dgd['metadata']['name']}, Dynamo {dynamo.version} on Kubernetes "
                  f"(`kubectl apply -f {Path(where).name}`). Needs the Dynamo operator, the PersistentVolumeClaim "
                  f"{config.dynamo.bundle_claim} holding the bundle and the Secret {config.dynamo.hf_token_secret}.\n")
        (root / f"dgd_{mode}.yaml").write_text(header + yaml.safe_dump_all([configmap, dgd], sort_keys=False))
        manifests[mode] = {"file": where, "name": dgd["metadata"]["name"],
                           "components": [c["name"] for c in dgd["spec"]["components"]]}
    launch = out / "launch"
    launch.mkdir(exist_ok=True)
    for name, text in (("dynamo_in_container.sh", in_container_script(config, bundle, dynamo)),
                       ("dynamo_node.sh", node_script(config))):
        (launch / name).write_text(text)
        (launch / name).chmod(0o755)
    return {"dynamo_version": dynamo.version, "image": config.dynamo.image, "tensorrt_llm_in_image": dynamo.tensorrt_llm,
            "engine_args_checked_against": bundle.trtllm_version, "gpus_per_worker": bundle.world_size,
            "engine_args": {role: f"dynamo/engine_args/{role}.yaml" for role in ROLES},
            "manifests": manifests, "launch": "launch/dynamo_node.sh"}


def plan_notes(recipe: RecipeInfo) -> list[str]:
    """What `trtbuild plan` says the dynamo target will write (nothing without it)."""
    deploy, engine = recipe.section(DeployConfig), recipe.section(EngineConfig)
    if deploy is None or "dynamo" not in deploy.target:
        return []
    dynamo = load_dynamo_contract()
    opts = deploy.dynamo
    gpus = engine.tensor_parallel * engine.pipeline_parallel if engine is not None else 1
    release = engine.trtllm_version if engine is not None else "?"
    return [f"dynamo (deploy.dynamo): {recipe.output_path}/deploy/dynamo/dgd_agg.yaml (Frontend + {opts.workers} "
            f"TRTLLMWorker x {gpus} GPU), dgd_disagg.yaml (Frontend + {opts.prefill_workers} prefill + "
            f"{opts.decode_workers} decode x {gpus} GPU), engine_args/{{agg,prefill,decode}}.yaml, "
            f"launch/dynamo_node.sh (one node); {opts.image}, Dynamo {dynamo.version} (its image runs TensorRT-LLM "
            f"{dynamo.tensorrt_llm}; the engine args are checked against the TensorRT-LLM {release} contract)"]
