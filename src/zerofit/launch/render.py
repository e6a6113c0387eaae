"""Render a LaunchSpec as files: node{R}.sh per node, job.sbatch (slurm), hostfile + launch.sh
(deepspeed).

The scripts are Jinja templates in ``launch/templates/`` that read as the bash they produce. Every
value reaches them through the ``shell_quote`` / ``shell_words`` / ``shell_command`` filters
(shlex.quote), so a hostile path or argument stays one inert word; only ShellVar tokens
(``"$SLURM_NODEID"``) are left for the shell to expand on each node. Values inside comments go
through ``one_line``, so a line break cannot end the comment and start a command.
"""

from __future__ import annotations

import functools
import re
import shlex

from zerofit.launch.commands import (
    LaunchSpec,
    ShellVar,
    build_accelerate_cmd,
    build_deepspeed_cmd,
    build_doctor_cmd,
    build_env_cmd,
    build_rank_env,
    build_remote_env,
    build_torchrun_cmd,
    count_words,
    find_output_dir,
    validate_spec,
)


def shell_quote(value: object) -> str:
    """One shell word: shlex.quote, except a ShellVar, which the shell must expand."""
    return value if isinstance(value, ShellVar) else shlex.quote(str(value))


def shell_words(words: list[str] | tuple[str, ...]) -> str:
    """A command on one line, each word quoted (``shell_quote``)."""
    return " ".join(shell_quote(w) for w in words)


def quote_cmd(cmd: list[str], tail: int = 0, indent: str = "  ") -> str:
    """A command over several lines: a flag and its value per line, the last ``tail`` words
    (the script and its arguments) together on the last line."""
    words = [shell_quote(w) for w in cmd]
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


def one_line(value: object) -> str:
    """``value`` for a comment: control characters (a line break above all) written escaped."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m.group())[1:-1], str(value))


@functools.lru_cache(maxsize=1)
def template_environment():
    """The Jinja environment over the package's templates: strict, no HTML escaping."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("zerofit.launch", "templates"),
        undefined=jinja2.StrictUndefined,  # a misspelt variable fails, never renders as ""
        autoescape=False,  # shell, not HTML: quoting is the filters' job
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        shell_quote=shell_quote,
        shell_words=shell_words,
        shell_command=quote_cmd,
        one_line=one_line,
        count_words=count_words,
    )
    return env


def render_template(name: str, spec: LaunchSpec, **context: object) -> str:
    """Render ``templates/name`` with ``spec`` and the values every script shares."""
    shared = {
        "spec": spec,
        "extra_env": spec.extra_env,
        "timeout_minutes": max(1, -(-spec.timeout // 60)),
        "tail": 1 + len(spec.script_args),  # the script and its arguments stay on one line
    }
    return template_environment().get_template(name).render({**shared, **context})


def render_node_script(spec: LaunchSpec, rank: int) -> str:
    """``node{rank}.sh`` for the accelerate, torchrun, torchrun-static and env styles."""
    if spec.style == "accelerate":
        command = build_accelerate_cmd(spec, rank)
        return render_template("node.sh.j2", spec, rank=rank, command=command)
    if spec.style in ("torchrun", "torchrun-static"):
        command = build_torchrun_cmd(spec, rank, static=spec.style == "torchrun-static")
        return render_template("node.sh.j2", spec, rank=rank, command=command)
    rank_envs = [build_rank_env(spec, rank, local) for local in range(spec.procs_per_node)]
    shared_env = {k: v for k, v in rank_envs[0].items() if k not in ("RANK", "LOCAL_RANK")}
    return render_template(
        "node.sh.j2",
        spec,
        rank=rank,
        command=build_env_cmd(spec),
        shared_env=shared_env,
        rank_envs=rank_envs,
    )


def build_slurm_task_cmd(spec: LaunchSpec) -> list[str]:
    """The launcher each node's srun task runs: its rank and the main address come from Slurm."""
    rank, addr, port = (
        ShellVar('"$SLURM_NODEID"'),
        ShellVar('"$MAIN_ADDR"'),
        ShellVar('"$MAIN_PORT"'),
    )
    if spec.config_files:
        return build_accelerate_cmd(spec, rank, addr=addr, port=port)
    command = build_torchrun_cmd(
        spec, rank, addr=addr, port=port, job_id=ShellVar('"$SLURM_JOB_ID"')
    )
    # node 0 hosts the c10d store: torch guesses it from the hostname and misses an address on a
    # second interface (elastic/rendezvous/utils.py, _matches_machine_hostname); Slurm knows
    conf = command.index("--rdzv_conf") + 1
    command[conf] = ShellVar(f'"{command[conf]},is_host=$(( SLURM_NODEID == 0 ))"')
    return command


def render_slurm(spec: LaunchSpec) -> str:
    """``job.sbatch``: one task per node; each task's rank is its SLURM_NODEID."""
    log = spec.log_dir.rstrip("/") or "."
    output_dir = find_output_dir(spec.script_args)
    task = render_template("slurm_task.sh.j2", spec, command=build_slurm_task_cmd(spec))
    return render_template(
        "job.sbatch.j2",
        spec,
        log=log,
        cpus=spec.cpus_per_node or 8 * spec.procs_per_node,
        doctor_command=build_doctor_cmd(spec, log),
        checkpoint_marker=output_dir.rstrip("/") + "/latest" if output_dir else "",
        task=task.rstrip("\n"),
    )


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
    hostfile = ShellVar('"$HERE/hostfile"')
    setup = ShellVar('"$HERE/setup.sh"') if spec.setup else None
    return render_template(
        "deepspeed_launch.sh.j2",
        spec,
        rank=0,
        command=build_deepspeed_cmd(spec, hostfile, setup),
        extra_env=(),  # they travel in .deepspeed_env; the setup runs here too (for the launcher)
    )


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
            files["setup.sh"] = render_template("deepspeed_setup.sh.j2", spec)
        return files
    return {f"node{r}.sh": render_node_script(spec, r) for r in range(spec.nodes)}
