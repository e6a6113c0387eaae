"""`zerofit config`: plan, then write ds_config.json + accelerate.yaml + answers.yaml into --out."""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path

from zerofit.errors import ZerofitError
from zerofit.cli.answer_flags import add_answer_flags, answers_from_args


def register(sub) -> None:
    p = sub.add_parser(
        "config",
        help="write ds_config.json + accelerate.yaml + answers.yaml for a plan",
        description="Plan the fastest configuration that fits and write the DeepSpeed JSON, the accelerate "
        "YAML and answers.yaml into --out. `--answers OUT/answers.yaml` reproduces the same files.",
    )
    add_answer_flags(p)
    p.add_argument(
        "--out", required=True, metavar="DIR", help="directory to write into (created if missing)"
    )
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument(
        "--save-default",
        action="store_true",
        help="also write accelerate.yaml where `accelerate launch` looks without "
        "--config_file ($HF_HOME/accelerate/default_config.yaml, as `accelerate "
        "config` does)",
    )
    p.add_argument(
        "--defaults", action="store_true", help="accept the defaults for everything not given"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _given_any(args) -> bool:
    from zerofit.planning.answers import Answers

    return bool(args.answers) or any(
        getattr(args, f.name, None) is not None for f in fields(Answers)
    )


def launch_command(plan, out: str) -> str:
    """The command that runs a script with the written files."""
    cfg = str(Path(out) / "accelerate.yaml")
    if plan.answers.num_nodes > 1:
        return f"accelerate launch --config_file {cfg} --machine_rank NODE_RANK your_script.py  # on every node"
    return f"accelerate launch --config_file {cfg} your_script.py"


def run(args) -> int:
    if not _given_any(args) and not args.defaults:
        raise ZerofitError(
            "config",
            "no answers given",
            "pass --answers answers.yaml, flags such as --model/--gpu, or --defaults",
        )
    from zerofit.files import write_files
    from zerofit.configs.outputs import build_files

    answers = answers_from_args(args)
    # Absolute: accelerate opens deepspeed_config_file relative to each worker's working directory.
    ds_path = Path(args.out).resolve() / "ds_config.json"
    plan, files = build_files(answers, ds_config_file=str(ds_path))
    default = None
    if args.save_default:  # checked before anything is written: all files or none
        default = check_default_target(args.force)
    paths = write_files(args.out, files, force=args.force)
    if default is not None:
        paths += save_default(files["accelerate.yaml"], default, args.force)
    launch = launch_command(plan, args.out)
    if args.json:
        print(
            json.dumps(
                {"plan": plan_summary(plan), "files": [str(p) for p in paths], "launch": launch},
                indent=2,
            )
        )
    else:
        _print_human(plan, paths, launch)
    if not plan.fits:
        where = (
            "host RAM (offload needs more than the node has)"
            if plan.failing_budget == "host"
            else "GPU memory"
        )
        print(
            f"zerofit: warning: this configuration does not fit in {where} "
            "(files written anyway)",
            file=sys.stderr,
        )
        return 1
    return 0


def check_default_target(force: bool) -> Path:
    """accelerate's default config path; ZerofitError if it exists and ``force`` is not given."""
    import os

    from zerofit.configs.accelerate_yaml import default_config_path

    target = Path(default_config_path(os.environ))
    if target.exists() and not force:
        raise ZerofitError(
            "--save-default",
            f"{target} already exists",
            "pass --force to overwrite it, or launch with --config_file instead",
        )
    return target


def save_default(text: str, target: Path, force: bool) -> list[Path]:
    """Write accelerate.yaml text as accelerate's default config (for ``accelerate launch x.py``)."""
    from zerofit.files import write_files

    return write_files(target.parent, {target.name: text}, force=force)


def plan_summary(plan) -> dict:
    """JSON-ready facts of a plan (shared by --json outputs)."""
    return {
        "model": plan.model_name,
        "params": plan.params,
        "gpu": plan.gpu.key,
        "world_size": plan.world_size,
        "num_nodes": plan.answers.num_nodes,
        "precision": plan.precision,
        "stage": plan.stage,
        "offload_optimizer": plan.offload_optimizer,
        "offload_param": plan.offload_param,
        "gradient_checkpointing": plan.gradient_checkpointing,
        "micro_batch": plan.micro_batch,
        "grad_accum": plan.grad_accum,
        "global_batch": plan.global_batch,
        "peak_gib": round(plan.peak_gib, 2),
        "gpu_memory_gib": plan.gpu.memory_gib,
        "fits": plan.fits,
        "cpu_gib": round(plan.cpu_gib, 2),
        "flavour": plan.answers.flavour,
        "gpu_need_gib": plan.gpu_need_gib,
        "failing_budget": plan.failing_budget,
        "host_ram_gib": plan.host_ram_gib,
        "decisions": [
            {"field": d.field, "value": d.value, "reason": d.reason} for d in plan.decisions
        ],
        "suggestions": list(plan.suggestions),
    }


def _print_human(plan, paths, launch: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)  # commands and paths must stay copy-pastable
    fit = "[green]fits[/green]" if plan.fits else "[red]does NOT fit[/red]"
    console.print(
        f"[bold]{plan.model_name}[/bold] on {plan.world_size} x {plan.gpu.name}: ZeRO-{plan.stage}, "
        f"{plan.precision}, peak {plan.peak_gib:.1f} GiB of {plan.gpu.memory_gib:.1f} GiB per GPU, {fit}"
    )
    console.print(
        f"batch: {plan.micro_batch} micro x {plan.grad_accum} accumulation x {plan.world_size} GPUs "
        f"= {plan.global_batch} sequences per step"
    )
    if plan.decisions:
        table = Table("decision", "value", "why")
        for d in plan.decisions:
            table.add_row(d.field, str(d.value), d.reason)
        console.print(table)
    for s in plan.suggestions:
        console.print(f"suggestion: {s}")
    for p in paths:
        console.print(f"wrote {p}")
    console.print(f"launch: {launch}")
