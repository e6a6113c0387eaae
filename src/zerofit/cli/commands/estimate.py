"""`zerofit estimate`: per-GPU memory of one configuration, with its breakdown and verdict.

Knobs left unset take fixed estimate defaults (no planning): ZeRO stage 2 (3 when parameters
are offloaded), no offload, micro batch 1, no gradient checkpointing, bf16 where the GPU has it.
Gradient accumulation is global_batch / (micro x GPUs) when a global batch is given, else 1.
With --ds-config / --accelerate-config the stage, offload, precision, bucket sizes, optimizer
block and batch sizes come from your own files; flags given on the command line override them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from zerofit.cli.answer_flags import add_answer_flags, cluster_facts_answers, given_flags
from zerofit.cli.console import output_console

if TYPE_CHECKING:
    from zerofit.planning.report import EstimateReport

# Answers fields a config file may fill (when the flag is not given)
_FILE_ANSWER_FIELDS = (
    "stage",
    "offload_optimizer",
    "offload_param",
    "precision",
    "micro_batch",
    "gpus_per_node",
    "num_nodes",
    "nvme_path",
)


def register(sub) -> None:
    p = sub.add_parser(
        "estimate",
        help="predict per-GPU peak memory of one configuration",
        description=__doc__.split("\n\n", 1)[1],
    )
    add_answer_flags(p)
    p.add_argument("--ds-config", metavar="FILE", help="your DeepSpeed JSON (flags override it)")
    p.add_argument(
        "--accelerate-config", metavar="FILE", help="your accelerate YAML (flags override it)"
    )
    p.add_argument(
        "--replay-allocator",
        action="store_true",
        help="record the run (load + 3 steps) on fake tensors at the real shape and replay "
        "PyTorch's CUDA caching allocator over it: the verdict then counts the reserved memory "
        "the replay shows (stage 0 on one GPU, full or LoRA; seconds to a minute, cached)",
    )
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run)


def read_config_files(ds_path: str | None, accelerate_path: str | None, hidden_size: int) -> dict:
    """Estimate inputs from the user's accelerate YAML and/or DeepSpeed JSON (the JSON wins)."""
    from zerofit.memory.ds_config import (
        load_accelerate_yaml,
        load_deepspeed_json,
        read_accelerate_config,
        read_ds_config,
    )

    out: dict = {}
    if accelerate_path:
        text = _read("--accelerate-config", accelerate_path)
        cfg = load_accelerate_yaml(text, "--accelerate-config", accelerate_path) or {}
        acc, json_path = read_accelerate_config(cfg)
        out.update(acc)
        if json_path and not ds_path:
            ds_path = (
                str(Path(accelerate_path).parent / json_path)
                if not Path(json_path).is_absolute() and not Path(json_path).exists()
                else json_path
            )
    if ds_path:
        text = _read("--ds-config", ds_path)
        out.update(read_ds_config(load_deepspeed_json(text, "--ds-config", ds_path), hidden_size))
    return out


def _read(flag: str, path: str) -> str:
    from zerofit.errors import ZerofitError

    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ZerofitError(
            flag, f"cannot read {path} ({exc.strerror})", "give an existing file"
        ) from None


def report_from_files(
    flags: dict,
    ds_config: str | None = None,
    accelerate_config: str | None = None,
    base: dict | None = None,
    replay_allocator: bool = False,
) -> EstimateReport:
    """The estimate of the user's own config files: what ``zerofit estimate --ds-config FILE
    --accelerate-config FILE`` reports.

    ``flags``: Answers fields given on the command line (they override the files); ``base``: an
    answers file's fields (the config files override them). The files fill stage, offload,
    precision, micro batch and processes where no flag names them, and hand the estimate what
    Answers does not hold (bucket sizes, overlap_comm, the optimizer block, grad accumulation).
    ``replay_allocator``: ``--replay-allocator`` (planning/report.py ``with_allocator_replay``).
    """
    from zerofit.models.resolve import resolve_model
    from zerofit.planning.answers import answers_from_dict
    from zerofit.planning.report import build_estimate_report

    data = {**(base or {}), **flags}
    files: dict = {}
    model = None
    if ds_config or accelerate_config:
        model = resolve_model(answers_from_dict(data).model)
        files = read_config_files(ds_config, accelerate_config, model.hidden_size)
        for name in _FILE_ANSWER_FIELDS:  # flags given on the command line win
            if name in files and flags.get(name) is None:
                data[name] = files[name]
    return build_estimate_report(answers_from_dict(data), files, model, replay_allocator)


def estimate_from_files(
    flags: dict,
    ds_config: str | None = None,
    accelerate_config: str | None = None,
    base: dict | None = None,
) -> dict:
    """``report_from_files`` as the plain dict ``--json`` prints."""
    return report_from_files(flags, ds_config, accelerate_config, base).as_json()


def run(args) -> int:
    from zerofit.planning.answers import answers_to_dict, load_answers

    base: dict = {}
    if getattr(args, "answers", None):
        base = answers_to_dict(load_answers(_read("--answers", args.answers)))
    flags = given_flags(args)
    # the measured network fills what no flag gives (and wins over the answers file)
    flags = {**cluster_facts_answers(getattr(args, "cluster_facts", None), flags), **flags}
    report = report_from_files(
        flags, args.ds_config, args.accelerate_config, base, args.replay_allocator
    )
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
        return 0
    console = output_console()
    # the setup is a heading of its own, not the table's title: rich folds a title to the table's
    # width, cutting a long model path mid-word
    console.print(render_heading(report), highlight=False)
    console.print(render_breakdown(report))
    console.print(render_speed(report), highlight=False)
    for line in render_notes(report):
        console.print(line)
    return 0


