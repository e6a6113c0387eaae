"""Reasons for each planner decision and, when nothing fits, computed suggestions of what would."""

from __future__ import annotations

from zerofit.hardware import CATALOG
from zerofit.memory.overheads import FRAGMENTATION_AT_OOM_MEDIAN_GIB
import dataclasses

from zerofit.planning.planner import Candidate, best_of, evaluate, host_ram_gib, option_grid
from zerofit.planning.decision import Decision


def _gib(x: float) -> str:
    return f"{x:.1f} GiB"


def host_words(answers, gpu) -> str:
    """Where the host RAM number comes from: 'this node has 62.4 GiB', 'you gave 512.0 GiB' or
    'assumed 64.0 GiB, set --host-ram-gib'."""
    ram, source = host_ram_gib(answers, gpu)
    return {"given": f"you gave {_gib(ram)}", "this node": f"this node has {_gib(ram)}"}.get(
        source, f"assumed {_gib(ram)}, set --host-ram-gib"
    )


def verdict_words(c: Candidate, answers, gpu, budget: float) -> str:
    """Why ``c`` fits or which budget it breaks, with both sides of each comparison."""
    gpu_part = f"{_gib(c.need_gib)} per GPU of {_gib(budget)}"
    host_part = f"{_gib(c.estimate.cpu_gib)} of host RAM per node ({host_words(answers, gpu)})"
    if c.fits:
        return f"fits: {gpu_part}" + (f", {host_part}" if c.estimate.cpu_bytes else "")
    if c.gpu_fits:
        return f"fits on the GPU ({gpu_part}) but needs {host_part}"
    if c.host_fits:
        return f"does not fit on the GPU: needs {gpu_part}"
    return f"does not fit: needs {gpu_part} and {host_part}"


def tight_words(c: Candidate) -> str:
    """Why a candidate that fits was passed over: it leaves less than long runs lose."""
    return (
        f"fits with only {_gib(c.spare_gib)} to spare, under the "
        f"{FRAGMENTATION_AT_OOM_MEDIAN_GIB} GiB that public OOM messages show long runs lose to "
        "fragmentation"
    )


