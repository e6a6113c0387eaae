"""Render a LaunchSpec as files: node{R}.sh per node, job.sbatch (slurm), hostfile + launch.sh (deepspeed).

Every value goes through shlex.quote, so a hostile path or argument stays one inert word; only
ShellVar tokens (``"$SLURM_NODEID"``) are left for the shell to expand on each node.
"""

from __future__ import annotations

import dataclasses
import shlex

from zerofit.launch.commands import (
    LaunchSpec,
    ShellVar,
    build_accelerate_cmd,
    build_deepspeed_cmd,
    build_env_cmd,
    build_rank_env,
    build_remote_env,
    build_torchrun_cmd,
    find_output_dir,
    validate_spec,
)


def quote_cmd(cmd: list[str], tail: int = 0, indent: str = "  ") -> str:
    """One shell command: a flag and its value per line, the last ``tail`` words (script, args) together."""
    words = [w if isinstance(w, ShellVar) else shlex.quote(w) for w in cmd]
    head = 2 if len(cmd) > 1 and not cmd[1].startswith("-") else 1  # "accelerate launch"
    end = len(words) - tail
    lines, i = [" ".join(words[:head])], head
    while i < end:
        pair = cmd[i].startswith("-") and i + 1 < end and not cmd[i + 1].startswith("-")
        lines.append(" ".join(words[i : i + 2]) if pair else words[i])
        i += 2 if pair else 1
    if tail:
        lines.append(" ".join(words[end:]))
    return (" \\\n" + indent).join(lines)


def render_nccl_block(spec: LaunchSpec) -> str:
    """Recommended NCCL / timeout settings as commented, editable lines."""
    minutes = max(1, -(-spec.timeout // 60))
    return "\n".join(
        [
            "# --- NCCL and timeouts: uncomment and edit (`zerofit doctor` lists this node's interfaces)",
            "# export NCCL_DEBUG=INFO                     # log which transport/interface NCCL picks; WARN once it works",
            "# export NCCL_SOCKET_IFNAME=eth0             # <-- edit: the interface on the network the nodes share",
            "# export GLOO_SOCKET_IFNAME=eth0             # <-- edit: the same for gloo (CPU runs, some barriers)",
            "# export NCCL_IB_DISABLE=1                   # only when InfiniBand is absent or misbehaving",
            "# export TORCH_NCCL_ASYNC_ERROR_HANDLING=1   # abort on a failed collective instead of hanging",
            f"# export DEEPSPEED_TIMEOUT={minutes}".ljust(45)
            + "# minutes a DeepSpeed collective waits for a lost peer",
        ]
    )


def _tail(spec: LaunchSpec) -> int:
    return 1 + len(spec.script_args)


def _exports(env: dict[str, str]) -> str:
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def render_prelude(spec: LaunchSpec) -> str:
    """The --setup command, the cd into the working directory and the --env exports.

    Every generated file runs from ``spec.workdir`` (where `zerofit launch` ran, absolute), so the
    script path, the accelerate YAMLs, ``deepspeed_config_file`` and relative arguments such as
    ``--output-dir run`` mean the same thing from whichever directory the file is started.
    """
    lines = []
    if spec.setup:
        what = (
            "runs first; every node's task inherits what it exports"
            if spec.style == "slurm"
            else "runs first, on every node"
        )
        lines += [f"# --- environment (--setup): {what}", spec.setup, ""]
    if spec.workdir:
        where = shlex.quote(spec.workdir)
        lines += [
            "# --- run where `zerofit launch` ran: relative paths in the commands below start here",
            f'cd -- {where} || {{ echo "zerofit: cannot cd to {spec.workdir} (it must exist on'
            ' every'
            ' node, e.g. on the shared filesystem)" >&2; exit 2; }',
            "",
        ]
    if spec.extra_env:
        lines += ["# --- variables given with --env / --ifname", _exports(dict(spec.extra_env)), ""]
    return "\n".join(lines)


def _header(spec: LaunchSpec, rank: int, what: str) -> str:
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            f"# zerofit launch ({spec.style}): node {rank} of {spec.nodes}, {spec.procs_per_node} process(es) each,"
            f" world size {spec.world_size}.",
            f"# Run {what} on node {rank}; node 0 is the main node and must listen on {spec.main_addr}:{spec.main_port}.",
            "# Every node's script shares the node count, main address and port; only the rank differs.",
            "set -euo pipefail",
            "",
            render_prelude(spec),
        ]
    )


def _run_and_report(cmd: str, rank: int) -> str:
    return "\n".join(
        [
            "status=0",
            f"{cmd} || status=$?",
            'if [ "$status" -ne 0 ]; then',
            f'  echo "zerofit: node {rank} failed with exit status $status (a peer that died or never joined'
            ' shows up here too: read every node\'s log)" >&2',
            "fi",
            'exit "$status"',
            "",
        ]
    )


