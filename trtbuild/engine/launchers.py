"""Shell launchers for a bundle: trtllm-serve on one node, under mpirun, and a Slurm batch script.

All three run from the bundle root, so the relative paths in llm_api_options.yaml (the draft
directory) resolve the same way everywhere. Multi-node launches wrap the server in
`trtllm-llmapi-launch` (TRT-LLM's MPI/Slurm entry point, examples/llm-api/llm_mgmn_*.sh), with one
MPI rank per GPU: the world size must equal tensor_parallel * pipeline_parallel.
Recipe values are data: quoted for the shell (trtbuild.core.shell), never pasted into code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trtbuild.core.shell import Raw, comment_safe, default_assignment, env_exports, expand, quote, sbatch_directives, word


@dataclass(frozen=True)
class ServeSpec:
    """What every launcher starts: `trtllm-serve MODEL` with these flags."""

    model: str  # relative to the bundle root: "target"
    backend: str  # "pytorch" (the only backend trtbuild serves)
    tensor_parallel: int
    pipeline_parallel: int
    expert_parallel: int
    options_file: str = "llm_api_options.yaml"
    options_flag: str = "--extra_llm_api_options"  # the release's name (contract: trtllm_serve)
    tokenizer: str | None = None  # only when the served checkpoint carries none
    trust_remote_code: bool = False
    custom_module_dirs: tuple[str, ...] = ()  # trtllm-serve --custom_module_dirs (releases that have it)
    python_path: str | None = None  # bundle dir prepended to PYTHONPATH (the GEMM-plugin module)
    env: dict[str, str] = field(default_factory=dict)
    # Containers run as root: Open MPI's switches (contract: launch_as_root), exported unless already set.
    root_env: dict[str, str] = field(default_factory=dict)
    mpirun_flags: tuple[str, ...] = ()
    host: str = "localhost"
    port: int = 8000

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 1
    gpus_per_node: int = 8
    partition: str | None = None
    account: str | None = None
    time_limit: str = "01:00:00"
    job_name: str = "trtllm-serve"
    container_image: str | None = None
    container_mounts: tuple[str, ...] = ()


def _host_port(spec: ServeSpec) -> str:
    """TRTBUILD_HOST / TRTBUILD_PORT from the environment, else the recipe's (as literal data)."""
    return default_assignment("TRTBUILD_HOST", spec.host) + default_assignment("TRTBUILD_PORT", str(spec.port))


def serve_argv(spec: ServeSpec) -> list[str]:
    """The trtllm-serve command line (host and port come from the environment at launch)."""
    host, port = expand("TRTBUILD_HOST"), expand("TRTBUILD_PORT")
    argv: list[str] = ["trtllm-serve", f"./{spec.model}", "--backend", spec.backend, "--host", host, "--port", port,
            "--tp_size", str(spec.tensor_parallel), "--pp_size", str(spec.pipeline_parallel),
            "--ep_size", str(spec.expert_parallel)]
    if spec.tokenizer:
        argv += ["--tokenizer", f"./{spec.tokenizer}"]
    if spec.trust_remote_code:
        argv.append("--trust_remote_code")
    for directory in spec.custom_module_dirs:
        argv += ["--custom_module_dirs", f"./{directory}"]
    argv += [spec.options_flag, spec.options_file]
    return argv


def _join(argv: list[str], indent: str = "  ") -> str:
    """One argument per flag per line; trtbuild's own expansions (Raw) stay expandable, every other
    argument is quoted."""
    parts = [quote(a) for a in argv]
    lines: list[str] = [parts[0]]
    i = 1
    while i < len(parts):
        if parts[i].startswith("-") and i + 1 < len(parts) and not parts[i + 1].startswith("-"):
            lines.append(f"{parts[i]} {parts[i + 1]}")
            i += 2
        else:
            lines.append(parts[i])
            i += 1
    return (" \\\n" + indent).join(lines)


def _env_lines(env: dict[str, str]) -> str:
    return env_exports(env)


def _root_lines(spec: ServeSpec) -> str:
    """Open MPI runs as root (the release containers' user) only when told to: for the MPI processes
    TensorRT-LLM starts itself (mpirun gets the flag too). A value already in the environment wins."""
    if not spec.root_env:
        return ""
    return ("# Open MPI refuses root unless told (the containers run as root; contract: launch_as_root)\n"
            + "".join(f'export {k}="${{{k}:-{v}}}"\n' for k, v in sorted(spec.root_env.items())))


def _python_path_line(spec: ServeSpec, root: str = "$PWD") -> str:
    """Puts the bundle's module dir first on PYTHONPATH: its sitecustomize imports trtbuild's GEMM
    plugins into the server and each MPI worker (they inherit the environment)."""
    if not spec.python_path:
        return ""
    return ("# trtbuild's GEMM plugins (trtbuild_gemm): imported by every Python process of the server\n"
            f'export PYTHONPATH="{root}/{spec.python_path}${{PYTHONPATH:+:$PYTHONPATH}}"\n')


