"""Reasons for each planner decision and, when nothing fits, computed suggestions of what would.

A decision between two fits quotes both predicted step times (speed/step_time.py) and the term
that makes the slower one slower: "ZeRO-2, micro 4 at 1.9 s/step beats ZeRO-3, micro 4 at
2.6 s/step: 0.62 s more exposed communication". Fits within ``planner.NEAR_TIE`` of the fastest
are a tie, and the reason says the chosen one leaves more memory to spare.
"""

from __future__ import annotations

from zerofit.errors import ZerofitError
from zerofit.hardware import CATALOG
from zerofit.models.resolve import param_count_words
from zerofit.planning.decision import Decision
from zerofit.planning.options import TrainingOption
from zerofit.planning.planner import NEAR_TIE, Candidate, PlanInputs, best_of, fastest_fit
from zerofit.planning.verdicts import (
    budget_verdict,
    gib,
    host_need_words,
    host_ram_words,
    tight_words,
)

# node counts a suggestion tries, and GPUs per node when the user has one node of a few
SUGGESTED_NODES = (2, 4, 8, 16, 32, 64, 128)
SUGGESTED_GPUS_PER_NODE = (2, 4, 8)

# how a reason names each term of speed/step_time.py's StepTime.breakdown
TERM_WORDS = {
    "compute_s": "compute",
    "recompute_s": "recomputed forward",
    "exposed_comm_s": "exposed communication",
    "offload_transfer_s": "offload transfers over PCIe",
    "cpu_optimizer_s": "CPU Adam step",
    "gpu_optimizer_s": "GPU optimizer step",
    "overhead_s": "fixed per-step cost",
    "generation_s": "generation",  # grpo's rollout (speed/generation.py)
    "dequantize_s": "4-bit dequantization",  # qlora's base (speed/quantization.py)
}


def step_words(candidate: Candidate, workload: str) -> str:
    """'1.9 s/step' (GRPO's with its generation)."""
    seconds = candidate.step_s
    value = f"{seconds:.1f}" if seconds >= 1 else f"{seconds:.2f}"
    return f"{value} s/step"


def slower_by(faster: Candidate, slower: Candidate) -> str:
    """'0.62 s more exposed communication': the term that grows most from ``faster`` to
    ``slower``."""
    fast_terms, slow_terms = faster.step.breakdown(), slower.step.breakdown()
    term = max(slow_terms, key=lambda name: slow_terms[name] - fast_terms[name])
    return f"{slow_terms[term] - fast_terms[term]:.2f} s more {TERM_WORDS[term]}"


def speed_words(chosen: Candidate, rival: Candidate, pool: list[Candidate], workload: str) -> str:
    """Why ``chosen`` and not ``rival`` (both fit), in predicted seconds per step: it is faster,
    or the two are within ``NEAR_TIE`` of the fastest fit and it leaves more memory to spare
    (planner.fastest_of), or they tie with room in both and it is the simpler one."""
    fastest = min(c.step_s for c in pool if c.fits)
    ours, theirs = step_words(chosen, workload), step_words(rival, workload)
    tie = rival.step_s <= fastest * (1 + NEAR_TIE)
    if tie and chosen.tight != rival.tight:
        return (
            f"{chosen.label()} at {ours} and {rival.label()} at {theirs} are within "
            f"{NEAR_TIE:.0%} of the fastest, a tie; the first leaves {gib(chosen.spare_gib)} to "
            f"spare, the second only {gib(rival.spare_gib)}"
        )
    if chosen.step_s < rival.step_s:
        return f"{chosen.label()} at {ours} beats {rival.label()} at {theirs}: " + slower_by(
            chosen, rival
        )
    return (
        f"{chosen.label()} and {rival.label()} both take {ours} with room to spare: the simpler "
        "one"
    )


def fastest_fit_of(pool: list[Candidate], **option_fields) -> Candidate | None:
    """The best fit of ``pool`` whose option has ``option_fields``; None when none fits."""
    fitting = [c for c in pool if c.fits]
    return _best_where(fitting, **option_fields) if fitting else None


def _host_need(candidate: Candidate) -> str:
    check = candidate.check
    return host_need_words(check.cpu_gib, check.host_ram_gib, check.host_ram_source)


