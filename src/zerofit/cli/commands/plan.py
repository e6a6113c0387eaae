"""`zerofit plan`: the predicted fastest configuration that fits, each decision with its reason,
every alternative (stage x offload x checkpointing) with its peak and predicted step time, and
what would fit when nothing does."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from zerofit.cli.answer_flags import add_answer_flags, answers_from_args
from zerofit.cli.console import output_console

if TYPE_CHECKING:
    from zerofit.planning.plan import Plan


def register(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="choose stage, offload, checkpointing and batch sizes that fit",
        description=__doc__,
    )
    add_answer_flags(p)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run)


_FAILING_WORDS = {"host": "no: host RAM", "gpu": "no: GPU"}


def run(args) -> int:
    from zerofit.planning.plan import plan

    result = plan(answers_from_args(args))
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
        return 0
    console = output_console()
    console.print(render_decisions(result))
    console.print(render_speed(result), highlight=False)
    console.print(render_alternatives(result))
    for line in render_notes(result):
        console.print(line)
    return 0


def render_decisions(plan: Plan):
    """The verdict as the title, then each decision with its reason."""
    from rich.table import Table

    from zerofit.planning.verdicts import plan_verdict

    head = Table(
        title=f"{plan.model_name} on {plan.world_size} x {plan.gpu.key}: {plan_verdict(plan)}; "
        f"peak {plan.peak_gib:.1f} GiB/GPU, the GPU holds {plan.gpu_need_gib:.1f} of "
        f"{plan.gpu.memory_gib * plan.answers.headroom:.1f}"
    )
    head.add_column("decision")
    head.add_column("value")
    head.add_column("why")
    for decision in plan.decisions:
        head.add_row(decision.field, str(decision.value), decision.reason)
    return head


def render_speed(plan: Plan) -> str:
    """The chosen configuration's predicted speed and, with a dataset size, the run's length;
    the network the times assume."""
    from zerofit.planning.verdicts import network_words, speed_words

    return f"{speed_words(plan)}\nnetwork: {network_words(plan)}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def render_alternatives(plan: Plan):
    """Every option of the grid at its best micro batch, with its predicted step time, tokens/s
    per GPU, MFU and (with a dataset size) run time; the chosen one starred."""
    from rich.table import Table

    with_run = plan.speed.run_time_h is not None
    alt = Table(title="alternatives (each at its best micro batch)")
    columns = [
        "stage",
        "offload opt/param",
        "checkpointing",
        "micro",
        "peak GiB",
        "GPU holds GiB",
        "host RAM GiB",
        "fits",
        "s/step",
        "tokens/s/GPU",
        "MFU",
    ]
    for col in columns + (["run h"] if with_run else []):
        alt.add_column(col)
    for row in plan.alternatives:
        chosen = row.option == plan.option
        speed = [
            _seconds(row.step_time_s),
            "-" if row.tokens_per_s_per_gpu is None else f"{row.tokens_per_s_per_gpu:,.0f}",
            "-" if row.mfu is None else f"{row.mfu:.0%}",
        ]
        if with_run:
            speed.append(_seconds(row.run_time_h))
        alt.add_row(
            ("* " if chosen else "") + str(row.stage) + row.option.zero_plus_label,
            f"{row.offload_optimizer}/{row.offload_param}"
            + ("" if row.pin_memory else " unpinned"),
            "on" if row.gradient_checkpointing else "off",
            str(row.micro_batch),
            f"{row.peak_gib:.1f}",
            f"{row.gpu_need_gib:.1f}",
            f"{row.cpu_gib:.1f}",
            "yes" if row.fits else _FAILING_WORDS.get(row.failing, "no"),
            *speed,
        )
    return alt


def render_notes(plan: Plan) -> list[str]:
    """What would fit when nothing does, then the cautions that apply: a tight fit, padded
    batches, what TRL's fused LM head would change."""
    from zerofit.memory.lora import quantized_load_note
    from zerofit.planning.plan import fused_head_hint

    lines = [f"- would fit: {suggestion}" for suggestion in plan.suggestions]
    load_note = quantized_load_note(plan.peak_phase)
    if load_note:
        lines.append(load_note)
    if plan.fits:
        from zerofit.memory.overheads import tight_fit_note

        note = tight_fit_note(plan.spare_gib)
        if note:
            lines.append(note)
    if plan.padded and plan.answers.padding is None and plan.answers.attention == "sdpa":
        from zerofit.memory.activations import padding_note

        lines.append(padding_note())
    hint = fused_head_hint(plan)
    if hint:
        lines.append(hint)
    from zerofit.planning.reasons import adapters_hint

    adapters = adapters_hint(plan)
    if adapters:
        lines.append(adapters)
    return lines