_HEADER = "#!/usr/bin/env bash\n# Written by trtbuild{recipe}. {what}\nset -euo pipefail\n"


def single_node_script(spec: ServeSpec, recipe_name: str = "") -> str:
    recipe = f" for recipe '{comment_safe(recipe_name)}'" if recipe_name else ""
    return (_HEADER.format(recipe=recipe, what=f"Serves this bundle with trtllm-serve on one node "
                           f"({spec.world_size} GPU{'s' if spec.world_size > 1 else ''}).")
            + "# Extra trtllm-serve flags may be appended: launch/serve.sh --log_level debug\n"
            + 'cd "$(dirname "${BASH_SOURCE[0]}")/.."\n'
            + _env_lines(spec.env) + _root_lines(spec) + _host_port(spec)
            + _python_path_line(spec)
            + "exec " + _join(serve_argv(spec)) + ' \\\n  "$@"\n')


def mpirun_script(spec: ServeSpec, cluster: ClusterSpec, recipe_name: str = "") -> str:
    """OpenMPI launch over `cluster.nodes` hosts listed in $TRTBUILD_HOSTFILE."""
    recipe = f" for recipe '{comment_safe(recipe_name)}'" if recipe_name else ""
    exports = " ".join(f"-x {k}" for k in sorted({*spec.env, *spec.root_env,
                                                   *(["PYTHONPATH"] if spec.python_path else [])}))
    mpirun: list[str] = ["mpirun", *spec.mpirun_flags, "-np", str(spec.world_size), "--npernode",
                         str(cluster.gpus_per_node),
                         "--hostfile", expand("TRTBUILD_HOSTFILE"), "--bind-to", "none", "-wdir", expand("PWD")]
    return (_HEADER.format(recipe=recipe, what=f"Serves this bundle on {cluster.nodes} nodes x "
                           f"{cluster.gpus_per_node} GPUs under mpirun.")
            + "# The bundle must be at the same path on every node (a shared filesystem).\n"
            + ': "${TRTBUILD_HOSTFILE:?set TRTBUILD_HOSTFILE to an MPI hostfile listing the '
            + f'{cluster.nodes} nodes}}"\n'
            + 'cd "$(dirname "${BASH_SOURCE[0]}")/.."\n'
            + _env_lines(spec.env) + _root_lines(spec) + _host_port(spec)
            + _python_path_line(spec)
            + "exec " + _join(mpirun) + (f" \\\n  {exports}" if exports else "")
            + " \\\n  trtllm-llmapi-launch " + _join(serve_argv(spec), indent="    ") + ' \\\n    "$@"\n')


def slurm_script(spec: ServeSpec, cluster: ClusterSpec, recipe_name: str = "") -> str:
    """sbatch script: one task per GPU, srun with PMIx, optionally inside a container (pyxis)."""
    recipe = f" for recipe '{comment_safe(recipe_name)}'" if recipe_name else ""
    directives = sbatch_directives(job_name=cluster.job_name, nodes=cluster.nodes,
                                   tasks_per_node=cluster.gpus_per_node, gpus_per_node=cluster.gpus_per_node,
                                   time_limit=cluster.time_limit, output="trtllm-serve-%j.out",
                                   partition=cluster.partition, account=cluster.account)
    srun: list[str] = ["srun", "-l", "--mpi=pmix", "--chdir", expand("BUNDLE")]
    if cluster.container_image:
        mounts = word(Raw('"${BUNDLE}:${BUNDLE}"'), *(f",{m}" for m in cluster.container_mounts))
        srun += ["--container-image", cluster.container_image, "--container-mounts", mounts,
                 "--container-workdir", expand("BUNDLE")]
    exports = ",".join(("ALL", *sorted(spec.env)))  # ALL carries PYTHONPATH too
    srun += ["--export", exports]
    script = ("#!/bin/bash\n" + "\n".join(directives) + "\n"
              + f"# Written by trtbuild{recipe}. Serves this bundle on {cluster.nodes} nodes x "
              f"{cluster.gpus_per_node} GPUs.\n"
              + "# Submit from the bundle directory: cd <bundle> && sbatch launch/slurm.sbatch\n"
              + "set -euo pipefail\n"
              + 'BUNDLE="${TRTBUILD_BUNDLE:-${SLURM_SUBMIT_DIR:-$PWD}}"\n'
              + _env_lines(spec.env) + _root_lines(spec) + _host_port(spec)
              + _python_path_line(spec, "${BUNDLE}")
              + _join(srun) + " \\\n  trtllm-llmapi-launch " + _join(serve_argv(spec), indent="    ") + "\n")
    return script