def render_heading(report: EstimateReport) -> str:
    """The configuration in one line: model, GPUs, stage, micro batch, where the peak is."""
    stage = f"ZeRO-{report.stage}"
    if report.weights_dtype:
        autocast = "" if report.autocast else ", no autocast"
        stage += f" (no DeepSpeed, {report.weights_dtype} weights{autocast})"
    return (
        f"{report.model} on {report.world_size} x {report.gpu}: {stage}, "
        f"micro {report.micro_batch}, seq {report.seq_len}, peak in {report.peak_phase} "
        f"({report.stack} stack: {report.optimizer}, loss {report.loss_path})"
    )


def render_breakdown(report: EstimateReport):
    """The peak's components, the terms outside it and the margin, down to what the GPU holds."""
    from rich.table import Table

    table = Table()
    table.add_column("component")
    table.add_column("GiB / GPU", justify="right")
    for name, gib in report.breakdown.items():
        if "not in peak" not in name:
            table.add_row(name, f"{gib:.2f}")
    table.add_row(
        "[bold]peak (max_memory_allocated)[/bold]", f"[bold]{report.peak_gib:.2f}[/bold]"
    )
    for name, gib in report.outside_peak_gib.items():
        if gib:
            table.add_row(f"+ {name}", f"{gib:.2f}")
    table.add_row("+ safety margin", f"{report.safety_margin_gib:.2f}")
    table.add_row("[bold]the GPU must hold[/bold]", f"[bold]{report.gpu_need_gib:.2f}[/bold]")
    return table


def render_speed(report: EstimateReport) -> str:
    """One line: seconds per optimizer step, tokens/s per GPU and MFU, and where the time goes
    (zerofit.speed.step_time)."""
    speed = report.speed
    if speed.step_time_s is None or speed.time_breakdown is None:
        return f"speed: not estimated for {report.workload} (generation time is not modeled)"
    terms = speed.time_breakdown
    parts = {
        "compute": terms["compute_s"] + terms["recompute_s"],
        "communication": terms["exposed_comm_s"],
        "offload": terms["offload_transfer_s"] + terms["cpu_optimizer_s"],
        "optimizer": terms["gpu_optimizer_s"],
        "fixed costs": terms["overhead_s"],
        "generation": terms.get("generation_s", 0.0),  # grpo's rollout (speed/generation.py)
        # qlora's 4-bit base, dequantized on every use (speed/quantization.py)
        "4-bit dequantization": terms.get("dequantize_s", 0.0),
    }
    where = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in parts.items() if seconds)
    line = (
        f"speed: ~{speed.step_time_s:.2f} s per optimizer step, "
        f"{speed.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {speed.mfu:.0%} ({where})"
    )
    from zerofit.planning.verdicts import run_time_words

    run = run_time_words(speed.run_time_h, speed.optimizer_steps)
    return line + (f"\n{run}" if run else "")


def render_allocator_replay(replay: dict) -> str:
    """One line: what the caching allocator's replay of the run showed, or why it did not run."""
    if not replay["ran"]:
        return f"allocator replay: not run: {replay['reason']}"
    line = (
        f"allocator replay: max_memory_reserved {replay['max_reserved_gib']:.2f} GiB, "
        f"max_memory_allocated {replay['max_allocated_gib']:.2f} GiB over loading and "
        f"{replay['steps']} steps ({replay['seconds']:.0f} s); the verdict counts its reserved "
        "memory"
    )
    if replay["out_of_memory"]:
        line += "; the replayed allocator runs out of memory on this GPU"
    return line


def render_notes(report: EstimateReport) -> list[str]:
    """The verdict line, then the cautions that apply: a tight fit, padding, activations that
    are not this model's own layer or keep eager attention scores."""
    from zerofit.memory.lora import quantized_load_note
    from zerofit.planning.verdicts import estimate_verdict

    lines = [estimate_verdict(report)]
    if report.allocator_replay is not None:
        lines.append(render_allocator_replay(report.allocator_replay))
    load_note = quantized_load_note(report.peak_phase)
    if load_note:
        lines.append(load_note)
    if report.fits_gpu:
        from zerofit.memory.overheads import tight_fit_note

        note = tight_fit_note(report.spare_gib)
        if note:
            lines.append(note)
    if report.padding_gib >= 0.05:
        from zerofit.memory.activations import padding_note

        lines.append(padding_note(report.padding_gib))
    basis = report.activations_basis
    if basis == "llama_shaped":
        lines.append(
            f"note: activations use a Llama-style decoder layer; {report.model}'s own layer "
            "was not traced (transformers cannot build it here) and may keep more (extra norms, "
            "other MLPs): keep some headroom"
        )
    elif basis.startswith("traced_eager"):
        fix = (
            "--attention flash_attention_2 avoids them"
            if basis == "traced_eager"
            else "transformers has no flash attention for it either"
        )
        lines.append(
            f"note: {report.model} runs eager attention in transformers (no sdpa kernel for "
            f"it), which keeps seq x seq scores in every layer ({fix})"
        )
    return lines
