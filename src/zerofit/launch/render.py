"""Render a LaunchSpec as files: node{R}.sh per node, job.sbatch (slurm), hostfile + launch.sh (deepspeed).

Every value goes through shlex.quote, so a hostile path or argument stays one inert word; only
ShellVar tokens (``"$SLURM_NODEID"``) are left for the shell to expand on each node.
"""
from __future__ import annotations

import shlex

from zerofit.launch.commands import (LaunchSpec, ShellVar, build_accelerate_cmd, build_deepspeed_cmd, build_env_cmd,
                     build_rank_env, build_torchrun_cmd, validate_spec)


def quote_cmd(cmd: list[str], tail: int = 0, indent: str = "  ") -> str:
    """One shell command: a flag and its value per line, the last ``tail`` words (script, args) together."""
    words = [w if isinstance(w, ShellVar) else shlex.quote(w) for w in cmd]
    head = 2 if len(cmd) > 1 and not cmd[1].startswith("-") else 1  # "accelerate launch"
    end = len(words) - tail
    lines, i = [" ".join(words[:head])], head
    while i < end:
        pair = cmd[i].startswith("-") and i + 1 < end and not cmd[i + 1].startswith("-")
        lines.append(" ".join(words[i:i + 2]) if pair else words[i])
        i += 2 if pair else 1
    if tail:
        lines.append(" ".join(words[end:]))
    return (" \\\n" + indent).join(lines)


def render_nccl_block(spec: LaunchSpec) -> str:
    """Recommended NCCL / timeout settings as commented, editable lines."""
    minutes = max(1, -(-spec.timeout // 60))
    return "\n".join([
        "# --- NCCL and timeouts: uncomment and edit (`zerofit doctor` lists this node's interfaces)",
        "# export NCCL_DEBUG=INFO                     # log which transport/interface NCCL picks; WARN once it works",
        "# export NCCL_SOCKET_IFNAME=eth0             # <-- edit: the interface on the network the nodes share",
        "# export GLOO_SOCKET_IFNAME=eth0             # <-- edit: the same for gloo (CPU runs, some barriers)",
        "# export NCCL_IB_DISABLE=1                   # only when InfiniBand is absent or misbehaving",
        "# export TORCH_NCCL_ASYNC_ERROR_HANDLING=1   # abort on a failed collective instead of hanging",
        f"# export DEEPSPEED_TIMEOUT={minutes}".ljust(45) + "# minutes a DeepSpeed collective waits for a lost peer",
    ])


def _tail(spec: LaunchSpec) -> int:
    return 1 + len(spec.script_args)


def _exports(env: dict[str, str]) -> str:
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def _header(spec: LaunchSpec, rank: int, what: str) -> str:
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# zerofit launch ({spec.style}): node {rank} of {spec.nodes}, {spec.procs_per_node} process(es) each,"
        f" world size {spec.world_size}.",
        f"# Run {what} on node {rank}; node 0 is the main node and must listen on {spec.main_addr}:{spec.main_port}.",
        "# Every node's script shares the node count, main address and port; only the rank differs.",
        "set -euo pipefail",
        "",
    ])


def _run_and_report(cmd: str, rank: int) -> str:
    return "\n".join([
        "status=0",
        f"{cmd} || status=$?",
        'if [ "$status" -ne 0 ]; then',
        f'  echo "zerofit: node {rank} failed with exit status $status (a peer that died or never joined'
        ' shows up here too: read every node\'s log)" >&2',
        "fi",
        'exit "$status"',
        "",
    ])


def render_node_script(spec: LaunchSpec, rank: int) -> str:
    """``node{rank}.sh`` for the accelerate, torchrun, torchrun-static and env styles."""
    parts = [_header(spec, rank, "this script"), render_nccl_block(spec), ""]
    if spec.style != "accelerate" and spec.accelerate_env:
        parts += ["# DeepSpeed settings `accelerate launch` would export for accelerate.yaml",
                  _exports(dict(spec.accelerate_env)), ""]
    if spec.style == "accelerate":
        parts.append(_run_and_report(quote_cmd(build_accelerate_cmd(spec, rank), _tail(spec)), rank))
    elif spec.style in ("torchrun", "torchrun-static"):
        cmd = build_torchrun_cmd(spec, rank, static=spec.style == "torchrun-static")
        parts.append(_run_and_report(quote_cmd(cmd, _tail(spec)), rank))
    else:
        parts.append(_render_env_body(spec, rank))
    return "\n".join(parts)


def _render_env_body(spec: LaunchSpec, rank: int) -> str:
    shared = {k: v for k, v in build_rank_env(spec, rank, 0).items() if k not in ("RANK", "LOCAL_RANK")}
    lines = ["# torch.distributed env:// values shared by this node's processes", _exports(shared), "",
             "# one process per local rank, each with its own RANK / LOCAL_RANK", "pids=()"]
    cmd = " ".join(shlex.quote(w) for w in build_env_cmd(spec))
    for local in range(spec.procs_per_node):
        env = build_rank_env(spec, rank, local)
        lines.append(f"RANK={env['RANK']} LOCAL_RANK={env['LOCAL_RANK']} {cmd} &")
        lines.append('pids+=("$!")')
    lines += [
        "# the first rank to fail stops the others, whose collectives would otherwise wait for it",
        "trap 'kill \"${pids[@]}\" 2>/dev/null || true' INT TERM",
        "status=0",
        'for _ in "${pids[@]}"; do',
        "  if ! wait -n; then status=1; kill \"${pids[@]}\" 2>/dev/null || true; fi",
        "done",
        'if [ "$status" -ne 0 ]; then',
        f'  echo "zerofit: node {rank}: a rank failed, stopped the rest (a peer that died or never joined'
        ' shows up here too: read every node\'s log)" >&2',
        "fi",
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)


