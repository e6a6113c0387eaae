"""The interactive wizard: questions -> questionary prompts, the plan review loop, and its rendering.

The only module that imports questionary. What to ask lives in zerofit.wizard.questions as data; this
module asks it, turns the answers into Answers, shows the plan and lets the user override any
decision. It writes nothing: the command writes the files once, at the very end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import questionary
from questionary import Choice

from zerofit.planning.answers import Answers, answers_from_dict
from zerofit.errors import ZerofitError
from zerofit.wizard.questions import (
    OVERRIDABLE,
    Question,
    apply_defaults,
    default_for,
    message_for,
    nvme_question,
    override_question,
    settle,
    to_text,
)

Planner = Callable[[Answers], Any]  # Answers -> zerofit.plan.Plan


class LazyConsole:
    """A rich Console built on first use (importing rich before the first prompt costs start-up time)."""

    def __init__(self, **kwargs: Any):
        self._kwargs, self._console = kwargs, None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
        return getattr(self._console, name)


@dataclass(frozen=True)
class Terminal:
    """Where prompts read and write: real terminal by default, pipe input + DummyOutput in tests."""

    console: Any  # rich.console.Console for everything that is not a prompt
    input: Any = None  # prompt_toolkit input (None: the process's terminal)
    output: Any = None

    def io(self) -> dict:
        return {k: v for k, v in (("input", self.input), ("output", self.output)) if v is not None}


def prompt(q: Question, answers: dict, term: Terminal) -> Any:
    """Ask one question; returns the Answers-typed value. Ctrl-C raises KeyboardInterrupt."""
    message, default = message_for(q, answers), default_for(q, answers)
    validate = lambda text: q.validate(text, answers)
    if q.kind == "select":
        choices = [Choice(title, value=value) for value, title in q.choices]
        question = questionary.select(
            message, choices=choices, default=_choice_default(q, default), **term.io()
        )
    elif q.kind == "confirm":
        question = questionary.confirm(message, default=bool(default), **term.io())
    elif q.kind == "autocomplete" and q.choices:
        question = questionary.autocomplete(
            message,
            choices=[name for name, _ in q.choices],
            meta_information={name: meta for name, meta in q.choices if meta},
            default=to_text(default),
            validate=validate,
            **term.io(),
        )
    else:
        question = questionary.text(
            message, default=to_text(default), validate=validate, **term.io()
        )
    return q.convert(question.unsafe_ask())  # unsafe: Ctrl-C propagates instead of returning None


def _choice_default(q: Question, default: Any) -> Any:
    values = [v for v, _ in q.choices]
    return default if default in values else values[0]


def ask_all(questions: Sequence[Question], answers: dict, term: Terminal) -> dict:
    """Ask every question whose ``when`` holds, in order; a failed ``check`` re-asks the same one."""
    answers = dict(answers)
    i = 0
    while i < len(questions):
        q = questions[i]
        if not q.when(answers):
            i += 1
            continue
        value = prompt(q, answers, term)
        ok = q.check(value) if q.check else True
        if ok is not True:
            term.console.print(f"[red]{ok}[/red]")
            continue
        warning = q.warn(value, answers) if q.warn else None
        if warning:
            term.console.print(f"[yellow]warning: {warning}[/yellow]")
        answers[q.name] = value
        i += 1
    return answers


def collect_answers(
    questions: Sequence[Question], start: dict, term: Terminal | None, defaults: bool = False
) -> Answers:
    """Answers from the questions: prompted, or every default when ``defaults`` (same walk either way).

    A cross-field problem found by Answers validation (e.g. on the GPU list) re-asks that
    question instead of failing after the user has answered everything.
    """
    answers = (
        apply_defaults(questions, start)
        if defaults
        else settle(ask_all(questions, start, term), start)
    )
    by_name = {q.name: q for q in questions}
    while True:
        try:
            return answers_from_dict(answers)
        except ZerofitError as err:
            if defaults or err.field not in by_name:
                raise
            term.console.print(f"[red]{err.render()}[/red]")
            answers[err.field] = prompt(by_name[err.field], answers, term)


# --- plan review -------------------------------------------------------------------------------


def review_plan(answers: Answers, planner: Planner, term: Terminal) -> tuple[Answers, Any] | None:
    """Show the plan and let the user override decisions until they accept (None: quit).

    A rejected override (Answers refuses the value, or the planner refuses the result) asks the
    same question again: going back to the menu would leave the cursor on "Accept and write the
    files", and the user's next Enter would write a plan they were still changing.
    """
    previous, plan, again, last = None, None, None, None
    while True:
        try:
            new_plan = planner(answers)
        except ZerofitError as err:
            if previous is None:
                raise
            term.console.print(f"[red]{err.render()}[/red] - override undone, choose again")
            answers, previous, again = previous, None, last
        else:
            show_plan(new_plan, term.console, before=plan)
            plan, again = new_plan, None
        choice = (
            again
            or questionary.select(
                "Accept this plan?", choices=_review_choices(plan), **term.io()
            ).unsafe_ask()
        )
        if choice == "accept":
            return answers, plan
        if choice == "quit":
            return None
        previous, last = answers, choice
        answers = ask_override(choice, answers, plan, term)


def ask_override(name: str, answers: Answers, plan, term: Terminal) -> Answers:
    """Ask for a new value of ``name`` until Answers accepts it ("auto" is always accepted)."""
    while True:
        question = override_question(name, getattr(answers, name), getattr(plan, name))
        changes = {name: prompt(question, {}, term)}
        nvme_chosen = "nvme" in (changes.get("offload_optimizer"), changes.get("offload_param"))
        if nvme_chosen and not answers.nvme_path:
            changes["nvme_path"] = prompt(nvme_question(answers.nvme_path), {}, term)
        try:
            return answers.replace(**changes)
        except ZerofitError as err:
            term.console.print(f"[red]{err.render()}[/red]")


def _review_choices(plan) -> list[Choice]:
    choices = [Choice("Accept and write the files", value="accept")]
    for name, label in OVERRIDABLE.items():
        now = getattr(plan, name)
        choices.append(Choice(f"Change {label} (now {_show(now)})", value=name))
    choices.append(Choice("Quit without writing anything", value="quit"))
    return choices


def _show(value: Any) -> str:
    return (
        {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)
    )


# --- rendering ---------------------------------------------------------------------------------

_SEGMENT_CHARS = "█▓▒░#=%@"  # distinct without colour too (plain-text transcripts, NO_COLOR)
_SEGMENT_COLORS = (
    "cyan",
    "magenta",
    "yellow",
    "green",
    "blue",
    "red",
    "bright_cyan",
    "bright_magenta",
)


def render_memory_bar(plan, width: int = 60):
    """The per-GPU memory breakdown as a stacked bar against the GPU's capacity (a rich Text).

    One character is ``max(capacity, peak) / width`` GiB; ``|`` marks the headroom limit and, when
    the plan overflows, ``!`` marks the capacity. Parts the breakdown marks "not in peak" and parts
    under 0.05 GiB are listed after the legend, not drawn.
    """
    from rich.text import Text

    capacity = plan.gpu.memory_gib
    limit = capacity * plan.answers.headroom
    scale = max(capacity, plan.peak_gib, 1e-9) / width
    drawn = [(k, v) for k, v in plan.breakdown_gib.items() if v >= 0.05 and "not in peak" not in k]
    drawn = drawn or [("peak", plan.peak_gib)]
    others = [
        (k, v) for k, v in plan.breakdown_gib.items() if (k, v) not in drawn and round(v, 1) > 0
    ]
    cells: list[tuple[str, str]] = []
    total = 0.0
    for i, (_, gib) in enumerate(drawn):
        start = round(total / scale)
        total += gib
        end = max(round(total / scale), start + 1)  # every part stays visible, however small
        cells += [(_SEGMENT_CHARS[i % 8], _SEGMENT_COLORS[i % 8])] * (end - start)
    cells += [("·", "dim")] * (round(capacity / scale) - len(cells))
    limit_at, cap_at = min(round(limit / scale), width) - 1, round(capacity / scale) - 1
    bar = Text("[")
    for pos, (char, style) in enumerate(cells[:width]):
        if pos == cap_at and plan.peak_gib > capacity:
            bar.append("!", style="bold red")
        elif pos == limit_at and char == "·":
            bar.append("|", style="bold")
        else:
            bar.append(char, style=style)
    bar.append("]")
    entries = [
        Text.assemble((f"{_SEGMENT_CHARS[i % 8]} ", _SEGMENT_COLORS[i % 8]), f"{name} {gib:.1f}")
        for i, (name, gib) in enumerate(drawn)
    ]
    entries += [Text(f"not drawn: {name} {gib:.1f}", style="dim") for name, gib in others]
    lines, line = [], Text("  ")
    for entry in entries:  # wrap the legend ourselves: the console does not soft-wrap
        if len(line) > 2 and len(line) + 2 + len(entry) > width + 2:
            lines.append(line)
            line = Text("  ")
        line.append_text(Text("  ") if len(line) > 2 else Text(""))
        line.append_text(entry)
    return Text("\n").join([bar, *lines, line])


def render_plan(plan, before=None) -> list:
    """Rich renderables of a plan: summary, decisions with reasons, memory bar, alternatives."""
    from rich.table import Table
    from rich.text import Text

    a = plan.answers
    fit = Text("fits", style="bold green") if plan.fits else Text("does NOT fit", style="bold red")
    head = Text.assemble(
        (f"{plan.model_name}", "bold"),
        f" ({plan.params / 1e9:.2f} B params) on {a.gpus_per_node} x {plan.gpu.key} ({plan.gpu.memory_gib:g} GiB)"
        f" x {a.num_nodes} node{'s' if a.num_nodes > 1 else ''}, {plan.precision}, {a.workload}, seq {a.seq_len}\n",
        f"peak {plan.peak_gib:.1f} GiB per GPU of {plan.gpu.memory_gib:g} GiB "
        f"(the GPU holds {plan.gpu_need_gib:.1f} with allocator, NCCL, context and margin; "
        f"limit {plan.gpu.memory_gib * a.headroom:.1f} at headroom {a.headroom:g}): ",
        fit,
    )
    if before is not None:
        head.append(
            f"   (was {before.peak_gib:.1f} GiB, {'fits' if before.fits else 'did not fit'})",
            style="dim",
        )
    decisions = Table("decision", "value", "why", box=None, pad_edge=False, show_edge=False)
    overridden = {name for name in OVERRIDABLE if getattr(a, name) is not None}
    for d in plan.decisions:
        decisions.add_row(
            d.field, _show(d.value) + (" *" if d.field in overridden else ""), d.reason
        )
    batch = Text(
        f"batch: {plan.micro_batch} micro x {plan.grad_accum} accumulation x {plan.world_size} GPUs "
        f"= {plan.global_batch} sequences per step"
        + ("   (* = your override)" if overridden else "")
    )
    out = [
        head,
        decisions,
        batch,
        Text("memory per GPU, GiB (| = headroom limit):"),
        render_memory_bar(plan),
    ]
    if plan.alternatives:
        alts = Table(
            "",
            "stage",
            "opt offload",
            "param offload",
            "ckpt",
            "micro",
            "peak GiB",
            "fits",
            title="alternatives",
            title_justify="left",
            box=None,
        )
        for alt in plan.alternatives:
            current = (
                alt.stage,
                alt.offload_optimizer,
                alt.offload_param,
                alt.gradient_checkpointing,
                alt.micro_batch,
            ) == (
                plan.stage,
                plan.offload_optimizer,
                plan.offload_param,
                plan.gradient_checkpointing,
                plan.micro_batch,
            )
            alts.add_row(
                ">" if current else "",
                str(alt.stage),
                alt.offload_optimizer,
                alt.offload_param,
                _show(alt.gradient_checkpointing),
                str(alt.micro_batch),
                f"{alt.peak_gib:.1f}",
                Text("yes", style="green") if alt.fits else Text("no", style="red"),
            )
        out.append(alts)
    if not plan.fits and plan.failing_budget == "host":
        out.append(
            Text(
                f"warning: this plan fits on the GPU but needs {plan.cpu_gib:.1f} GiB of "
                f"host RAM per node for offload ({plan.host_ram_source}: "
                f"{plan.host_ram_gib:.1f} GiB); the node will run out of memory. "
                "You may still accept it.",
                style="bold red",
            )
        )
    elif not plan.fits:
        out.append(
            Text(
                "warning: this plan is estimated NOT to fit in GPU memory; it will likely OOM. "
                "You may still accept it.",
                style="bold red",
            )
        )
    out += [Text(f"suggestion: {s}", style="yellow") for s in plan.suggestions]
    return out


def show_plan(plan, console, before=None) -> None:
    """Print ``render_plan`` to ``console``."""
    console.print()
    for item in render_plan(plan, before=before):
        console.print(item)
    console.print()
