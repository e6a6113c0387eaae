"""`zerofit config`: plan, then write ds_config.json + accelerate.yaml + answers.yaml into --out."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import fields
from pathlib import Path

from zerofit.cli.answer_flags import add_answer_flags, answers_from_args
from zerofit.errors import ZerofitError

# A plan that does not fit is written only when the user set its ZeRO stage or offload: they asked
# for that configuration (the estimate may be pessimistic for their script). Otherwise nothing
# fits, and files for the planner's closest miss would only fail at the first step: an out of
# memory error after the model loaded. A micro batch or checkpointing choice alone does not count.
FORCING = ("stage", "offload_optimizer", "offload_param")

# transformers' HfTrainerDeepSpeedConfig.trainer_config_process (integrations/deepspeed.py) calls
# fill_match(DeepSpeed key, TrainingArguments value) on each of these keys: "auto" takes the
# argument, an explicit value must equal it, and trainer_config_finalize then raises "Please
# correct the following DeepSpeed config values that mismatch TrainingArguments values". The
# same method matches train_batch_size against world_size x the first two (the accelerate.yaml's
# num_processes gives the world size) and optimizer.params.betas against adam_beta1/adam_beta2.
TRAINER_MATCHED_KEYS = (
    ("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
    ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ("gradient_clipping", "max_grad_norm"),
    ("optimizer.params.lr", "learning_rate"),
    ("optimizer.params.eps", "adam_epsilon"),
    ("optimizer.params.weight_decay", "weight_decay"),
)


def register(sub) -> None:
    p = sub.add_parser(
        "config",
        help="write ds_config.json + accelerate.yaml + answers.yaml for a plan",
        description="Plan the fastest configuration that fits and write the DeepSpeed JSON, the "
        "accelerate YAML and answers.yaml into --out. `--answers OUT/answers.yaml` reproduces the "
        "same files. A plan that fits nowhere is not written, unless you set its --stage or "
        "--offload-optimizer/--offload-param yourself.",
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

    return bool(args.answers) or bool(getattr(args, "cluster_facts", None)) or any(
        getattr(args, f.name, None) is not None for f in fields(Answers)
    )


def launch_command(plan, out: str) -> str:
    """The command that runs a script with the written files, quoted for a POSIX shell."""
    command = ["accelerate", "launch", "--config_file", str(Path(out) / "accelerate.yaml")]
    if plan.answers.num_nodes > 1:
        command += ["--machine_rank", "NODE_RANK", "your_script.py"]
        return shlex.join(command) + "  # on every node"
    return shlex.join(command + ["your_script.py"])


def check_out_dir(out: str) -> Path:
    """``--out`` as a Path; ZerofitError for an empty name or one with a control character.

    The directory's path is written into accelerate.yaml (its comments and deepspeed_config_file)
    and into the printed commands, where a newline would end the line early.
    """
    if not out.strip():
        raise ZerofitError("--out", "is empty", "give a directory, e.g. --out cfg/")
    if any(ord(char) < 32 or ord(char) == 127 for char in out):
        raise ZerofitError(
            "--out", f"{out!r} contains a control character", "name a directory on one line"
        )
    return Path(out)


def _ds_value(ds: dict, dotted: str):
    """``ds["a"]["b"]`` for ``"a.b"``; None where a level is missing."""
    node = ds
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def trainer_arguments(plan, ds: dict) -> list[str]:
    """TrainingArguments flags (HF Trainer; TRL's SFT/DPO/GRPO configs subclass it) for the plan.

    An explicit value in the DeepSpeed JSON ``ds`` must be passed as written, or the Trainer stops
    (TRAINER_MATCHED_KEYS). Where the JSON says "auto", and for what it does not hold (gradient
    checkpointing), the flags are the plan's numbers: the memory estimate counted them.
    """
    values: dict = {
        "per_device_train_batch_size": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
    }
    for ds_key, trainer_key in TRAINER_MATCHED_KEYS:
        value = _ds_value(ds, ds_key)
        if value is not None and value != "auto":
            values[trainer_key] = value
    betas = _ds_value(ds, "optimizer.params.betas")
    if isinstance(betas, list):
        values["adam_beta1"], values["adam_beta2"] = betas
    flags = []
    for key, value in values.items():
        flags += [f"--{key}", str(value)]
    # fill_match("bf16.enabled", args.bf16 or args.bf16_full_eval): the flag turns it on
    if plan.precision in ("bf16", "fp16"):
        flags.append(f"--{plan.precision}")
    if plan.gradient_checkpointing:
        flags.append("--gradient_checkpointing")
    return flags


def trainer_arguments_heading(plan) -> str:
    """What the trainer_arguments line means for this plan's files."""
    if plan.answers.flavour == "explicit" and plan.stage > 0:
        return (
            "HF Trainer / TRL arguments these explicit values require (transformers stops on any "
            "DeepSpeed value that differs from TrainingArguments):"
        )
    return "HF Trainer / TRL arguments the plan was sized for:"


def run(args) -> int:
    if not _given_any(args) and not args.defaults:
        raise ZerofitError(
            "config",
            "no answers given",
            "pass --answers answers.yaml, flags such as --model/--gpu, or --defaults",
        )
    from zerofit.configs.outputs import build_files
    from zerofit.files import write_files

    out = check_out_dir(args.out)
    answers = answers_from_args(args)
    # Absolute: accelerate opens deepspeed_config_file relative to each worker's working directory.
    ds_path = out.resolve() / "ds_config.json"
    plan, files = build_files(answers, ds_config_file=str(ds_path))
    forced = [name for name in FORCING if getattr(answers, name) is not None]
    trainer_flags = []
    if answers.stack == "hf":  # a stage-0 plan runs plain DDP and writes no DeepSpeed JSON
        ds = json.loads(files["ds_config.json"]) if "ds_config.json" in files else {}
        trainer_flags = trainer_arguments(plan, ds)
    if not plan.fits and not forced:
        _print_plan(plan, args.json, [], None, [])
        refuse_unfit(plan)
    default = None
    if args.save_default:  # checked before anything is written: all files or none
        default = check_default_target(args.force)
    paths = write_files(out, files, force=args.force)
    if default is not None:
        paths += save_default(files["accelerate.yaml"], default, args.force)
    _print_plan(plan, args.json, paths, launch_command(plan, args.out), trainer_flags)
    if not plan.fits:
        flags = ", ".join("--" + name.replace("_", "-") for name in forced)
        print(
            f"zerofit: warning: this configuration does not fit in {unfit_budget(plan)} "
            f"(files written anyway, as you set {flags})",
            file=sys.stderr,
        )
        return 1
    return 0


def _print_plan(plan, as_json: bool, paths, launch: str | None, trainer_flags) -> None:
    if as_json:
        summary = {
            "plan": plan_summary(plan),
            "files": [str(p) for p in paths],
            "launch": launch,
            "trainer_arguments": trainer_flags,
        }
        print(json.dumps(summary, indent=2))
    else:
        _print_human(plan, paths, launch, trainer_flags)


def unfit_budget(plan) -> str:
    """The memory a plan that does not fit runs out of, in words."""
    if plan.failing_budget == "host":
        return "host RAM (offload needs more than the node has)"
    if plan.failing_budget == "gpu+host":
        return "GPU memory nor host RAM"
    return "GPU memory"


def refuse_unfit(plan) -> None:
    """ZerofitError (exit 1) saying what a plan that fits nowhere needs; nothing is written."""
    needs = []
    if plan.failing_budget != "host":
        gpu_budget = plan.gpu.memory_gib * plan.answers.headroom
        needs.append(f"{plan.gpu_need_gib:.1f} GiB per GPU of {gpu_budget:.1f}")
    if plan.failing_budget in ("host", "gpu+host"):
        needs.append(f"{plan.cpu_gib:.1f} GiB of host RAM per node of {plan.host_ram_gib:.1f}")
    raise ZerofitError(
        "plan",
        f"does not fit in {unfit_budget(plan)}: the closest needs {' and '.join(needs)}; "
        "nothing written",
        "follow a suggestion above, or set --stage/--offload-optimizer/--offload-param yourself "
        "to write that configuration anyway",
        exit_code=1,
    )


DEFAULT_ELSEWHERE = "launch with --config_file instead"


def check_default_target(force: bool) -> Path:
    """accelerate's default config path; ZerofitError if it exists and ``force`` is not given."""
    import os

    from zerofit.configs.accelerate_yaml import default_config_path
    from zerofit.files import refuse_existing

    target = Path(default_config_path(os.environ))
    refuse_existing([target], force, "--save-default", DEFAULT_ELSEWHERE)
    return target


def save_default(text: str, target: Path, force: bool) -> list[Path]:
    """Write accelerate.yaml text as accelerate's default config (``accelerate launch x.py``)."""
    from zerofit.files import write_files

    files = {target.name: text}
    return write_files(target.parent, files, force, "--save-default", DEFAULT_ELSEWHERE)


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
        "step_time_s": plan.speed.step_time_s,
        "tokens_per_s_per_gpu": plan.speed.tokens_per_s_per_gpu,
        "mfu": plan.speed.mfu,
        "run_time_h": plan.speed.run_time_h,
    }