def render_slurm(spec: LaunchSpec) -> str:
    """``job.sbatch``: one task per node; each task's rank is its SLURM_NODEID."""
    rank, addr, port = ShellVar('"$SLURM_NODEID"'), ShellVar('"$MAIN_ADDR"'), ShellVar('"$MAIN_PORT"')
    if spec.config_files:
        inner = build_accelerate_cmd(spec, rank, addr=addr, port=port)
    else:
        inner = build_torchrun_cmd(spec, rank, addr=addr, port=port, job_id=ShellVar('"$SLURM_JOB_ID"'))
    inner_text = " ".join(w if isinstance(w, ShellVar) else shlex.quote(w) for w in inner)
    log = spec.log_dir.rstrip("/") or "."
    return "\n".join([
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={shlex.quote(spec.job_id)}",
        f"#SBATCH --nodes={spec.nodes}",
        "#SBATCH --ntasks-per-node=1          # one launcher per node; it starts the GPU processes",
        f"#SBATCH --gres=gpu:{spec.procs_per_node}",
        "#SBATCH --exclusive",
        "#SBATCH --time=24:00:00              # <-- edit",
        f"#SBATCH --output={shlex.quote(log + '/%x-%j.out')}",
        "##SBATCH --partition=gpu             # <-- edit (remove one '#' to enable)",
        "##SBATCH --account=my-account        # <-- edit",
        f"# zerofit launch (slurm): {spec.nodes} nodes x {spec.procs_per_node} GPUs, world size {spec.world_size}.",
        f"# Submit with: mkdir -p {shlex.quote(log)} && sbatch job.sbatch",
        "set -euo pipefail",
        "",
        f'if [ "${{SLURM_NNODES:-{spec.nodes}}}" -ne {spec.nodes} ]; then',
        f'  echo "zerofit: allocation has $SLURM_NNODES nodes, the config expects {spec.nodes}" >&2; exit 2',
        "fi",
        "# --- the main node is the first of the allocation; every node reads the same values",
        "# (pipefail off in the subshell: head closing the pipe early is not a failure)",
        'MAIN_ADDR=$(set +o pipefail; scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        '[ -n "$MAIN_ADDR" ] || { echo "zerofit: scontrol listed no host for $SLURM_JOB_NODELIST" >&2; exit 2; }',
        f"MAIN_PORT={spec.main_port}                   # <-- edit if the port is taken on the main node",
        "export MAIN_ADDR MAIN_PORT",
        "",
        render_nccl_block(spec),
        "",
        f"mkdir -p {shlex.quote(log)}",
        "# single quotes: SLURM_NODEID and MAIN_* expand inside each node's task, not here",
        f"srun --nodes={spec.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 "
        f"--output={shlex.quote(log + '/%x-%j-node%n.log')} \\",
        f"  bash -c {shlex.quote(inner_text)}",
        "",
    ])


def render_hostfile(spec: LaunchSpec) -> str:
    """DeepSpeed hostfile: ``host slots=N`` per node, main node first."""
    hosts = spec.hostnames or tuple(f"node{i}" for i in range(spec.nodes))
    note = "" if spec.hostnames else "   # <-- edit: real hostnames, reachable by ssh"
    return "".join(f"{h} slots={spec.procs_per_node}{note}\n" for h in hosts)


def render_deepspeed_launch(spec: LaunchSpec) -> str:
    """``launch.sh`` for DeepSpeed's launcher: run once, on the main node."""
    lines = [_header(spec, 0, "this once"),
             "# DeepSpeed's launcher starts every host in ./hostfile over pdsh, so it needs pdsh and",
             "# passwordless ssh from this node to each host, and the same paths on every host.",
             "", render_nccl_block(spec), ""]
    if spec.accelerate_env:
        lines += ["# ranks on other hosts only see variables listed in ./.deepspeed_env (written by zerofit)", ""]
    lines.append(_run_and_report(quote_cmd(build_deepspeed_cmd(spec), _tail(spec)), 0))
    return "\n".join(lines)


def render_launch_files(spec: LaunchSpec) -> dict[str, str]:
    """{filename: text} for ``spec.style``, validated first."""
    validate_spec(spec)
    if spec.style == "slurm":
        return {"job.sbatch": render_slurm(spec)}
    if spec.style == "deepspeed":
        files = {"hostfile": render_hostfile(spec), "launch.sh": render_deepspeed_launch(spec)}
        if spec.accelerate_env:
            files[".deepspeed_env"] = "".join(f"{k}={v}\n" for k, v in spec.accelerate_env)
        return files
    return {f"node{r}.sh": render_node_script(spec, r) for r in range(spec.nodes)}
