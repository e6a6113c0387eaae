"""Reasons for each planner decision and, when nothing fits, computed suggestions of what would."""
from __future__ import annotations

from zerofit.hardware import CATALOG
from zerofit.planning.planner import Candidate, assumed_host_ram_gib, best_of, evaluate, option_grid
from zerofit.planning.decision import Decision


def _gib(x: float) -> str:
    return f"{x:.1f} GiB"


def decide(chosen: Candidate, pool: list[Candidate], answers, gpu, budget: float, model_desc: str) -> list[Decision]:
    """One Decision per knob, each naming the numbers that made it."""
    # need = predicted peak + CUDA context, the number compared with the budget (the tables show the peak).
    need = f"needs {_gib(chosen.need_gib)}/GPU with the CUDA context, of the {_gib(budget)} budget"
    out = []
    if not chosen.fits:
        out.append(Decision("fits", False, f"nothing fits: the least memory is {chosen.label()} at "
                            f"{_gib(chosen.need_gib)}/GPU and {_gib(chosen.estimate.cpu_gib)} CPU RAM per node; "
                            "see the suggestions"))

    def rival(**same) -> Candidate | None:
        group = [c for c in pool if all(getattr(c, k) == v for k, v in same.items())]
        return best_of(group) if group else None

    if answers.stage is not None:
        out.append(Decision("stage", chosen.stage, f"stage {chosen.stage}: set by you; {model_desc} {need}"))
    else:
        # Compare like with like: the lower stage with the same checkpointing choice.
        lower = [rival(stage=s, offload_optimizer="none", offload_param="none",
                       gradient_checkpointing=chosen.gradient_checkpointing) for s in range(chosen.stage)]
        lower = [c for c in lower if c is not None]
        if chosen.stage == 0:
            why = f"stage 0 (plain data parallel): {model_desc} {need} without partitioning anything"
        elif lower:
            nxt = max(lower, key=lambda c: c.stage)
            verdict = "does not fit" if not nxt.fits else "fits but is slower"
            why = (f"stage {chosen.stage}: {model_desc} {need}; stage {nxt.stage} would need "
                   f"{_gib(nxt.need_gib)} ({verdict})")
        else:
            why = f"stage {chosen.stage}: {model_desc} {need}"
        if chosen.stage in (1, 2) and answers.world_size == 1:
            why += "; on one GPU stages 1 and 2 partition nothing, the lowest that fits is simplest"
        out.append(Decision("stage", chosen.stage, why))

    offloaded = chosen.offload_optimizer != "none" or chosen.offload_param != "none"
    if answers.offload_optimizer is not None or answers.offload_param is not None:
        why = f"optimizer on {chosen.offload_optimizer}, params on {chosen.offload_param}: set by you"
    elif not offloaded:
        why = "none: everything fits on the GPU, and offloading would slow each step several times"
    else:
        gpu_only = rival(offload_optimizer="none", offload_param="none")
        why = (f"optimizer on {chosen.offload_optimizer}"
               + (f", params on {chosen.offload_param}" if chosen.offload_param != "none" else "")
               + (f": without offload the best needs {_gib(gpu_only.need_gib)}" if gpu_only else "")
               + f"; needs {_gib(chosen.estimate.cpu_gib)} of CPU RAM per node (assumed available: "
               + f"{_gib(assumed_host_ram_gib(gpu, answers.gpus_per_node))})")
    out.append(Decision("offload", f"{chosen.offload_optimizer}/{chosen.offload_param}", why))

    if answers.gradient_checkpointing is not None:
        why = f"{'on' if chosen.gradient_checkpointing else 'off'}: set by you"
    elif not chosen.gradient_checkpointing:
        why = "off: activations fit, so no forward is recomputed"
    else:
        off = rival(stage=chosen.stage, offload_optimizer=chosen.offload_optimizer,
                    offload_param=chosen.offload_param, gradient_checkpointing=False)
        why = "on: " + (f"without it the best needs {_gib(off.need_gib)} > {_gib(budget)}" if off
                        else "needed to fit")
    out.append(Decision("gradient_checkpointing", chosen.gradient_checkpointing, why))

    if answers.micro_batch is not None:
        why = f"{chosen.micro_batch}: set by you"
    else:
        bigger = [c for c in pool if c.micro_batch > chosen.micro_batch and
                  (c.stage, c.offload_optimizer, c.offload_param, c.gradient_checkpointing) ==
                  (chosen.stage, chosen.offload_optimizer, chosen.offload_param, chosen.gradient_checkpointing)]
        if bigger:
            nxt = min(bigger, key=lambda c: c.micro_batch)
            why = f"{chosen.micro_batch}: micro {nxt.micro_batch} would need {_gib(nxt.need_gib)}"
        else:
            why = f"{chosen.micro_batch}: the largest that divides each GPU's share of the global batch"
    out.append(Decision("micro_batch", chosen.micro_batch, why))
    return out


