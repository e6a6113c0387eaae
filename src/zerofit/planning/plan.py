"""Plan: the resolved configuration (stage, offload, batch arithmetic) with a reason per decision.

CONTRACT (shared by builders, wizard, launch): the dataclass fields below are stable.
`plan(answers)` is implemented by the planner work; keep its signature.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from zerofit.hardware import GpuSpec
from zerofit.planning.answers import Answers
from zerofit.planning.decision import Decision
from zerofit.planning.options import TrainingOption, all_options, allowed_options
from zerofit.planning.speed_report import SpeedReport, build_speed_report

if TYPE_CHECKING:
    from zerofit.planning.planner import Candidate, Network, PlanInputs


@dataclass(frozen=True)
class Alternative:
    """One option of the grid at its best micro batch: a row of the alternatives table."""

    stage: int
    offload_optimizer: str
    offload_param: str
    gradient_checkpointing: bool
    micro_batch: int
    peak_gib: float
    fits: bool
    gpu_need_gib: float = 0.0  # peak + allocator, NCCL, CUDA context, vLLM + safety margin
    cpu_gib: float = 0.0  # host RAM per node
    failing: str | None = None  # "gpu", "host", "gpu+host" or None
    pin_memory: bool = True  # offload buffers page-locked
    zero_plus: str = "none"  # ZeRO++ (planning/options.py): none | hpz | hpz+qwz+qgz
    # predicted seconds per optimizer step and what they give (speed/step_time.py), the run's
    # hours when the dataset size is given
    step_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    run_time_h: float | None = None

    @property
    def option(self) -> TrainingOption:
        return TrainingOption(
            self.stage,
            self.offload_optimizer,
            self.offload_param,
            self.gradient_checkpointing,
            self.zero_plus,
        )

    @classmethod
    def of(cls, candidate: Candidate, steps: int | None, network: Network) -> "Alternative":
        """The row of ``candidate``, its GiB rounded to 2 places; ``steps``: the run's optimizer
        steps (None: no dataset size)."""
        option = candidate.option
        speed = build_speed_report(candidate.step, steps, network)
        return cls(
            stage=option.stage,
            offload_optimizer=option.offload_optimizer,
            offload_param=option.offload_param,
            gradient_checkpointing=option.gradient_checkpointing,
            micro_batch=candidate.micro_batch,
            peak_gib=round(candidate.estimate.peak_gib, 2),
            fits=candidate.fits,
            gpu_need_gib=round(candidate.need_gib, 2),
            cpu_gib=round(candidate.estimate.cpu_gib, 2),
            failing=candidate.failing_budget,
            pin_memory=candidate.pin_memory,
            zero_plus=option.zero_plus,
            step_time_s=speed.step_time_s,
            tokens_per_s_per_gpu=speed.tokens_per_s_per_gpu,
            mfu=speed.mfu,
            run_time_h=speed.run_time_h,
        )


# Plan.as_json: the fields --json names otherwise, and those it leaves out
_JSON_NAMES = {"model_name": "model", "breakdown_gib": "breakdown"}
_NOT_IN_JSON = ("answers", "hidden_size", "pin_memory")


@dataclass(frozen=True)
class Plan:
    """The chosen configuration, its numbers and its reasons; the fields in ``--json``'s order
    (``as_json``)."""

    answers: Answers
    model_name: str
    params: int  # total parameters
    gpu: GpuSpec
    hidden_size: int
    world_size: int
    precision: str  # bf16 | fp16 | fp32
    stage: int
    offload_optimizer: str  # none | cpu | nvme
    offload_param: str  # none | cpu | nvme
    gradient_checkpointing: bool
    micro_batch: int
    grad_accum: int
    global_batch: int  # micro_batch * grad_accum * world_size, always
    peak_gib: float  # predicted per-GPU peak of torch.cuda.max_memory_allocated()
    fits: bool
    # where the peak is: forward, backward, optimizer, ... or load (QLoRA's 4-bit base whole on
    # every GPU before ZeRO-3 partitions it, memory/lora.py ``zero3_qlora_load_bytes``)
    peak_phase: str = ""
    breakdown_gib: dict[str, float] = field(default_factory=dict)
    cpu_gib: float = 0.0
    decisions: tuple[Decision, ...] = ()
    alternatives: tuple[Alternative, ...] = ()
    suggestions: tuple[str, ...] = ()  # what would fit, when nothing does
    gpu_need_gib: float = 0.0  # everything the GPU holds, compared with its memory
    spare_gib: float = 0.0  # what the GPU budget leaves beyond gpu_need_gib
    host_ram_gib: float = 0.0  # host RAM per node the verdict used
    host_ram_source: str = ""  # given | this node | assumed
    failing_budget: str | None = None  # gpu | host | gpu+host when it does not fit
    optimizer: str = ""  # the optimizer implementation the estimate assumed
    loss_path: str = ""  # hf | liger | trl_fused
    pin_memory: bool = True  # offload blocks' pin_memory (page-locked host buffers)
    padded: bool = False  # micro batches estimated as padded (planner.pads_batches)
    zero_plus: str = "none"  # ZeRO++ (planning/options.py): none | hpz | hpz+qwz+qgz
    # predicted speed, the run's length and the network they assume; --json prints its fields
    # at the top level, last
    speed: SpeedReport = field(default_factory=SpeedReport)

    @property
    def option(self) -> TrainingOption:
        return TrainingOption(
            self.stage,
            self.offload_optimizer,
            self.offload_param,
            self.gradient_checkpointing,
            self.zero_plus,
        )

    def as_json(self) -> dict[str, Any]:
        """What ``zerofit plan --json`` prints: every field under its key, but the answers (the
        input) and the values only the config files use; the GPU by its catalog key, the model
        by its name, the stack the estimate assumed."""
        out: dict[str, Any] = {}
        for item in fields(self):
            if item.name in _NOT_IN_JSON:
                continue
            value = getattr(self, item.name)
            if item.name == "gpu":
                value = value.key
            elif item.name in ("decisions", "alternatives"):
                value = [asdict(row) for row in value]
            elif item.name == "suggestions":
                value = list(value)
            elif item.name == "speed":
                out.update(value.as_json())
                continue
            elif item.name == "optimizer":
                out["stack"] = self.answers.stack  # what the optimizer and loss path follow
            out[_JSON_NAMES.get(item.name, item.name)] = value
        return out

    @property
    def shape(self) -> tuple:
        """The decisions that make it a different configuration: two plans with the same shape
        write the same files and the same verdict."""
        return (
            self.stage,
            self.offload_optimizer,
            self.offload_param,
            self.gradient_checkpointing,
            self.micro_batch,
            self.fits,
            self.zero_plus,
        )


def plan(answers: Answers, model: Any = None) -> Plan:
    """Resolve ``answers`` into the fastest configuration that fits, with reasons.

    ``model`` (a ``zerofit.models.resolve.ModelSpec``) skips resolving ``answers.model`` when given.
    Every override in ``answers`` (stage, offload, checkpointing, micro batch) is honoured; when
    nothing fits, the least-memory candidate is returned with ``fits=False`` and suggestions.
    The grid (every option the overrides allow, and every option for the alternatives table) is
    estimated once at every micro batch that divides each GPU's share.
    """
    from zerofit.hardware import lookup
    from zerofit.planning.planner import (
        best_of,
        evaluate_grid,
        micro_choices,
        pick_global_batch,
        pick_precision,
        plan_inputs,
        run_optimizer_steps,
    )
    from zerofit.planning.reasons import decide, suggest

    if model is None:
        from zerofit.models.resolve import resolve_model

        model = resolve_model(answers.model)
    gpu = lookup(answers.gpu)
    precision, precision_why = pick_precision(answers, gpu)
    global_batch, batch_why = pick_global_batch(answers)
    per_rank = global_batch // answers.world_size
    micro_batches = micro_choices(answers, per_rank)
    allowed = allowed_options(answers)
    inputs = plan_inputs(model, answers, gpu, precision, per_rank)
    grid = evaluate_grid(inputs, allowed + all_options(answers.num_nodes), micro_batches)
    pool = [c for c in grid if c.option in allowed]
    chosen = best_of(pool)
    steps = run_optimizer_steps(answers, answers.seq_len, global_batch)
    decisions = [
        Decision("precision", precision, precision_why),
        Decision("global_batch", global_batch, batch_why),
        *decide(chosen, pool, inputs),
        _grad_accum_decision(chosen, inputs, global_batch),
    ]
    suggestions = () if chosen.fits else tuple(suggest(inputs, chosen))
    alternatives = alternatives_of(grid, steps, inputs.network)
    return _build_plan(inputs, chosen, decisions, alternatives, suggestions, steps)


def _grad_accum_decision(chosen: Candidate, inputs: PlanInputs, global_batch: int) -> Decision:
    grad_accum = inputs.per_rank // chosen.micro_batch
    return Decision(
        "grad_accum",
        grad_accum,
        f"{grad_accum} = global batch {global_batch} / "
        f"(micro {chosen.micro_batch} x {inputs.world_size} GPUs)",
    )


def alternatives_of(
    grid: list[Candidate], steps: int | None, network: Network
) -> tuple[Alternative, ...]:
    """Every option of the full grid at its best micro batch, in the grid's order."""
    from zerofit.planning.planner import best_of

    rows = []
    # the grid's order with ZeRO++ (all_options of more than one node): its rows appear only
    # where the grid holds them, i.e. across nodes
    for option in all_options(num_nodes=2):
        of_option = [c for c in grid if c.option == option]
        if of_option:
            rows.append(Alternative.of(best_of(of_option), steps, network))
    return tuple(rows)


