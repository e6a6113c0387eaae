"""`zerofit estimate`: per-GPU peak memory of one configuration, with its breakdown.

Knobs left unset take fixed estimate defaults (no planning): ZeRO stage 2 (3 when parameters
are offloaded), no offload, micro batch 1, no gradient checkpointing, bf16 where the GPU has it.
Gradient accumulation is global_batch / (micro x GPUs) when a global batch is given, else 1.
"""
from __future__ import annotations

import json

from zerofit.cli.answer_flags import add_answer_flags, answers_from_args


def register(sub) -> None:
    p = sub.add_parser("estimate", help="predict per-GPU peak memory of one configuration",
                       description=__doc__.split("\n\n", 1)[1])
    add_answer_flags(p)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run)


def build_estimate(answers) -> dict:
    """The estimate as a plain dict (what --json prints)."""
    from zerofit.errors import ZerofitError
    from zerofit.hardware import lookup
    from zerofit.memory.estimate import GIB, estimate_memory
    from zerofit.models.resolve import resolve_model
    from zerofit.planning.planner import make_setup, pick_precision

    model, gpu = resolve_model(answers.model), lookup(answers.gpu)
    precision = pick_precision(answers, gpu)[0]
    offload_param = answers.offload_param or "none"
    stage = answers.stage if answers.stage is not None else (3 if offload_param != "none" else 2)
    offload_opt = answers.offload_optimizer or ("none" if offload_param == "none" else offload_param)
    if offload_param != "none" and stage != 3:
        raise ZerofitError("offload_param", f"needs ZeRO stage 3, not {stage}", "use --stage 3 or --offload-param none")
    if offload_opt != "none" and stage == 0:
        raise ZerofitError("offload_optimizer", "needs ZeRO stage 1, 2 or 3", "use --stage 2 or --offload-optimizer none")
    micro = answers.micro_batch or 1
    world = answers.world_size
    accum = 1
    if answers.global_batch is not None:
        if answers.global_batch % (micro * world):
            raise ZerofitError("global_batch", f"{answers.global_batch} is not a multiple of micro {micro} x {world} GPUs",
                               f"use a multiple of {micro * world}")
        accum = answers.global_batch // (micro * world)
    setup = make_setup(answers, precision, stage, offload_opt, offload_param,
                       bool(answers.gradient_checkpointing), micro, accum)
    est = estimate_memory(model, setup)
    return {
        "model": model.name, "params": model.params, "gpu": gpu.key, "world_size": world,
        "stage": stage, "offload_optimizer": offload_opt, "offload_param": offload_param,
        "precision": precision, "micro_batch": micro, "grad_accum": accum, "seq_len": answers.seq_len,
        "gradient_checkpointing": bool(answers.gradient_checkpointing), "workload": answers.workload,
        "peak_gib": round(est.peak_gib, 3), "fits": est.fits(gpu.memory_gib, answers.headroom),
        "budget_gib": round(gpu.memory_gib * answers.headroom, 2), "peak_phase": est.phase,
        "breakdown": est.breakdown_gib(), "cpu_gib": round(est.cpu_gib, 3),
        "cuda_context_gib": round(est.context_bytes / GIB, 3),
    }


def run(args) -> int:
    result = build_estimate(answers_from_args(args))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['model']} on {result['world_size']} x {result['gpu']}: ZeRO-{result['stage']}, "
                        f"micro {result['micro_batch']}, seq {result['seq_len']}, peak in {result['peak_phase']}")
    table.add_column("component")
    table.add_column("GiB / GPU", justify="right")
    for name, gib in result["breakdown"].items():
        table.add_row(name, f"{gib:.2f}")
    table.add_row("[bold]peak (max_memory_allocated)[/bold]", f"[bold]{result['peak_gib']:.2f}[/bold]")
    console = Console()
    console.print(table)
    verdict = "fits" if result["fits"] else "does NOT fit"
    console.print(f"{verdict} in the {result['budget_gib']} GiB budget (GPU memory x headroom); "
                  f"CPU RAM for offload: {result['cpu_gib']:.1f} GiB per node")
    return 0
