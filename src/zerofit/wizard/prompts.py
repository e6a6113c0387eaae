"""The interactive wizard: questions -> questionary prompts, the plan review loop, its rendering.

The only module that imports questionary. What to ask lives in zerofit.wizard.questions as data;
this module asks it, turns the answers into Answers, shows the plan and lets the user override any
decision or change any answer. It writes nothing: the command writes the files once, at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import questionary
from questionary import Choice

from zerofit.errors import ZerofitError
from zerofit.planning.answers import Answers, answers_from_dict
from zerofit.wizard.questions import (
    BACK,
    BACK_TEXT,
    BACK_TITLE,
    OVERRIDABLE,
    Question,
    apply_defaults,
    default_for,
    message_for,
    nvme_question,
    override_question,
    settle,
    shown_default,
    still_valid,
    to_text,
)

Planner = Callable[[Answers], Any]  # Answers -> zerofit.plan.Plan


class LazyConsole:
    """A rich Console built on first use (importing rich before the first prompt costs start-up
    time)."""

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


_UNSET = object()  # ``prompt``'s ``current`` when no earlier answer is to be shown
_BACK_HINT = "type < and Enter to go back to the previous question"


def select(message: str, choices: list[Choice], term: Terminal, default: Any = None) -> Any:
    """A questionary select asked until one of ``choices`` is picked.

    Esc then Enter ends questionary's select with an empty result instead of a choice; recording
    it would fail Answers' validation questions later, so the same select is asked again here.
    """
    values = [choice.value for choice in choices]
    while True:
        picked = questionary.select(message, choices=choices, default=default, **term.io())
        picked = picked.unsafe_ask()  # unsafe: Ctrl-C propagates instead of returning None
        if picked not in ("", None) and picked in values:
            return picked
        back = " (or ← back)" if BACK in values else ""
        term.console.print(f"[yellow]no choice picked: use the arrow keys and Enter{back}[/yellow]")


def prompt(
    q: Question, answers: dict, term: Terminal, current: Any = _UNSET, back: bool = False
) -> Any:
    """Ask one question; returns the Answers-typed value. Ctrl-C raises KeyboardInterrupt.

    ``current``: an earlier answer, shown as the default instead of the question's own.
    ``back``: offer going back ("← back" on a select, "<" typed into a text); returns BACK.
    """
    message = message_for(q, answers)
    if current is _UNSET:
        default = default_for(q, answers)
        shown = default if q.kind in ("select", "confirm") else to_text(default)
    else:
        shown = shown_default(q, current)
    if q.kind == "select":
        choices = [Choice(title, value=value) for value, title in q.choices]
        choices += [Choice(BACK_TITLE, value=BACK)] if back else []
        picked = select(message, choices, term, default=_choice_default(q, shown))
        return picked if picked is BACK else q.convert(picked)
    if q.kind == "confirm":
        question = questionary.confirm(message, default=bool(shown), **term.io())
        return q.convert(question.unsafe_ask())

    def validate(text: str) -> bool | str:
        return True if back and text.strip() == BACK_TEXT else q.validate(text, answers)

    extra = {"bottom_toolbar": _BACK_HINT} if back else {}
    if q.kind == "autocomplete" and q.choices:
        question = questionary.autocomplete(
            message,
            choices=[name for name, _ in q.choices],
            meta_information={name: meta for name, meta in q.choices if meta},
            default=shown,
            validate=validate,
            **extra,
            **term.io(),
        )
    else:
        question = questionary.text(
            message, default=shown, validate=validate, **extra, **term.io()
        )
    text = question.unsafe_ask()
    return BACK if back and text.strip() == BACK_TEXT else q.convert(text)


def _choice_default(q: Question, default: Any) -> Any:
    values = [v for v, _ in q.choices]
    return default if default in values else values[0]


def ask_checked(
    q: Question, answers: dict, term: Terminal, current: Any = _UNSET, back: bool = False
) -> Any:
    """``prompt`` until the answer passes the question's slow ``check``; prints its warning.
    Returns BACK when the user goes back instead."""
    while True:
        value = prompt(q, answers, term, current, back)
        if value is BACK:
            return BACK
        ok = q.check(value) if q.check else True
        if ok is True:
            break
        term.console.print(f"[red]{ok}[/red]")
    warning = q.warn(value, answers) if q.warn else None
    if warning:
        term.console.print(f"[yellow]warning: {warning}[/yellow]")
    return value


def ask_all(questions: Sequence[Question], answers: dict, term: Terminal) -> dict:
    """Ask every question whose ``when`` holds, in order; a failed ``check`` re-asks the same one.

    Every question after the first offers going back: the previous question asked comes again,
    its answer as the default. A question whose ``when`` no longer holds keeps its starting
    value, so going back and changing an answer ends where a fresh walk would.
    """
    start, answers = answers, dict(answers)
    asked: list[int] = []  # positions answered, in order: where going back returns to
    answered: set[str] = set()  # asked at least once: shown with the earlier answer
    position = 0
    while position < len(questions):
        q = questions[position]
        if not q.when(answers):
            if q.name in start:
                answers[q.name] = start[q.name]
            answered.discard(q.name)
            position += 1
            continue
        current = answers[q.name] if q.name in answered else _UNSET
        value = ask_checked(q, answers, term, current, back=bool(asked))
        if value is BACK:
            position = asked.pop()
            continue
        answers[q.name] = value
        answered.add(q.name)
        asked.append(position)
        position += 1
    return answers


def validated_answers(
    answers: dict, questions: Sequence[Question], term: Terminal | None
) -> Answers:
    """Answers from ``answers``. A cross-field problem found by Answers validation (e.g. bf16 on a
    GPU without it) re-asks that question instead of failing after the user answered everything;
    without a terminal (``term`` None) it is raised."""
    by_name = {q.name: q for q in questions}
    answers = dict(answers)
    while True:
        try:
            return answers_from_dict(answers)
        except ZerofitError as err:
            if term is None or err.field not in by_name:
                raise
            term.console.print(f"[red]{err.render()}[/red]")
            answers[err.field] = ask_checked(by_name[err.field], answers, term)


def collect_answers(
    questions: Sequence[Question], start: dict, term: Terminal | None, defaults: bool = False
) -> Answers:
    """Answers from the questions: prompted, or every default when ``defaults`` (same walk either
    way)."""
    if defaults:
        return validated_answers(apply_defaults(questions, start), questions, None)
    return validated_answers(settle(ask_all(questions, start, term), start), questions, term)


# --- plan review -------------------------------------------------------------------------------

CHANGE_ANSWER = "change an answer"  # the plan menu's value for "Change an answer ..."


def review_plan(
    answers: Answers,
    planner: Planner,
    term: Terminal,
    questions: Sequence[Question] = (),
    start: dict | None = None,
) -> tuple[Answers, Any] | None:
    """Show the plan and let the user override decisions or change answers (``questions``, with
    ``start`` the answers they started from) until they accept; None: quit.

    A rejected change (Answers refuses the value, or the planner refuses the result) asks the
    same question again: going back to the menu would leave the cursor on "Accept and write the
    files", and the user's next Enter would write a plan they were still changing.
    """
    plan = planner(answers)
    show_plan(plan, term.console)
    again = None
    while True:
        choice = again or select("Accept this plan?", _review_choices(plan, questions), term)
        again = None
        if choice == "accept":
            return answers, plan
        if choice == "quit":
            return None
        try:
            if choice == CHANGE_ANSWER:
                changed = change_answer(answers, questions, start or {}, term)
            else:
                changed = ask_override(choice, answers, plan, term)
            if changed == answers:
                continue  # nothing changed: the plan on screen still holds
            new_plan = planner(changed)
        except ZerofitError as err:
            undone = "change" if choice == CHANGE_ANSWER else "override"
            term.console.print(f"[red]{err.render()}[/red] - {undone} undone, choose again")
            again = choice
            continue
        show_plan(new_plan, term.console, before=plan)
        answers, plan = changed, new_plan


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


def change_answer(
    answers: Answers, questions: Sequence[Question], start: dict, term: Terminal
) -> Answers:
    """Pick one answer (nodes, GPUs, seq_len, ... what a suggestion names), ask it again, then
    ask what the new value calls for (``ask_follow_ups``). ``answers`` unchanged on "← back"."""
    names = start or {q.name: None for q in questions}
    current = {name: getattr(answers, name) for name in names}
    choices = [
        Choice(f"{q.label or q.name}: {_show_answer(q, current)}", value=q.name)
        for q in questions
        if q.when(current)
    ]
    choices.append(Choice("← back to the plan", value=BACK))
    name = select("Which answer?", choices, term)
    if name is BACK:
        return answers
    changed = ask_follow_ups(questions, name, current, start, term)
    return validated_answers(settle(changed, start) if start else changed, questions, term)


def ask_follow_ups(
    questions: Sequence[Question], name: str, answers: dict, start: dict, term: Terminal
) -> dict:
    """Ask question ``name`` again, then each later question the new answer calls for: one that
    now applies and did not (2 nodes: the main address), or whose answer it invalidates (a
    global batch no longer a multiple of the GPUs). One that no longer applies takes its
    starting value, as in a fresh walk."""
    before, answers = answers, dict(answers)
    at = [q.name for q in questions].index(name)
    answers[name] = ask_checked(questions[at], answers, term, current=answers[name])
    for later in questions[at + 1 :]:
        if not later.when(answers):
            answers[later.name] = start.get(later.name, answers[later.name])
        elif not later.when(before):
            answers[later.name] = ask_checked(later, answers, term)
        elif not still_valid(later, answers):
            answers[later.name] = ask_checked(later, answers, term, current=answers[later.name])
    return answers


def _show_answer(q: Question, answers: dict) -> str:
    """An answer as the "change an answer" list shows it: the choice picked, or the text typed."""
    value = answers.get(q.name)
    shown = shown_default(q, value)
    if q.kind == "select" and shown is None:  # precision None: what the GPU gives
        shown = default_for(q, answers)
    return _show(shown) if shown not in ("", None) else "blank (planner decides)"


def _review_choices(plan, questions: Sequence[Question] = ()) -> list[Choice]:
    choices = [Choice("Accept and write the files", value="accept")]
    for name, label in OVERRIDABLE.items():
        now = getattr(plan, name)
        choices.append(Choice(f"Change {label} (now {_show(now)})", value=name))
    if questions:
        choices.append(
            Choice(
                "Change an answer (nodes, GPUs, seq_len, global batch, GPU, precision, ...)",
                value=CHANGE_ANSWER,
            )
        )
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

    from zerofit.models.resolve import param_count_words
    from zerofit.planning.verdicts import plan_warning, speed_words

    answers, gpu = plan.answers, plan.gpu
    fit = Text("fits", style="bold green") if plan.fits else Text("does NOT fit", style="bold red")
    nodes = f"{answers.num_nodes} node{'s' if answers.num_nodes > 1 else ''}"
    head = Text.assemble(
        (f"{plan.model_name}", "bold"),
        f" ({param_count_words(plan.params)} params) on {answers.gpus_per_node} x {gpu.key} "
        f"({gpu.memory_gib:g} GiB) x {nodes}, {plan.precision}, {answers.workload}, "
        f"seq {answers.seq_len}\n",
        f"peak {plan.peak_gib:.1f} GiB per GPU of {gpu.memory_gib:g} GiB "
        f"(the GPU holds {plan.gpu_need_gib:.1f} with allocator, NCCL, context and margin; "
        f"limit {gpu.memory_gib * answers.headroom:.1f} at headroom {answers.headroom:g}): ",
        fit,
    )
    if before is not None:
        head.append(
            f"   (was {before.peak_gib:.1f} GiB, {'fits' if before.fits else 'did not fit'})",
            style="dim",
        )
    decisions = Table("decision", "value", "why", box=None, pad_edge=False, show_edge=False)
    overridden = {name for name in OVERRIDABLE if getattr(answers, name) is not None}
    for decision in plan.decisions:
        mark = " *" if decision.field in overridden else ""
        decisions.add_row(decision.field, _show(decision.value) + mark, decision.reason)
    batch = Text(
        f"batch: {plan.micro_batch} micro x {plan.grad_accum} accumulation x "
        f"{plan.world_size} GPUs = {plan.global_batch} sequences per step"
        + ("   (* = your override)" if overridden else "")
    )
    out = [
        head,
        decisions,
        batch,
        Text(speed_words(plan)),
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
            "s/step",
            title="alternatives",
            title_justify="left",
            box=None,
        )
        for alt in plan.alternatives:
            current = (alt.option, alt.micro_batch) == (plan.option, plan.micro_batch)
            alts.add_row(
                ">" if current else "",
                str(alt.stage),
                alt.offload_optimizer,
                alt.offload_param,
                _show(alt.gradient_checkpointing),
                str(alt.micro_batch),
                f"{alt.peak_gib:.1f}",
                Text("yes", style="green") if alt.fits else Text("no", style="red"),
                "-" if alt.step_time_s is None else f"{alt.step_time_s:.2f}",
            )
        out.append(alts)
    warning = plan_warning(plan)
    if warning:
        out.append(Text(warning, style="bold red"))
    out += [Text(f"suggestion: {tip}", style="yellow") for tip in plan.suggestions]
    return out


def show_plan(plan, console, before=None) -> None:
    """Print ``render_plan`` to ``console``."""
    console.print()
    for item in render_plan(plan, before=before):
        console.print(item)
    console.print()