def decide(
    chosen: Candidate, pool: list[Candidate], answers, gpu, budget: float, model_desc: str
) -> list[Decision]:
    """One Decision per knob, each naming the numbers that made it."""
    # need = allocated peak + allocator, NCCL, CUDA context (+ vLLM) + safety margin: what the
    # GPU has to hold, the number compared with the budget (the tables also show the peak).
    need = (
        f"needs {_gib(chosen.need_gib)} per GPU (peak, allocator, NCCL, CUDA context and "
        f"margin) of {_gib(budget)}"
    )
    out = []
    if not chosen.fits:
        out.append(
            Decision(
                "fits",
                False,
                f"nothing fits; the closest is {chosen.label()}, which "
                f"{verdict_words(chosen, answers, gpu, budget)}; see the suggestions",
            )
        )

    def rival(**same) -> Candidate | None:
        group = [c for c in pool if all(getattr(c, k) == v for k, v in same.items())]
        return best_of(group) if group else None

    if answers.stage is not None:
        out.append(
            Decision(
                "stage", chosen.stage, f"stage {chosen.stage}: set by you; {model_desc} {need}"
            )
        )
    else:
        # Compare like with like: the lower stage with the same checkpointing choice.
        lower = [
            rival(
                stage=s,
                offload_optimizer="none",
                offload_param="none",
                gradient_checkpointing=chosen.gradient_checkpointing,
            )
            for s in range(chosen.stage)
        ]
        lower = [c for c in lower if c is not None]
        if chosen.stage == 0:
            weights = answers.weights_dtype or "fp32"
            why = (
                f"stage 0 (plain data parallel, no DeepSpeed): {model_desc} {need} without "
                f"partitioning anything, with {weights} weights (grads and Adam states in {weights})"
            )
        elif lower:
            nxt = max(lower, key=lambda c: c.stage)
            if nxt.tight and not chosen.tight:
                verdict = tight_words(nxt)
            elif nxt.fits:
                verdict = "fits but is slower"
            else:
                verdict = verdict_words(nxt, answers, gpu, budget)
            why = f"stage {chosen.stage}: {model_desc} {need}; stage {nxt.stage} {verdict}"
        else:
            why = f"stage {chosen.stage}: {model_desc} {need}"
        if chosen.stage in (1, 2) and answers.world_size == 1:
            why += "; on one GPU stages 1 and 2 partition nothing, the lowest that fits is simplest"
        out.append(Decision("stage", chosen.stage, why))

    offloaded = chosen.offload_optimizer != "none" or chosen.offload_param != "none"
    if answers.offload_optimizer is not None or answers.offload_param is not None:
        why = (
            f"optimizer on {chosen.offload_optimizer}, params on {chosen.offload_param}: set by you"
        )
    elif not offloaded:
        why = "none: everything fits on the GPU, and offloading would slow each step several times"
    else:
        gpu_only = rival(offload_optimizer="none", offload_param="none")
        why = (
            f"optimizer on {chosen.offload_optimizer}"
            + (f", params on {chosen.offload_param}" if chosen.offload_param != "none" else "")
            + (
                f": without offload the best {verdict_words(gpu_only, answers, gpu, budget)}"
                if gpu_only
                else ""
            )
            + f"; needs {_gib(chosen.estimate.cpu_gib)} of host RAM per node "
            + f"({host_words(answers, gpu)})"
        )
    out.append(Decision("offload", f"{chosen.offload_optimizer}/{chosen.offload_param}", why))
    if offloaded:
        out.append(
            Decision("pin_memory", chosen.pin_memory, pin_memory_reason(chosen, answers, gpu))
        )

    if answers.gradient_checkpointing is not None:
        why = f"{'on' if chosen.gradient_checkpointing else 'off'}: set by you"
    elif not chosen.gradient_checkpointing:
        why = "off: activations fit, so no forward is recomputed"
    else:
        off = rival(
            stage=chosen.stage,
            offload_optimizer=chosen.offload_optimizer,
            offload_param=chosen.offload_param,
            gradient_checkpointing=False,
        )
        why = "on: " + (
            f"without it the best {verdict_words(off, answers, gpu, budget)}"
            if off
            else "needed to fit"
        )
    out.append(Decision("gradient_checkpointing", chosen.gradient_checkpointing, why))

    if answers.micro_batch is not None:
        why = f"{chosen.micro_batch}: set by you"
    else:
        bigger = [
            c
            for c in pool
            if c.micro_batch > chosen.micro_batch
            and (c.stage, c.offload_optimizer, c.offload_param, c.gradient_checkpointing)
            == (
                chosen.stage,
                chosen.offload_optimizer,
                chosen.offload_param,
                chosen.gradient_checkpointing,
            )
        ]
        if bigger:
            nxt = min(bigger, key=lambda c: c.micro_batch)
            lead = "the largest that fits" if chosen.fits else "the least memory"
            if nxt.tight and not chosen.tight:
                lead, verdict = "the largest that fits with room", tight_words(nxt)
            else:
                verdict = verdict_words(nxt, answers, gpu, budget)
            why = f"{chosen.micro_batch}: {lead}; micro {nxt.micro_batch} {verdict}"
        else:
            why = f"{chosen.micro_batch}: the largest that divides each GPU's share of the global batch"
    out.append(Decision("micro_batch", chosen.micro_batch, why))

    basis = chosen.estimate.activations_basis
    if basis.startswith("traced_eager"):
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
        out.append(Decision("attention", "eager", why))
    return out


def pin_memory_reason(chosen: Candidate, answers, gpu) -> str:
    """Why the offload buffers are (not) page-locked, with the host RAM each way needs."""
    host = f"{_gib(chosen.estimate.cpu_gib)} of host RAM per node ({host_words(answers, gpu)})"
    if answers.pin_memory is not None:
        return f"{'on' if chosen.pin_memory else 'off'}: set by you; the buffers need {host}"
    if chosen.pin_memory:
        return (
            f"on: page-locked buffers copy to and from the GPU at full bandwidth, asynchronously; "
            f"they need {host}"
        )
    return (
        f"off: pinned, the offload buffers need {_gib(chosen.pinned_cpu_gib or 0.0)} of host RAM "
        "per node (PyTorch's pinned allocator rounds every block up to a power of two), more "
        f"than the node has; unpinned they need {host}. Host-GPU copies then go through pageable "
        "memory, which is slower"
    )