def suggest(model, answers, gpu, precision: str, per_rank: int, budget: float, least_bad: Candidate) -> list[str]:
    """What would fit, each found by re-running the memory model (never guessed)."""
    tips: list[str] = []
    full_grid = option_grid(answers, honour_overrides=False)
    if any(v is not None for v in (answers.stage, answers.offload_optimizer, answers.offload_param,
                                   answers.gradient_checkpointing)):
        free = [c for o in full_grid for c in evaluate(model, answers, gpu, precision, o, [1], per_rank) if c.fits]
        if free:
            c = min(free, key=lambda c: c.speed_key)
            tips.append(f"drop your overrides: {c.label()} needs {_gib(c.need_gib)}/GPU")
    for nodes in (2, 4, 8, 16, 32, 64, 128):
        world = answers.gpus_per_node * nodes
        if world <= answers.world_size:
            continue
        share = max(1, per_rank * answers.world_size // world)
        fit = [c for o in full_grid for c in evaluate(model, answers, gpu, precision, o, [1], share, world=world)
               if c.fits]
        if fit:
            c = min(fit, key=lambda c: c.speed_key)
            tips.append(f"use {nodes} nodes ({world} x {gpu.key}): {c.label()} needs {_gib(c.need_gib)}/GPU")
            break
    seq = answers.seq_len // 2
    floor = answers.completion_len + 1 if answers.workload == "grpo" else 64
    while seq >= floor:
        fit = [c for o in full_grid for c in evaluate(model, answers, gpu, precision, o, [1], per_rank, seq_len=seq)
               if c.fits]
        if fit:
            c = min(fit, key=lambda c: c.speed_key)
            tips.append(f"shorter sequences: seq_len {seq} fits with {c.label()} ({_gib(c.need_gib)}/GPU)")
            break
        seq //= 2
    bigger = sorted((g for g in CATALOG.values() if g.memory_gib * answers.headroom >= least_bad.need_gib),
                    key=lambda g: g.memory_gib)
    host = assumed_host_ram_gib(gpu, answers.gpus_per_node)
    if least_bad.estimate.cpu_gib > host:
        tips.append(f"a node with {_gib(least_bad.estimate.cpu_gib)} of CPU RAM (assumed {_gib(host)}) "
                    f"runs {least_bad.label()}, or offload to nvme (--offload-optimizer nvme --nvme-path ...)")
    if bigger and least_bad.estimate.cpu_gib <= host:
        tips.append(f"a GPU with at least {_gib(least_bad.need_gib / answers.headroom)}, e.g. {bigger[0].key}, "
                    f"fits {least_bad.label()}")
    if not tips:
        tips.append(f"nothing in reach fits: the least memory is {least_bad.label()} at "
                    f"{_gib(least_bad.need_gib)}/GPU; use a smaller model")
    return tips