def _best_where(pool: list[Candidate], **option_fields) -> Candidate | None:
    """The best candidate of ``pool`` whose option has ``option_fields``; None when none has.
    A field name prefixed ``not_`` asks for options that differ in it."""
    def matches(candidate: Candidate) -> bool:
        for name, value in option_fields.items():
            if name.startswith("not_"):
                if getattr(candidate.option, name[4:]) == value:
                    return False
            elif getattr(candidate.option, name) != value:
                return False
        return True

    group = [c for c in pool if matches(c)]
    return best_of(group) if group else None


def decide(chosen: Candidate, pool: list[Candidate], inputs: PlanInputs) -> list[Decision]:
    """One Decision per knob, each naming the numbers that made it."""
    out = []
    if not chosen.fits:
        out.append(
            Decision(
                "fits",
                False,
                f"nothing fits; the closest is {chosen.label()}, which "
                f"{budget_verdict(chosen.check)}; see the suggestions",
            )
        )
    out.append(decide_stage(chosen, pool, inputs))
    out.append(decide_offload(chosen, pool, inputs))
    if chosen.option.offloaded:
        out.append(Decision("pin_memory", chosen.pin_memory, pin_memory_reason(chosen, inputs)))
    out.append(decide_checkpointing(chosen, pool, inputs))
    out.append(decide_micro_batch(chosen, pool, inputs))
    attention = decide_attention(chosen)
    return out + ([attention] if attention else [])


def _model_needs(chosen: Candidate, inputs: PlanInputs) -> str:
    """'Qwen2.5-7B (7.62B) on 8 x H100-SXM needs 30.1 GiB per GPU (...) of 79.1 GiB'."""
    model, size = inputs.model, param_count_words(inputs.model.params)
    # need = allocated peak + allocator, NCCL, CUDA context (+ vLLM) + safety margin: what the
    # GPU has to hold, the number compared with the budget (the tables also show the peak).
    return (
        f"{model.name} ({size}) on {inputs.world_size} x {inputs.gpu.key} "
        f"needs {gib(chosen.need_gib)} per GPU (peak, allocator, NCCL, CUDA context and "
        f"margin) of {gib(inputs.budget_gib)}"
    )


def _stage0_weights_words(answers, precision: str) -> str:
    """What the GPU holds the weights in without DeepSpeed (memory/estimate.py
    ``TrainSetup.weight_dtype``): a full fine-tune keeps its load dtype (fp32 unless loaded in
    16-bit) with grads and Adam states alike; an adapter's base is frozen in 16-bit (4-bit under
    QLoRA) while PEFT keeps the adapters, their grads and Adam states in fp32
    (peft/tuners/tuners_utils.py ``_cast_adapter_dtype``, ``autocast_adapter_dtype=True``)."""
    if answers.finetuning == "full":
        weights = answers.weights_dtype or "fp32"
        return f"with {weights} weights (grads and Adam states in {weights})"
    if answers.finetuning == "qlora":
        base = "the frozen base's linear layers in 4-bit NF4"
    else:
        base = f"the frozen base in {answers.weights_dtype or precision}"
    return f"with {base} and the adapters' weights, grads and Adam states in fp32"


def decide_stage(chosen: Candidate, pool: list[Candidate], inputs: PlanInputs) -> Decision:
    """The stage, against the next lower stage with the same checkpointing and no offload."""
    stage, answers = chosen.option.stage, inputs.answers
    needs = _model_needs(chosen, inputs)
    if answers.stage is not None:
        why = f"stage {stage}: set by you; {needs}"
        if stage == 0:
            why += ", " + _stage0_weights_words(answers, inputs.precision)
        return Decision("stage", stage, why)
    lower = [
        _best_where(
            pool,
            stage=lower_stage,
            offload_optimizer="none",
            offload_param="none",
            gradient_checkpointing=chosen.option.gradient_checkpointing,
        )
        for lower_stage in range(stage)
    ]
    lower = [c for c in lower if c is not None]
    if stage == 0:
        why = (
            f"stage 0 (plain data parallel, no DeepSpeed): {needs} without "
            f"partitioning anything, {_stage0_weights_words(answers, inputs.precision)}"
        )
    elif lower:
        next_lower = max(lower, key=lambda c: c.option.stage)
        why = f"stage {stage}: {needs}"
        if next_lower.tight and not chosen.tight:
            why += f"; stage {next_lower.option.stage} {tight_words(next_lower)}"
        elif not next_lower.fits:
            why += f"; stage {next_lower.option.stage} {budget_verdict(next_lower.check)}"
    else:
        why = f"stage {stage}: {needs}"
    rival = fastest_fit_of(pool, not_stage=stage)
    if chosen.fits and rival:
        why += "; " + speed_words(chosen, rival, pool, answers.workload)
    if stage in (1, 2) and inputs.world_size == 1:
        why += "; on one GPU stages 1 and 2 partition nothing, the lowest that fits is simplest"
    return Decision("stage", stage, why)