def suggest(
    model, answers, gpu, precision: str, per_rank: int, budget: float, least_bad: Candidate
) -> list[str]:
    """What would fit, each found by re-running the memory model (never guessed)."""
    tips: list[str] = []
    full_grid = option_grid(answers, honour_overrides=False)
    if any(
        v is not None
        for v in (
            answers.stage,
            answers.offload_optimizer,
            answers.offload_param,
            answers.gradient_checkpointing,
        )
    ):
        free = [
            c
            for o in full_grid
            for c in evaluate(model, answers, gpu, precision, o, [1], per_rank)
            if c.fits
        ]
        if free:
            c = min(free, key=lambda c: c.speed_key)
            tips.append(f"drop your overrides: {c.label()} needs {_gib(c.need_gib)}/GPU")
    # one node with a few GPUs: more GPUs in the same box come before more nodes
    for per_node in (2, 4, 8):
        if per_node <= answers.gpus_per_node or answers.num_nodes > 1:
            continue
        more = dataclasses.replace(answers, gpus_per_node=per_node)
        world = per_node
        share = max(1, per_rank * answers.world_size // world)
        fit = [
            c
            for o in full_grid
            for c in evaluate(model, more, gpu, precision, o, [1], share, world=world)
            if c.fits
        ]
        if fit:
            c = min(fit, key=lambda c: c.speed_key)
            tips.append(
                f"use {per_node} GPUs ({per_node} x {gpu.key} in one node): {c.label()} "
                f"needs {_gib(c.need_gib)} per GPU"
            )
            break
    for nodes in (2, 4, 8, 16, 32, 64, 128):
        world = answers.gpus_per_node * nodes
        if world <= answers.world_size:
            continue
        share = max(1, per_rank * answers.world_size // world)
        fit = [
            c
            for o in full_grid
            for c in evaluate(model, answers, gpu, precision, o, [1], share, world=world)
            if c.fits
        ]
        if fit:
            c = min(fit, key=lambda c: c.speed_key)
            tips.append(
                f"use {nodes} nodes ({world} x {gpu.key}): {c.label()} needs "
                f"{_gib(c.need_gib)} per GPU"
            )
            break
    seq = answers.seq_len // 2
    floor = answers.completion_len + 1 if answers.workload == "grpo" else 64
    while seq >= floor:
        fit = [
            c
            for o in full_grid
            for c in evaluate(model, answers, gpu, precision, o, [1], per_rank, seq_len=seq)
            if c.fits
        ]
        if fit:
            c = min(fit, key=lambda c: c.speed_key)
            tips.append(
                f"shorter sequences: seq_len {seq} fits with {c.label()} ({_gib(c.need_gib)}/GPU)"
            )
            break
        seq //= 2
    bigger = sorted(
        (g for g in CATALOG.values() if g.memory_gib * answers.headroom >= least_bad.need_gib),
        key=lambda g: g.memory_gib,
    )
    host = host_ram_gib(answers, gpu)[0]
    if least_bad.estimate.cpu_gib > host:
        tips.append(
            f"a node with {_gib(least_bad.estimate.cpu_gib)} of host RAM "
            f"({host_words(answers, gpu)}) "
            f"runs {least_bad.label()}, or offload to nvme (--offload-optimizer nvme --nvme-path ...)"
        )
    if bigger and least_bad.estimate.cpu_gib <= host:
        tips.append(
            f"a GPU with at least {_gib(least_bad.need_gib / answers.headroom)} of memory, "
            f"e.g. {bigger[0].key}, "
            f"fits {least_bad.label()}"
        )
    if not tips:
        tips.append(
            f"nothing in reach fits: the least memory is {least_bad.label()} at "
            f"{_gib(least_bad.need_gib)}/GPU; use a smaller model"
        )
    return tips
