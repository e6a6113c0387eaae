"""`zerofit plan`: the fastest configuration that fits, each decision with its reason,
every alternative (stage x offload x checkpointing) with its peak, and what would fit when
nothing does."""

from __future__ import annotations

import json

from zerofit.cli.answer_flags import add_answer_flags, answers_from_args


def register(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="choose stage, offload, checkpointing and batch sizes that fit",
        description=__doc__,
    )
    add_answer_flags(p)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run)


def build_plan_dict(p) -> dict:
    """A Plan as plain JSON-able data."""
    return {
        "model": p.model_name,
        "params": p.params,
        "gpu": p.gpu.key,
        "world_size": p.world_size,
        "precision": p.precision,
        "stage": p.stage,
        "offload_optimizer": p.offload_optimizer,
        "offload_param": p.offload_param,
        "gradient_checkpointing": p.gradient_checkpointing,
        "micro_batch": p.micro_batch,
        "grad_accum": p.grad_accum,
        "global_batch": p.global_batch,
        "peak_gib": p.peak_gib,
        "fits": p.fits,
        "breakdown": p.breakdown_gib,
        "cpu_gib": p.cpu_gib,
        "decisions": [
            {"field": d.field, "value": d.value, "reason": d.reason} for d in p.decisions
        ],
        "alternatives": [dict(vars(a)) for a in p.alternatives],
        "suggestions": list(p.suggestions),
        "gpu_need_gib": p.gpu_need_gib,
        "spare_gib": p.spare_gib,
        "host_ram_gib": p.host_ram_gib,
        "host_ram_source": p.host_ram_source,
        "failing_budget": p.failing_budget,
        "stack": p.answers.stack,
        "optimizer": p.optimizer,
        "loss_path": p.loss_path,
        "padded": p.padded,
    }


_FAILING_WORDS = {"host": "no: host RAM", "gpu": "no: GPU"}


def _ram_words(p) -> str:
    if p.host_ram_source == "this node":
        return f"this node has {p.host_ram_gib:.1f} GiB"
    if p.host_ram_source == "given":
        return f"you gave {p.host_ram_gib:.1f} GiB"
    return f"assumed {p.host_ram_gib:.1f} GiB; set --host-ram-gib"


def run(args) -> int:
    from zerofit.planning.plan import fused_head_hint, plan

    p = plan(answers_from_args(args))
    if args.json:
        print(json.dumps(build_plan_dict(p), indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if p.fits:
        verdict = "fits"
    elif p.failing_budget == "host":
        verdict = (
            f"does NOT fit: fits on the GPU but needs {p.cpu_gib:.1f} GiB of host RAM "
            f"per node, {_ram_words(p)}"
        )
    elif p.failing_budget == "gpu":
        verdict = "does NOT fit on the GPU"
    else:
        verdict = f"does NOT fit: neither the GPU nor the host RAM ({_ram_words(p)})"
    head = Table(
        title=f"{p.model_name} on {p.world_size} x {p.gpu.key}: {verdict}; "
        f"peak {p.peak_gib:.1f} GiB/GPU, the GPU holds {p.gpu_need_gib:.1f} of "
        f"{p.gpu.memory_gib * p.answers.headroom:.1f}"
    )
    head.add_column("decision")
    head.add_column("value")
    head.add_column("why")
    for d in p.decisions:
        head.add_row(d.field, str(d.value), d.reason)
    console.print(head)
    alt = Table(title="alternatives (each at its best micro batch)")
    for col in (
        "stage",
        "offload opt/param",
        "checkpointing",
        "micro",
        "peak GiB",
        "GPU holds GiB",
        "host RAM GiB",
        "fits",
    ):
        alt.add_column(col)
    for a in p.alternatives:
        chosen = (a.stage, a.offload_optimizer, a.offload_param, a.gradient_checkpointing) == (
            p.stage,
            p.offload_optimizer,
            p.offload_param,
            p.gradient_checkpointing,
        )
        alt.add_row(
            ("* " if chosen else "") + str(a.stage),
            f"{a.offload_optimizer}/{a.offload_param}" + ("" if a.pin_memory else " unpinned"),
            "on" if a.gradient_checkpointing else "off",
            str(a.micro_batch),
            f"{a.peak_gib:.1f}",
            f"{a.gpu_need_gib:.1f}",
            f"{a.cpu_gib:.1f}",
            "yes" if a.fits else _FAILING_WORDS.get(a.failing, "no"),
        )
    console.print(alt)
    for s in p.suggestions:
        console.print(f"- would fit: {s}")
    if p.fits:
        from zerofit.memory.overheads import tight_fit_note

        note = tight_fit_note(p.spare_gib)
        if note:
            console.print(note)
    if p.padded and p.answers.padding is None and p.answers.attention == "sdpa":
        from zerofit.memory.activations import padding_note

        console.print(padding_note())
    hint = fused_head_hint(p)
    if hint:
        console.print(hint)
    return 0
