"""The planner: the fastest ZeRO configuration that fits, with a reason per decision.

Speed order (fastest first), from step times measured on one H100 with Qwen2.5-0.5B
(seq 2048 x 4): no offload before any offload (CPU Adam step ~1 s vs 0.2 s), then ZeRO-0/1/2
before ZeRO-3 (0.45 s vs 0.20 s: per-layer all-gathers, ~50 % more communication), then no
gradient checkpointing before checkpointing (0.29 s: one extra forward), then the lower stage
(stage 1 and 2 move the same bytes; the lower one does less bookkeeping), then the larger micro
batch (fewer, fuller kernels and fewer accumulation steps).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from zerofit.planning.answers import Answers
from zerofit.errors import ZerofitError
from zerofit.memory.estimate import GIB, MemoryEstimate, TrainSetup, estimate_memory

MAX_MICRO = 64
# Host RAM is not asked for, so offload plans assume a typical server: about twice the node's
# GPU memory (cloud 8-GPU nodes ship 2-4x; small single-GPU boxes less), at least 64 GiB.
HOST_RAM_PER_GPU_MEMORY = 2.0
MIN_HOST_RAM_GIB = 64.0
DEFAULT_TOKENS_PER_STEP = 2 ** 18   # default global batch: ~262k tokens per optimizer step


@dataclass(frozen=True)
class Candidate:
    stage: int
    offload_optimizer: str
    offload_param: str
    gradient_checkpointing: bool
    micro_batch: int
    estimate: MemoryEstimate
    fits: bool

    @property
    def speed_key(self) -> tuple:
        """Sort key, fastest first (see the module docstring for the order and its evidence)."""
        return (self.offload_param != "none", self.offload_optimizer != "none", self.stage == 3,
                self.gradient_checkpointing, self.stage, -self.micro_batch)

    @property
    def need_gib(self) -> float:
        """What the budget is compared with: the peak plus the CUDA context."""
        return (self.estimate.peak_bytes + self.estimate.context_bytes) / GIB

    def label(self) -> str:
        off = "" if self.offload_optimizer == "none" else f", optimizer on {self.offload_optimizer}"
        off += "" if self.offload_param == "none" else f", params on {self.offload_param}"
        gc = ", checkpointing" if self.gradient_checkpointing else ""
        return f"ZeRO-{self.stage}{off}{gc}, micro {self.micro_batch}"


def pick_precision(answers: Answers, gpu) -> tuple[str, str]:
    """bf16 where the GPU has it, else fp16, unless the user chose."""
    if answers.precision:
        return answers.precision, f"{answers.precision}: set by you"
    if gpu.bf16:
        return "bf16", f"bf16: {gpu.name} supports it (no loss scaling needed)"
    return "fp16", f"fp16: {gpu.name} has no bf16, so mixed precision uses fp16 with loss scaling"


def pick_global_batch(answers: Answers) -> tuple[int, str]:
    """The user's global batch, or ~262k tokens per step rounded to what the batch must divide by."""
    world = answers.world_size
    unit = world if answers.workload != "grpo" else world * answers.num_generations // math.gcd(world, answers.num_generations)
    if answers.global_batch is not None:
        if answers.global_batch % world:
            raise ZerofitError("global_batch", f"{answers.global_batch} is not divisible by the {world} GPUs",
                               f"use a multiple of {world}, e.g. {max(world, answers.global_batch // world * world)}")
        if answers.global_batch % unit:
            raise ZerofitError("global_batch", f"{answers.global_batch} cannot be split into whole prompt groups "
                               f"of {answers.num_generations} over {world} GPUs", f"use a multiple of {unit}")
        return answers.global_batch, f"{answers.global_batch}: set by you"
    target = max(1, DEFAULT_TOKENS_PER_STEP // answers.seq_len)
    batch = max(unit, math.ceil(target / unit) * unit)
    return batch, (f"{batch}: not given, so ~{DEFAULT_TOKENS_PER_STEP // 1024}k tokens per step at "
                   f"seq_len {answers.seq_len}, rounded to a multiple of {unit}")


def make_setup(answers: Answers, precision: str, stage: int, offload_optimizer: str, offload_param: str,
               checkpointing: bool, micro: int, accum: int, world: int | None = None,
               seq_len: int | None = None) -> TrainSetup:
    """The memory model's view of one candidate configuration."""
    return TrainSetup(stage=stage, world_size=world or answers.world_size, gpus_per_node=answers.gpus_per_node,
                      offload_optimizer=offload_optimizer, offload_param=offload_param, precision=precision,
                      gradient_checkpointing=checkpointing, micro_batch=micro, seq_len=seq_len or answers.seq_len,
                      grad_accum=accum, attention=answers.attention, workload=answers.workload,
                      num_generations=answers.num_generations, completion_len=answers.completion_len,
                      reference_model=answers.reference_model)


def option_grid(answers: Answers, honour_overrides: bool = True) -> list[tuple[int, str, str, bool]]:
    """Every (stage, offload_optimizer, offload_param, checkpointing) allowed; overrides narrow it."""
    a = answers if honour_overrides else Answers()
    grid = []
    for stage in (0, 1, 2, 3):
        offloads = [("none", "none")]
        if stage >= 1:
            offloads.append(("cpu", "none"))
        if stage == 3:
            offloads.append(("cpu", "cpu"))
        if honour_overrides and (answers.offload_optimizer or answers.offload_param):
            oo, op = answers.offload_optimizer or "none", answers.offload_param or "none"
            if op != "none" and oo == "none" and answers.offload_optimizer is None:
                oo = op   # DeepSpeed offloads the optimizer too when parameters are offloaded
            offloads = [(oo, op)] if (stage >= 1 or oo == "none") and (stage == 3 or op == "none") else []
        for oo, op in offloads:
            for gc in (False, True):
                if a.stage is not None and stage != a.stage:
                    continue
                if a.gradient_checkpointing is not None and gc != a.gradient_checkpointing:
                    continue
                grid.append((stage, oo, op, gc))
    if not grid:
        raise ZerofitError("offload_param", f"offloading parameters needs ZeRO stage 3, not {answers.stage}",
                           "use --stage 3 or --offload-param none")
    return grid


def micro_choices(answers: Answers, per_rank: int) -> list[int]:
    """Micro batches to try: the user's, else every divisor of the per-GPU batch up to 64."""
    if answers.micro_batch is not None:
        if per_rank % answers.micro_batch:
            raise ZerofitError("micro_batch", f"{answers.micro_batch} does not divide the {per_rank} sequences "
                               "each GPU gets per step", "pick a divisor of global_batch / GPUs")
        return [answers.micro_batch]
    return [m for m in range(1, min(per_rank, MAX_MICRO) + 1) if per_rank % m == 0]


def assumed_host_ram_gib(gpu, gpus_per_node: int) -> float:
    """Host RAM per node an offload plan may use (see HOST_RAM_PER_GPU_MEMORY)."""
    return max(MIN_HOST_RAM_GIB, HOST_RAM_PER_GPU_MEMORY * gpu.memory_gib * gpus_per_node)


def evaluate(model, answers: Answers, gpu, precision: str, option: tuple, micros: list[int], per_rank: int,
             world: int | None = None, seq_len: int | None = None) -> list[Candidate]:
    """Memory estimate for ``option`` at every micro batch."""
    stage, oo, op, gc = option
    out = []
    for m in micros:
        est = estimate_memory(model, make_setup(answers, precision, stage, oo, op, gc, m, per_rank // m, world, seq_len))
        host_ok = est.cpu_gib <= assumed_host_ram_gib(gpu, answers.gpus_per_node)
        out.append(Candidate(stage, oo, op, gc, m, est, est.fits(gpu.memory_gib, answers.headroom) and host_ok))
    return out


def best_of(candidates: list[Candidate]) -> Candidate:
    """Fastest fitting candidate, else the one needing the least memory."""
    fitting = [c for c in candidates if c.fits]
    if fitting:
        return min(fitting, key=lambda c: c.speed_key)
    return min(candidates, key=lambda c: (c.estimate.peak_bytes, c.speed_key))