def render_node_script(spec: LaunchSpec, rank: int) -> str:
    """``node{rank}.sh`` for the accelerate, torchrun, torchrun-static and env styles."""
    parts = [_header(spec, rank, "this script"), render_nccl_block(spec), ""]
    if spec.style != "accelerate" and spec.accelerate_env:
        parts += [
            "# DeepSpeed settings `accelerate launch` would export for accelerate.yaml",
            _exports(dict(spec.accelerate_env)),
            "",
        ]
    if spec.style == "accelerate":
        parts.append(
            _run_and_report(quote_cmd(build_accelerate_cmd(spec, rank), _tail(spec)), rank)
        )
    elif spec.style in ("torchrun", "torchrun-static"):
        cmd = build_torchrun_cmd(spec, rank, static=spec.style == "torchrun-static")
        parts.append(_run_and_report(quote_cmd(cmd, _tail(spec)), rank))
    else:
        parts.append(_render_env_body(spec, rank))
    return "\n".join(parts)


def _render_env_body(spec: LaunchSpec, rank: int) -> str:
    shared = {
        k: v for k, v in build_rank_env(spec, rank, 0).items() if k not in ("RANK", "LOCAL_RANK")
    }
    lines = [
        "# torch.distributed env:// values shared by this node's processes",
        _exports(shared),
        "",
        "# one process per local rank, each with its own RANK / LOCAL_RANK",
        "pids=()",
    ]
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


def _slurm_task(spec: LaunchSpec) -> str:
    """Each node's srun task: the launcher, the resume words, and a failure line naming the node."""
    rank, addr, port = (
        ShellVar('"$SLURM_NODEID"'),
        ShellVar('"$MAIN_ADDR"'),
        ShellVar('"$MAIN_PORT"'),
    )
    if spec.config_files:
        inner = build_accelerate_cmd(spec, rank, addr=addr, port=port)
    else:
        inner = build_torchrun_cmd(
            spec, rank, addr=addr, port=port, job_id=ShellVar('"$SLURM_JOB_ID"')
        )
        # node 0 hosts the c10d store: torch guesses it from the hostname and misses an address on a
        # second interface (elastic/rendezvous/utils.py, _matches_machine_hostname); Slurm knows
        conf = inner.index("--rdzv_conf") + 1
        inner[conf] = ShellVar(f'"{inner[conf]},is_host=$(( SLURM_NODEID == 0 ))"')
    words = " ".join(w if isinstance(w, ShellVar) else shlex.quote(w) for w in inner)
    resume = " ".join(shlex.quote(w) for w in spec.resume_args)
    return "; ".join(
        [
            "set --",
            (
                f'if [ "${{ZEROFIT_RESUME:-0}}" = 1 ]; then set -- {resume}; fi'
                if spec.requeue
                else ":"
            ),
            "status=0",
            f'{words} "$@" || status=$?',
            'if [ "$status" -ne 0 ]; then echo "zerofit: node $SLURMD_NODENAME (rank $SLURM_NODEID)'
            ' failed: '
            'its training command exited with status $status" >&2; fi',
            'exit "$status"',
        ]
    )


def _slurm_resume_block(spec: LaunchSpec) -> list[str]:
    """--requeue: requeue at the time-limit warning; the next start resumes from the checkpoint."""
    out = find_output_dir(spec.script_args)
    resume = " ".join(spec.resume_args)
    if out:
        marker = shlex.quote(out.rstrip("/") + "/latest")
        test, why = f"[ -e {marker} ]", f"a checkpoint exists ({out.rstrip('/')}/latest)"
    else:
        test, why = (
            '[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]',
            "this is a restart (SLURM_RESTART_COUNT)",
        )
    return [
        f"# --- preemption / time limit: Slurm sends USR1 {spec.signal_seconds} s before the limit"
        " (--signal);",
        "# the job requeues itself and its next start continues from the latest checkpoint, so at",
        "# most one checkpoint interval is lost. Resume when " + why + ".",
        "ZEROFIT_RESUME=0",
        f"if {test}; then",
        "  ZEROFIT_RESUME=1",
        f'  echo "zerofit: start ${{SLURM_RESTART_COUNT:-0}} of job $SLURM_JOB_ID:'
        f' resuming ({resume})"',
        "fi",
        "export ZEROFIT_RESUME",
        'trap \'echo "zerofit: time limit or preemption near (USR1): requeueing job'
        ' $SLURM_JOB_ID" >&2;'
        ' scontrol requeue "$SLURM_JOB_ID"\' USR1',
        "",
    ]


