"""Plan: the resolved configuration (stage, offload, batch arithmetic) with a reason per decision.

CONTRACT (shared by builders, wizard, launch): the dataclass fields below are stable.
`plan(answers)` is implemented by the planner work; keep its signature.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from zerofit.planning.answers import Answers
from zerofit.hardware import GpuSpec
from zerofit.planning.decision import Decision


@dataclass(frozen=True)
class Alternative:
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


@dataclass(frozen=True)
class Plan:
    answers: Answers
    gpu: GpuSpec
    model_name: str
    params: int  # total parameters
    hidden_size: int
    precision: str  # bf16 | fp16 | fp32
    world_size: int
    stage: int
    offload_optimizer: str  # none | cpu | nvme
    offload_param: str  # none | cpu | nvme
    gradient_checkpointing: bool
    micro_batch: int
    grad_accum: int
    global_batch: int  # micro_batch * grad_accum * world_size, always
    peak_gib: float  # predicted per-GPU peak of torch.cuda.max_memory_allocated()
    fits: bool
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
        )


def plan(answers: Answers, model: Any = None) -> Plan:
    """Resolve ``answers`` into the fastest configuration that fits, with reasons.

    ``model`` (a ``zerofit.models.resolve.ModelSpec``) skips resolving ``answers.model`` when given.
    Every override in ``answers`` (stage, offload, checkpointing, micro batch) is honoured; when
    nothing fits, the least-memory candidate is returned with ``fits=False`` and suggestions.
    """
    from zerofit.hardware import lookup
    from zerofit.planning.planner import (
        best_of,
        evaluate,
        host_ram_gib,
        micro_choices,
        option_grid,
        pick_global_batch,
        pads_batches,
        pick_precision,
    )
    from zerofit.planning.reasons import decide, suggest

    if model is None:
        from zerofit.models.resolve import resolve_model

        model = resolve_model(answers.model)
    gpu = lookup(answers.gpu)
    world = answers.world_size
    precision, precision_why = pick_precision(answers, gpu)
    ram, ram_source = host_ram_gib(answers, gpu)
    global_batch, batch_why = pick_global_batch(answers)
    per_rank = global_batch // world
    micros = micro_choices(answers, per_rank)
    pool = [
        c
        for option in option_grid(answers)
        for c in evaluate(model, answers, gpu, precision, option, micros, per_rank)
    ]
    chosen = best_of(pool)
    budget = gpu.memory_gib * answers.headroom
    desc = f"{model.name} ({model.params / 1e9:.2f}B) on {world} x {gpu.key}"
    accum = per_rank // chosen.micro_batch
    decisions = [
        Decision("precision", precision, precision_why),
        Decision("global_batch", global_batch, batch_why),
    ]
    decisions += decide(chosen, pool, answers, gpu, budget, desc)
    decisions.append(
        Decision(
            "grad_accum",
            accum,
            f"{accum} = global batch {global_batch} / "
            f"(micro {chosen.micro_batch} x {world} GPUs)",
        )
    )
    everything = [
        c
        for option in option_grid(answers, honour_overrides=False)
        for c in evaluate(model, answers, gpu, precision, option, micros, per_rank)
    ]
    alternatives = []
    for key in dict.fromkeys(
        (c.stage, c.offload_optimizer, c.offload_param, c.gradient_checkpointing)
        for c in everything
    ):
        c = best_of(
            [
                x
                for x in everything
                if (x.stage, x.offload_optimizer, x.offload_param, x.gradient_checkpointing) == key
            ]
        )
        alternatives.append(
            Alternative(
                c.stage,
                c.offload_optimizer,
                c.offload_param,
                c.gradient_checkpointing,
                c.micro_batch,
                round(c.estimate.peak_gib, 2),
                c.fits,
                round(c.need_gib, 2),
                round(c.estimate.cpu_gib, 2),
                c.failing_budget,
                c.pin_memory,
            )
        )
    suggestions = (
        ()
        if chosen.fits
        else tuple(suggest(model, answers, gpu, precision, per_rank, budget, chosen))
    )
    est = chosen.estimate
    return Plan(
        answers=answers,
        gpu=gpu,
        model_name=model.name,
        params=model.params,
        hidden_size=model.hidden_size,
        precision=precision,
        world_size=world,
        stage=chosen.stage,
        offload_optimizer=chosen.offload_optimizer,
        offload_param=chosen.offload_param,
        gradient_checkpointing=chosen.gradient_checkpointing,
        micro_batch=chosen.micro_batch,
        grad_accum=accum,
        global_batch=chosen.micro_batch * accum * world,
        peak_gib=round(est.peak_gib, 2),
        fits=chosen.fits,
        breakdown_gib=est.breakdown_gib(gpu.memory_gib),
        cpu_gib=round(est.cpu_gib, 2),
        decisions=tuple(decisions),
        alternatives=tuple(alternatives),
        suggestions=suggestions,
        gpu_need_gib=round(chosen.need_gib, 2),
        spare_gib=round(chosen.spare_gib, 3),
        host_ram_gib=round(ram, 1),
        host_ram_source=ram_source,
        failing_budget=chosen.failing_budget,
        optimizer=est.optimizer,
        loss_path=est.loss_path,
        pin_memory=chosen.pin_memory,
        padded=pads_batches(answers, chosen.micro_batch),
    )


def fused_head_hint(p: Plan) -> str | None:
    """What the plan would be under TRL >= 1.16's fused LM head, when it assumed the full logits
    and that head changes it: its SFT, DPO and GRPO trainers never build the logits
    (memory/losses.py), so a TRL user can take a bigger micro batch or a lighter config. None
    when the user named a loss path or the fused head plans the same."""
    if p.answers.loss_kernel is not None:  # left to the stack: full logits or trl_logps
        return None
    fused = plan(replace(p.answers, loss_kernel="trl_fused"))
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