def decide_offload(chosen: Candidate, pool: list[Candidate], inputs: PlanInputs) -> Decision:
    """Where the optimizer states and parameters live, against the best without offload."""
    option, answers = chosen.option, inputs.answers
    value = f"{option.offload_optimizer}/{option.offload_param}"
    if answers.offload_optimizer is not None or answers.offload_param is not None:
        return Decision("offload", value, _offload_overrides_reason(option, answers))
    workload = answers.workload
    if not option.offloaded:
        why = "none: everything fits on the GPU"
        offloaded = [c for c in pool if c.fits and c.option.offloaded]
        if chosen.fits and offloaded:
            why += "; " + speed_words(chosen, best_of(offloaded), pool, workload)
        return Decision("offload", value, why)
    gpu_only = _best_where(pool, offload_optimizer="none", offload_param="none")
    why = f"optimizer on {option.offload_optimizer}"
    if option.offload_param != "none":
        why += f", params on {option.offload_param}"
    if gpu_only and gpu_only.fits and chosen.fits:
        why += ": " + speed_words(chosen, gpu_only, pool, workload)
    elif gpu_only:
        why += f": without offload the best {budget_verdict(gpu_only.check)}"
    why += f"; needs {_host_need(chosen)}"
    return Decision("offload", value, why)


def _offload_overrides_reason(option: TrainingOption, answers) -> str:
    """Each offload with who chose it, when the user set one or both: 'optimizer states
    offloaded to cpu: set by you; params stay on the GPU: planner's choice'."""
    parts = []
    for what, device, given in (
        ("optimizer states", option.offload_optimizer, answers.offload_optimizer),
        ("params", option.offload_param, answers.offload_param),
    ):
        where = "stay on the GPU" if device == "none" else f"offloaded to {device}"
        chooser = "set by you" if given is not None else "planner's choice"
        parts.append(f"{what} {where}: {chooser}")
    return "; ".join(parts)


def decide_checkpointing(
    chosen: Candidate, pool: list[Candidate], inputs: PlanInputs
) -> Decision:
    """Gradient checkpointing, against the same option without it."""
    option, workload = chosen.option, inputs.answers.workload
    if inputs.answers.gradient_checkpointing is not None:
        why = f"{'on' if option.gradient_checkpointing else 'off'}: set by you"
        return Decision("gradient_checkpointing", option.gradient_checkpointing, why)
    other = _best_where(
        pool,
        stage=option.stage,
        offload_optimizer=option.offload_optimizer,
        offload_param=option.offload_param,
        zero_plus=option.zero_plus,
        gradient_checkpointing=not option.gradient_checkpointing,
    )
    compared = chosen.fits and other is not None and other.fits
    if not option.gradient_checkpointing:
        why = "off: activations fit, so no forward is recomputed"
        if compared:
            why += "; " + speed_words(chosen, other, pool, workload)
    elif compared:
        why = "on: " + speed_words(chosen, other, pool, workload)
    else:
        why = "on: " + (
            f"without it the best {budget_verdict(other.check)}" if other else "needed to fit"
        )
    return Decision("gradient_checkpointing", option.gradient_checkpointing, why)