def _build_plan(
    inputs: PlanInputs,
    chosen: Candidate,
    decisions: list[Decision],
    alternatives: tuple[Alternative, ...],
    suggestions: tuple[str, ...],
    steps: int | None,
) -> Plan:
    from zerofit.planning.planner import pads_batches

    estimate, option, model = chosen.estimate, chosen.option, inputs.model
    grad_accum = inputs.per_rank // chosen.micro_batch
    return Plan(
        answers=inputs.answers,
        gpu=inputs.gpu,
        model_name=model.name,
        params=model.params,
        hidden_size=model.hidden_size,
        precision=inputs.precision,
        world_size=inputs.world_size,
        stage=option.stage,
        offload_optimizer=option.offload_optimizer,
        offload_param=option.offload_param,
        gradient_checkpointing=option.gradient_checkpointing,
        micro_batch=chosen.micro_batch,
        grad_accum=grad_accum,
        global_batch=chosen.micro_batch * grad_accum * inputs.world_size,
        peak_gib=round(estimate.peak_gib, 2),
        fits=chosen.fits,
        peak_phase=estimate.phase,
        breakdown_gib=estimate.breakdown_gib(inputs.gpu.memory_gib),
        cpu_gib=round(estimate.cpu_gib, 2),
        decisions=tuple(decisions),
        alternatives=alternatives,
        suggestions=suggestions,
        gpu_need_gib=round(chosen.need_gib, 2),
        spare_gib=round(chosen.spare_gib, 3),
        host_ram_gib=round(inputs.host_ram_gib, 1),
        host_ram_source=inputs.host_ram_source,
        failing_budget=chosen.failing_budget,
        optimizer=estimate.optimizer,
        loss_path=estimate.loss_path,
        pin_memory=chosen.pin_memory,
        padded=pads_batches(inputs.answers, chosen.micro_batch),
        zero_plus=option.zero_plus,
        speed=build_speed_report(chosen.step, steps, inputs.network),
    )


def fused_head_hint(p: Plan) -> str | None:
    """What the plan would be under TRL >= 1.16's fused LM head, when it assumed the full logits
    and that head changes it: its SFT, DPO and GRPO trainers never build the logits
    (memory/losses.py), so a TRL user can take a bigger micro batch or a lighter config. None
    when the user named a loss path or the fused head plans the same."""
    if p.answers.loss_kernel is not None:  # left to the stack: full logits or trl_logps
        return None
    fused = plan(p.answers.replace(loss_kernel="trl_fused"))
    if fused.shape == p.shape:
        return None
    checkpointing = "on" if fused.gradient_checkpointing else "off"
    verdict = "fits" if fused.fits else "does not fit"
    return (
        f"note: the {'full fp32 logits' if p.loss_path == 'hf' else 'TRL 0.14-1.15 log-probs'} "
        f"are assumed; with TRL >= 1.16's trainers (fused LM head, --loss-kernel trl_fused) the "
        f"plan is ZeRO-{fused.stage}, offload {fused.offload_optimizer}/{fused.offload_param}, "
        f"checkpointing {checkpointing}, micro {fused.micro_batch} ({verdict})"
    )