def _print_human(plan, paths, launch: str | None, trainer_flags) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)  # commands and paths must stay copy-pastable
    fit = "[green]fits[/green]" if plan.fits else "[red]does NOT fit[/red]"
    console.print(
        f"[bold]{plan.model_name}[/bold] on {plan.world_size} x {plan.gpu.name}: "
        f"ZeRO-{plan.stage}, {plan.precision}, peak {plan.peak_gib:.1f} GiB of "
        f"{plan.gpu.memory_gib:.1f} GiB per GPU, {fit}"
    )
    console.print(
        f"batch: {plan.micro_batch} micro x {plan.grad_accum} accumulation x "
        f"{plan.world_size} GPUs = {plan.global_batch} sequences per step"
    )
    from zerofit.planning.verdicts import speed_words

    console.print(speed_words(plan))
    if plan.decisions:
        table = Table("decision", "value", "why")
        for d in plan.decisions:
            table.add_row(d.field, str(d.value), d.reason)
        console.print(table)
    for s in plan.suggestions:
        console.print(f"suggestion: {s}")
    if trainer_flags:
        console.print(trainer_arguments_heading(plan))
        console.print("  " + shlex.join(trainer_flags), markup=False)
    for p in paths:
        console.print(f"wrote {p}")
    if launch:
        console.print(f"launch: {launch}", markup=False)