def decide_micro_batch(chosen: Candidate, pool: list[Candidate], inputs: PlanInputs) -> Decision:
    """The micro batch, against the next larger one of the same option."""
    micro_batch = chosen.micro_batch
    if inputs.answers.micro_batch is not None:
        return Decision("micro_batch", micro_batch, f"{micro_batch}: set by you")
    bigger = [c for c in pool if c.option == chosen.option and c.micro_batch > micro_batch]
    if not bigger:
        why = f"{micro_batch}: the largest that divides each GPU's share of the global batch"
        return Decision("micro_batch", micro_batch, why)
    next_bigger = min(bigger, key=lambda c: c.micro_batch)
    if not chosen.fits:
        verdict = budget_verdict(next_bigger.check)
        why = f"{micro_batch}: the least memory; micro {next_bigger.micro_batch} {verdict}"
    elif not next_bigger.fits:
        verdict = budget_verdict(next_bigger.check)
        why = f"{micro_batch}: the largest that fits; micro {next_bigger.micro_batch} {verdict}"
    elif next_bigger.tight and not chosen.tight:
        verdict = tight_words(next_bigger)
        why = f"{micro_batch}: the largest that fits with room; micro {next_bigger.micro_batch} "
        why += verdict
    else:
        why = f"{micro_batch}: " + speed_words(chosen, next_bigger, pool, inputs.answers.workload)
    return Decision("micro_batch", micro_batch, why)


def decide_attention(chosen: Candidate) -> Decision | None:
    """Eager attention, when the model has no sdpa kernel; None otherwise."""
    basis = chosen.estimate.activations_basis
    if not basis.startswith("traced_eager"):
        return None
    # memory/activations.py:activations_basis: the traced layer ran eager attention because
    # the model class has no kernel of the kind asked for
    why = (
        "eager: transformers has no sdpa kernel for this model, so every layer keeps its "
        "seq x seq attention scores (counted above)"
    )
    if basis == "traced_eager":
        why += (
            "; loading it with attn_implementation='flash_attention_2' keeps none "
            "(plan again with --attention flash_attention_2)"
        )
    return Decision("attention", "eager", why)


def pin_memory_reason(chosen: Candidate, inputs: PlanInputs) -> str:
    """Why the offload buffers are (not) page-locked, with the host RAM each way needs."""
    host = _host_need(chosen)
    if inputs.answers.pin_memory is not None:
        return f"{'on' if chosen.pin_memory else 'off'}: set by you; the buffers need {host}"
    if chosen.pin_memory:
        return (
            f"on: page-locked buffers copy to and from the GPU at full bandwidth, asynchronously; "
            f"they need {host}"
        )
    return (
        f"off: pinned, the offload buffers need {gib(chosen.pinned_cpu_gib or 0.0)} of host RAM "
        "per node (PyTorch's pinned allocator rounds every block up to a power of two), more "
        f"than the node has; unpinned they need {host}. Host-GPU copies then go through pageable "
        "memory, which is slower"
    )


def suggest(inputs: PlanInputs, least_bad: Candidate) -> list[str]:
    """What would fit, each found by re-running the memory model (never guessed)."""
    tips = [
        tip
        for tip in (
            suggest_without_overrides(inputs),
            suggest_more_gpus_in_the_node(inputs),
            suggest_more_nodes(inputs),
            suggest_shorter_sequences(inputs),
        )
        if tip
    ]
    tips += suggest_other_hardware(inputs, least_bad)
    if not tips:
        tips.append(
            f"nothing in reach fits: the least memory is {least_bad.label()} at "
            f"{gib(least_bad.need_gib)}/GPU; use a smaller model"
        )
    return tips


def suggest_without_overrides(inputs: PlanInputs) -> str | None:
    """The fastest fit once the user's stage, offload and checkpointing are dropped."""
    answers = inputs.answers
    overrides = (
        answers.stage,
        answers.offload_optimizer,
        answers.offload_param,
        answers.gradient_checkpointing,
    )
    if all(value is None for value in overrides):
        return None
    fit = fastest_fit(inputs)
    return f"drop your overrides: {fit.label()} needs {gib(fit.need_gib)}/GPU" if fit else None