def _slurm_doctor(spec: LaunchSpec, log: str) -> list[str]:
    """One srun step: `zerofit doctor --allocation` on every node, compared before training."""
    cmd = [
        spec.python,
        "-m",
        "zerofit",
        "doctor",
        "--allocation",
        f"{log}/doctor-$SLURM_JOB_ID",
        "--main-addr",
        "$MAIN_ADDR",
        "--main-port",
        "$MAIN_PORT",
        "--timeout",
        str(min(spec.timeout, 120)),
    ]
    if spec.config_files:
        cmd += ["--config", spec.config_files[0]]
    words = " ".join(
        f'"{w}"' if w.startswith("$") or "$SLURM" in w else shlex.quote(w) for w in cmd
    )
    return [
        "# --- pre-flight: every node's versions, GPUs, main address and port, compared at once",
        "# (remove these lines, or render with --no-doctor, to skip it)",
        f'"${{SRUN[@]}}" {words} \\',
        '  || { echo "zerofit: doctor found a problem on the allocation (above); not starting'
        ' training" >&2;'
        " exit 1; }",
        "",
    ]


def render_slurm(spec: LaunchSpec) -> str:
    """``job.sbatch``: one task per node; each task's rank is its SLURM_NODEID."""
    log = spec.log_dir.rstrip("/") or "."
    cpus = spec.cpus_per_node or 8 * spec.procs_per_node
    where = f"{spec.workdir}" if spec.workdir else "the directory you submit from"
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={shlex.quote(spec.job_id)}",
        f"#SBATCH --nodes={spec.nodes}",
        "#SBATCH --ntasks-per-node=1          # one launcher per node; it starts the GPU processes",
        f"#SBATCH --cpus-per-task={cpus}".ljust(37)
        + " # <-- edit: cores per node (launcher, ranks, data workers)",
        f"#SBATCH --gres=gpu:{spec.procs_per_node}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={spec.time_limit}".ljust(37)
        + " # <-- edit: shorter limits start sooner (backfill)",
    ]
    if spec.workdir:
        lines.append(f"#SBATCH --chdir={spec.workdir}")
    lines += [
        "#SBATCH --output=%x-%j.out             # in the working directory, which exists at submit",
        "#SBATCH --open-mode=append             # a requeued job adds to its output, not over it",
    ]
    if spec.requeue:
        lines += ["#SBATCH --requeue", f"#SBATCH --signal=B:USR1@{spec.signal_seconds}"]
    lines += [
        "##SBATCH --partition=gpu             # <-- edit (remove one '#' to enable)",
        "##SBATCH --account=my-account        # <-- edit",
        f"# zerofit launch (slurm): {spec.nodes} nodes x {spec.procs_per_node} GPUs, world size {spec.world_size}.",
        f"# Submit with `sbatch job.sbatch` from any directory: it runs in {where};",
        f"# the job's output goes to %x-%j.out there, each node's log to {log}/%x-%j-node%n.log.",
        "set -euo pipefail",
        "",
        render_prelude(spec),
        f'if [ "${{SLURM_NNODES:-{spec.nodes}}}" -ne {spec.nodes} ]; then',
        f'  echo "zerofit: allocation has $SLURM_NNODES nodes, the config expects {spec.nodes}" >&2; exit 2',
        "fi",
        "# --- the main node is the first of the allocation; its address is the one Slurm uses",
        "# (NodeAddr), so node names need not resolve. pipefail off: head closing a pipe is fine.",
        'MAIN_NODE=$(set +o pipefail; scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        '[ -n "$MAIN_NODE" ] || { echo "zerofit: scontrol listed no host for $SLURM_JOB_NODELIST"'
        " >&2; exit 2; }",
        "MAIN_ADDR=$(set +o pipefail; scontrol show node \"$MAIN_NODE\" 2>/dev/null | tr ' ' '\\n'"
        " | sed -n 's/^NodeAddr=//p' | head -n1)",
        "MAIN_ADDR=${MAIN_ADDR:-$MAIN_NODE}",
        f"MAIN_PORT={spec.main_port}                   # <-- edit if the port is taken on the main node",
        "export MAIN_ADDR MAIN_PORT",
        "",
        render_nccl_block(spec),
        "",
        f"mkdir -p {shlex.quote(log)}",
        "# srun no longer inherits --cpus-per-task from sbatch (Slurm 22.05+): pass it on",
        f"SRUN=(srun --nodes={spec.nodes} --ntasks-per-node=1"
        f' --cpus-per-task="${{SLURM_CPUS_PER_TASK:-{cpus}}}"'
        " --kill-on-bad-exit=1)",
        "",
    ]
    if spec.doctor:
        lines += _slurm_doctor(spec, log)
    if spec.requeue:
        lines += _slurm_resume_block(spec)
    node_logs = f"{log}/${{SLURM_JOB_NAME}}-${{SLURM_JOB_ID}}-node*.log"
    lines += [
        "# single quotes: SLURM_NODEID and MAIN_* expand inside each node's task, not here.",
        "# In the background so a USR1 trap runs at once; a restart appends to the node logs.",
        f"\"${{SRUN[@]}}\" --open-mode=append --output={shlex.quote(log + '/%x-%j-node%n.log')} \\",
        f"  bash -c {shlex.quote(_slurm_task(spec))} &",
        "srun_pid=$!",
        "status=0",
        'wait "$srun_pid" || status=$?',
        'while kill -0 "$srun_pid" 2>/dev/null; do status=0; wait "$srun_pid" || status=$?; done',
        'if [ "$status" -ne 0 ]; then',
        '  echo "zerofit: job $SLURM_JOB_ID failed (srun exit $status); nodes that reported a'
        ' failure:" >&2',
        f'  grep -h "^zerofit: node" {node_logs} >&2 \\',
        f'    || echo "zerofit: (no node reported; see {log}/)" >&2',
        "fi",
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)


def render_hostfile(spec: LaunchSpec) -> str:
    """DeepSpeed hostfile: ``host slots=N`` per node, main node first."""
    hosts = spec.hostnames or tuple(f"node{i}" for i in range(spec.nodes))
    note = "" if spec.hostnames else "   # <-- edit: real hostnames, reachable by ssh"
    return "".join(f"{h} slots={spec.procs_per_node}{note}\n" for h in hosts)


def render_deepspeed_env(spec: LaunchSpec) -> str:
    """``.deepspeed_env``: what every rank on every host needs; pdsh carries nothing else.

    DeepSpeed's runner (deepspeed/launcher/runner.py, main) forwards only NCCL*/PYTHON*/UCX*/
    MV2*/MLFLOW* variables and this file's ``KEY=VALUE`` lines (no comments: every line is split at
    '='), quoting each value itself; validate_spec refused the values it cannot carry.
    """
    env = {**dict(build_remote_env(spec)), **dict(spec.accelerate_env), **dict(spec.extra_env)}
    return "".join(f"{k}={v}\n" for k, v in env.items())


def render_deepspeed_launch(spec: LaunchSpec) -> str:
    """``launch.sh`` for DeepSpeed's launcher: run once, on the main node, from any directory."""
    here = ShellVar('"$HERE/hostfile"')
    setup = ShellVar('"$HERE/setup.sh"') if spec.setup else None
    lines = [
        "#!/usr/bin/env bash",
        f"# zerofit launch (deepspeed): {spec.nodes} nodes x {spec.procs_per_node} process(es),"
        f" world size {spec.world_size}. Run this once, on {spec.main_addr} (node 0), from any"
        " directory.",
        "# DeepSpeed's launcher starts every host in ./hostfile over pdsh: it needs pdsh,",
        "# passwordless ssh from this node to each host, and the same paths on every host. Ranks",
        "# on other hosts see only NCCL*/PYTHON*/UCX* variables and .deepspeed_env: put yours there"
        + (" (setup.sh runs on every host first)." if spec.setup else "."),
        "set -euo pipefail",
        "",
        "# this file's directory, which holds hostfile and .deepspeed_env",
        'HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)',
        "case $HERE in *[!A-Za-z0-9_@%+=:,./-]*)",
        '  echo "zerofit: $HERE: DeepSpeed passes this path to the remote shell unquoted; move'
        ' the files'
        ' to a path of letters, digits and _@%+=:,./-" >&2; exit 2;; esac',
        'export DS_ENV_FILE="$HERE/.deepspeed_env"  # runner.py reads it, not ./.deepspeed_env',
        render_prelude(dataclasses.replace(spec, extra_env=())),  # setup: the launcher needs it too
        render_nccl_block(spec),
        "",
        _run_and_report(quote_cmd(build_deepspeed_cmd(spec, here, setup), _tail(spec)), 0),
    ]
    return "\n".join(lines)


def render_launch_files(spec: LaunchSpec) -> dict[str, str]:
    """{filename: text} for ``spec.style``, validated first."""
    validate_spec(spec)
    if spec.style == "slurm":
        return {"job.sbatch": render_slurm(spec)}
    if spec.style == "deepspeed":
        files = {
            "hostfile": render_hostfile(spec),
            "launch.sh": render_deepspeed_launch(spec),
            ".deepspeed_env": render_deepspeed_env(spec),
        }
        if spec.setup:
            files["setup.sh"] = (
                f"# sourced on every host by DeepSpeed's runner (--venv_script)\n{spec.setup}\n"
            )
        return files
    return {f"node{r}.sh": render_node_script(spec, r) for r in range(spec.nodes)}
