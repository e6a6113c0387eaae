"""The planner: the fastest ZeRO configuration that fits, with a reason per decision.

Speed order (fastest first), from step times measured on one H100 with Qwen2.5-0.5B
(seq 2048 x 4): no offload before any offload (CPU Adam step ~1 s vs 0.2 s), then ZeRO-0/1/2
before ZeRO-3 (0.45 s vs 0.20 s: per-layer all-gathers, ~50 % more communication), then no
gradient checkpointing before checkpointing (0.29 s: one extra forward), then the lower stage
(stage 1 and 2 move the same bytes; the lower one does less bookkeeping), then the larger micro
batch (fewer, fuller kernels and fewer accumulation steps).

Stage 1 against 2 and one micro batch against the next are near ties in speed, so among them a
fit that leaves at least the median fragmentation of long runs spare comes first
(``Candidate.tight``, memory/overheads.py: public OOM messages of training runs lost a median
1.25 GiB to it): a plan with 0.3 GiB to spare is one varying batch away from an OOM at hour 20.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zerofit.planning.answers import Answers
from zerofit.errors import ZerofitError
from zerofit.memory.estimate import GIB, MemoryEstimate, TrainSetup, estimate_memory
from zerofit.memory.overheads import is_tight

MAX_MICRO = 64
# Where the node's RAM cannot be read (and --host-ram-gib is not given), offload plans assume a
# typical server: about twice the node's GPU memory, at least 64 GiB.
HOST_RAM_PER_GPU_MEMORY = 2.0
MIN_HOST_RAM_GIB = 64.0
DEFAULT_TOKENS_PER_STEP = 2**18  # default global batch: ~262k tokens per optimizer step


@dataclass(frozen=True)
class Candidate:
    stage: int
    offload_optimizer: str
    offload_param: str
    gradient_checkpointing: bool
    micro_batch: int
    estimate: MemoryEstimate
    fits: bool
    gpu_need_gib: float = 0.0  # everything the GPU holds (peak + outside terms + margin)
    gpu_fits: bool = True
    host_fits: bool = True
    pin_memory: bool = True  # offload buffers page-locked (only matters with offload)
    pinned_cpu_gib: float | None = None  # host RAM pinned buffers needed, where unpinned instead
    spare_gib: float = 0.0  # the GPU budget minus gpu_need_gib

    @property
    def tight(self) -> bool:
        """Fits, with less to spare than long runs lose to fragmentation (overheads.py)."""
        return self.fits and is_tight(self.spare_gib)

    @property
    def failing_budget(self) -> str | None:
        """ "gpu", "host" (RAM), "gpu+host", or None when it fits."""
        if self.fits:
            return None
        budgets = (("gpu", self.gpu_fits), ("host", self.host_fits))
        return "+".join(name for name, ok in budgets if not ok)

    @property
    def speed_key(self) -> tuple:
        """Sort key, fastest first (see the module docstring for the order and its evidence)."""
        return (
            self.offload_param != "none",
            self.offload_optimizer != "none",
            self.stage == 3,
            self.gradient_checkpointing,
            self.tight,
            self.stage,
            -self.micro_batch,
        )

    @property
    def need_gib(self) -> float:
        """What the budget is compared with: the allocated peak, the allocator, NCCL, CUDA context
        and vLLM terms, and the safety margin."""
        return self.gpu_need_gib

    def label(self) -> str:
        off = "" if self.offload_optimizer == "none" else f", optimizer on {self.offload_optimizer}"
        off += "" if self.offload_param == "none" else f", params on {self.offload_param}"
        if off and not self.pin_memory:
            off += " (unpinned)"
        gc = ", checkpointing" if self.gradient_checkpointing else ""
        return f"ZeRO-{self.stage}{off}{gc}, micro {self.micro_batch}"


def pick_precision(answers: Answers, gpu) -> tuple[str, str]:
    """bf16 where the GPU has it, else fp16, unless the user chose."""
    if answers.precision == "bf16" and not gpu.bf16:
        raise ZerofitError(
            "precision",
            f"bf16 is not supported by {gpu.name}",
            "use --precision fp16 (loss scaling) or fp32, " "or a GPU with bf16 (A100 or newer)",
        )
    if answers.precision:
        return answers.precision, f"{answers.precision}: set by you"
    if gpu.bf16:
        return "bf16", f"bf16: {gpu.name} supports it (no loss scaling needed)"
    return "fp16", f"fp16: {gpu.name} has no bf16, so mixed precision uses fp16 with loss scaling"


def pick_global_batch(answers: Answers) -> tuple[int, str]:
    """The user's global batch, or ~262k tokens per step rounded to what the batch must divide by."""
    world = answers.world_size
    unit = (
        world
        if answers.workload != "grpo"
        else world * answers.num_generations // math.gcd(world, answers.num_generations)
    )
    if answers.global_batch is not None:
        if answers.global_batch % world:
            raise ZerofitError(
                "global_batch",
                f"{answers.global_batch} is not divisible by the {world} GPUs",
                f"use a multiple of {world}, e.g. {max(world, answers.global_batch // world * world)}",
            )
        if answers.global_batch % unit:
            raise ZerofitError(
                "global_batch",
                f"{answers.global_batch} cannot be split into whole prompt groups "
                f"of {answers.num_generations} over {world} GPUs",
                f"use a multiple of {unit}",
            )
        return answers.global_batch, f"{answers.global_batch}: set by you"
    target = max(1, DEFAULT_TOKENS_PER_STEP // answers.seq_len)
    batch = max(unit, math.ceil(target / unit) * unit)
    return batch, (
        f"{batch}: not given, so ~{DEFAULT_TOKENS_PER_STEP // 1024}k tokens per step at "
        f"seq_len {answers.seq_len}, rounded to a multiple of {unit}"
    )


def pads_batches(answers: Answers, micro: int) -> bool:
    """Whether a forward's sequences are padded to a common length, i.e. carry an attention mask
    with zeros (what it costs: memory/activations.py ``padded_attention_bytes``).

    The user's ``padding`` when given. Otherwise what the collators do at the pinned versions:
    - sft: the HF Trainer's and TRL's collators pad each micro batch to its longest sequence
      (trl/trainer/sft_trainer.py ``DataCollatorForLanguageModeling.torch_call``, unless
      ``padding_free``); one sequence per forward has nothing to pad, and transformers skips an
      all-ones mask;
    - dpo: chosen and rejected are padded into one batch
      (trl/trainer/dpo_trainer.py ``DataCollatorForPreference.torch_call``), two or more rows;
    - grpo: prompts are left-padded and completions end in padding after their EOS
      (trl/trainer/grpo_trainer.py: ``attention_mask = torch.cat([prompt_mask,
      completion_mask], dim=1)``), whatever the micro batch.
    """
    if answers.padding is not None:
        return answers.padding
    return answers.workload in ("dpo", "grpo") or micro > 1


def make_setup(
    answers: Answers,
    precision: str,
    stage: int,
    offload_optimizer: str,
    offload_param: str,
    checkpointing: bool,
    micro: int,
    accum: int,
    world: int | None = None,
    seq_len: int | None = None,
) -> TrainSetup:
    """The memory model's view of one candidate configuration (offload buffers pinned, DeepSpeed's
    default, unless the user said otherwise)."""
    from zerofit.hardware import lookup

    optimizer = answers.optimizer
    if optimizer is None and answers.optimizer_block and offload_optimizer == "none":
        # zerofit's own block sets "torch_adam": true without offload
        # (configs/deepspeed_json.py build_optimizer_block), so DeepSpeed steps torch.optim.AdamW,
        # foreach on CUDA (deepspeed/runtime/engine.py _configure_basic_optimizer), not FusedAdam.
        optimizer = "adamw_torch"
    return TrainSetup(
        stage=stage,
        world_size=world or answers.world_size,
        gpus_per_node=answers.gpus_per_node,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        precision=precision,
        gradient_checkpointing=checkpointing,
        micro_batch=micro,
        seq_len=seq_len or answers.seq_len,
        grad_accum=accum,
        attention=answers.attention,
        workload=answers.workload,
        num_generations=answers.num_generations,
        completion_len=answers.completion_len,
        reference_model=answers.reference_model,
        stack=answers.stack,
        optimizer=optimizer,
        loss_kernel=answers.loss_kernel,
        ds_optimizer_block=answers.optimizer_block,
        precompute_ref=answers.precompute_ref,
        vllm_gpu_memory_utilization=answers.vllm_gpu_memory_utilization,
        steps_per_generation=answers.steps_per_generation,
        interconnect=lookup(answers.gpu).interconnect,
        padded=pads_batches(answers, micro),
        weights_dtype=answers.weights_dtype,
        pin_optimizer_offload=answers.pin_memory is not False,
        pin_param_offload=answers.pin_memory is not False,
    )


def option_grid(
    answers: Answers, honour_overrides: bool = True
) -> list[tuple[int, str, str, bool]]:
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
                oo = op  # DeepSpeed offloads the optimizer too when parameters are offloaded
            offloads = (
                [(oo, op)] if (stage >= 1 or oo == "none") and (stage == 3 or op == "none") else []
            )
        for oo, op in offloads:
            for gc in (False, True):
                if a.stage is not None and stage != a.stage:
                    continue
                if a.gradient_checkpointing is not None and gc != a.gradient_checkpointing:
                    continue
                grid.append((stage, oo, op, gc))
    if not grid:
        raise ZerofitError(
            "offload_param",
            f"offloading parameters needs ZeRO stage 3, not {answers.stage}",
            "use --stage 3 or --offload-param none",
        )
    return grid


def micro_choices(answers: Answers, per_rank: int) -> list[int]:
    """Micro batches to try: the user's, else every divisor of the per-GPU batch up to 64."""
    if answers.micro_batch is not None:
        if per_rank % answers.micro_batch:
            raise ZerofitError(
                "micro_batch",
                f"{answers.micro_batch} does not divide the {per_rank} sequences "
                "each GPU gets per step",
                "pick a divisor of global_batch / GPUs",
            )
        return [answers.micro_batch]
    return [m for m in range(1, min(per_rank, MAX_MICRO) + 1) if per_rank % m == 0]


def assumed_host_ram_gib(gpu, gpus_per_node: int) -> float:
    """Host RAM per node assumed where it can be neither read nor was given."""
    return max(MIN_HOST_RAM_GIB, HOST_RAM_PER_GPU_MEMORY * gpu.memory_gib * gpus_per_node)


def host_ram_gib(answers: Answers, gpu) -> tuple[float, str]:
    """Host RAM per node and where the number comes from: --host-ram-gib, else this node's
    /proc/meminfo, else the assumption above."""
    if answers.host_ram_gib is not None:
        return answers.host_ram_gib, "given"
    from zerofit.hardware import detect_host_ram_gib

    detected = detect_host_ram_gib()
    if detected is not None:
        return detected, "this node"
    return assumed_host_ram_gib(gpu, answers.gpus_per_node), "assumed"


def judge(est: MemoryEstimate, answers: Answers, gpu) -> tuple[bool, bool, float]:
    """The one verdict used by plan, estimate and the wizard: (GPU fits, host RAM fits, GiB the
    GPU must hold including the safety margin)."""
    need = est.gpu_need_bytes(gpu.memory_gib) / GIB + answers.safety_margin_gib
    gpu_ok = est.fits(gpu.memory_gib, answers.headroom, answers.safety_margin_gib)
    return gpu_ok, est.cpu_gib <= host_ram_gib(answers, gpu)[0], need


def evaluate(
    model,
    answers: Answers,
    gpu,
    precision: str,
    option: tuple,
    micros: list[int],
    per_rank: int,
    world: int | None = None,
    seq_len: int | None = None,
) -> list[Candidate]:
    """Memory estimate for ``option`` at every micro batch.

    Offload buffers are pinned (page-locked: DeepSpeed's default, full-bandwidth asynchronous
    copies) unless the user chose. When the pinned buffers are what breaks the host RAM budget
    and unpinned ones fit, the candidate is the unpinned one: PyTorch's pinned allocator rounds
    every block up to a power of two (memory/pinned.py), pageable memory is allocated as asked.
    """
    stage, oo, op, gc = option
    offloaded = oo != "none" or op != "none"
    out = []
    for m in micros:
        setup = make_setup(answers, precision, stage, oo, op, gc, m, per_rank // m, world, seq_len)
        est = estimate_memory(model, setup)
        gpu_ok, host_ok, need = judge(est, answers, gpu)
        pinned, pinned_cpu_gib = setup.pins_offload or not offloaded, None
        if setup.pins_offload and not host_ok and answers.pin_memory is None:
            unpinned = estimate_memory(model, setup.with_pinning(False))
            gpu_ok_u, host_ok_u, need_u = judge(unpinned, answers, gpu)
            if host_ok_u:
                pinned_cpu_gib = est.cpu_gib
                est, gpu_ok, host_ok, need, pinned = unpinned, gpu_ok_u, host_ok_u, need_u, False
        fits = gpu_ok and host_ok
        out.append(
            Candidate(
                stage,
                oo,
                op,
                gc,
                m,
                est,
                fits,
                need,
                gpu_ok,
                host_ok,
                pinned,
                pinned_cpu_gib,
                spare_gib=gpu.memory_gib * answers.headroom - need,
            )
        )
    return out


def best_of(candidates: list[Candidate]) -> Candidate:
    """Fastest fitting candidate, else the one needing the least memory."""
    fitting = [c for c in candidates if c.fits]
    if fitting:
        return min(fitting, key=lambda c: c.speed_key)
    return min(candidates, key=lambda c: (c.estimate.peak_bytes, c.speed_key))