def suggest_more_gpus_in_the_node(inputs: PlanInputs) -> str | None:
    """One node with a few GPUs: more GPUs in the same box come before more nodes."""
    answers = inputs.answers
    if answers.num_nodes > 1:
        return None
    for per_node in SUGGESTED_GPUS_PER_NODE:
        if per_node <= answers.gpus_per_node:
            continue
        share = max(1, inputs.per_rank * inputs.world_size // per_node)
        fit = fastest_fit(inputs.vary(world_size=per_node, gpus_per_node=per_node, per_rank=share))
        if fit:
            return (
                f"use {per_node} GPUs ({per_node} x {inputs.gpu.key} in one node): {fit.label()} "
                f"needs {gib(fit.need_gib)} per GPU"
            )
    return None


def suggest_more_nodes(inputs: PlanInputs) -> str | None:
    """The fewest nodes of the user's node size on which some option fits."""
    for nodes in SUGGESTED_NODES:
        world = inputs.answers.gpus_per_node * nodes
        if world <= inputs.world_size:
            continue
        share = max(1, inputs.per_rank * inputs.world_size // world)
        fit = fastest_fit(inputs.vary(world_size=world, per_rank=share))
        if fit:
            return (
                f"use {nodes} nodes ({world} x {inputs.gpu.key}): {fit.label()} needs "
                f"{gib(fit.need_gib)} per GPU"
            )
    return None


def suggest_shorter_sequences(inputs: PlanInputs) -> str | None:
    """The longest halved sequence length at which some option fits."""
    answers = inputs.answers
    seq_len = answers.seq_len // 2
    floor = answers.completion_len + 1 if answers.workload == "grpo" else 64
    while seq_len >= floor:
        fit = fastest_fit(inputs.vary(seq_len=seq_len))
        if fit:
            return (
                f"shorter sequences: seq_len {seq_len} fits with {fit.label()} "
                f"({gib(fit.need_gib)}/GPU)"
            )
        seq_len //= 2
    return None


def suggest_other_hardware(inputs: PlanInputs, least_bad: Candidate) -> list[str]:
    """A node with the host RAM the least-memory candidate needs, or a GPU with its memory."""
    headroom = inputs.answers.headroom
    if least_bad.estimate.cpu_gib > inputs.host_ram_gib:
        ram = host_ram_words(inputs.host_ram_gib, inputs.host_ram_source)
        return [
            f"a node with {gib(least_bad.estimate.cpu_gib)} of host RAM ({ram}) runs "
            f"{least_bad.label()}, or offload to nvme (--offload-optimizer nvme --nvme-path ...)"
        ]
    bigger = sorted(
        (g for g in CATALOG.values() if g.memory_gib * headroom >= least_bad.need_gib),
        key=lambda g: g.memory_gib,
    )
    if not bigger:
        return []
    return [
        f"a GPU with at least {gib(least_bad.need_gib / headroom)} of memory, "
        f"e.g. {bigger[0].key}, fits {least_bad.label()}"
    ]


# --- adapters instead of a full fine-tune -----------------------------------------------------
def adapters_hint(full_plan) -> str | None:
    """What LoRA and QLoRA (the answers' rank, targets and dropout) would give on the same GPUs
    when a full fine-tune does not fit or fits only with offload: each one's stage, micro batch,
    spare memory and step time, planned by the same search (memory/lora.py). None otherwise."""
    answers = full_plan.answers
    offloaded = "cpu" in (full_plan.offload_optimizer, full_plan.offload_param) or "nvme" in (
        full_plan.offload_optimizer,
        full_plan.offload_param,
    )
    if answers.finetuning != "full" or (full_plan.fits and not offloaded):
        return None
    from zerofit.planning.plan import plan

    words = []
    for finetuning in ("lora", "qlora"):
        name = "LoRA" if finetuning == "lora" else "QLoRA"
        try:
            adapter = plan(answers.replace(finetuning=finetuning))
        except ZerofitError as err:  # the stack refuses these answers' adapters on this model
            words.append(f"{name} cannot run as asked ({err})")
            continue
        words.append(f"{name} {_adapter_plan_words(adapter)}")
    why = "does not fit" if not full_plan.fits else "fits only with offload"
    return (
        f"note: the full fine-tune {why}; with --finetuning (rank {answers.lora_rank}, "
        f"{answers.lora_targets}): " + "; ".join(words)
    )


def _adapter_plan_words(adapter_plan) -> str:
    """'fits: ZeRO-2, micro 4, 6.1 GiB spare, 1.2 s/step' or 'does not fit either (...)'."""
    where = f"ZeRO-{adapter_plan.stage}"
    if adapter_plan.offload_optimizer != "none" or adapter_plan.offload_param != "none":
        where += f", offload {adapter_plan.offload_optimizer}/{adapter_plan.offload_param}"
    where += f", micro {adapter_plan.micro_batch}"
    if not adapter_plan.fits:
        return f"does not fit either ({where} needs {gib(adapter_plan.gpu_need_gib)}/GPU)"
    step = adapter_plan.speed.step_time_s
    speed = f", {step:.2f} s/step" if step else ""
    return f"fits: {where}, {gib(adapter_plan.spare_gib)} spare{speed}"
