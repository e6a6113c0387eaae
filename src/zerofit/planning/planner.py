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

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from zerofit.errors import ZerofitError
from zerofit.hardware import GpuSpec
from zerofit.memory.estimate import GIB, MemoryEstimate, TrainSetup, estimate_memory
from zerofit.memory.overheads import is_tight
from zerofit.planning.answers import Answers
from zerofit.planning.options import TrainingOption, all_options

MAX_MICRO = 64
# Where the node's RAM cannot be read (and --host-ram-gib is not given), offload plans assume a
# typical server: about twice the node's GPU memory, at least 64 GiB.
HOST_RAM_PER_GPU_MEMORY = 2.0
MIN_HOST_RAM_GIB = 64.0
DEFAULT_TOKENS_PER_STEP = 2**18  # default global batch: ~262k tokens per optimizer step



@dataclass(frozen=True)
class PlanInputs:
    """What every candidate of one plan shares: the model, the answers, the GPU and the batch
    each GPU gets, with the world, node size and sequence length a suggestion may vary, and the
    host RAM per node the verdict compares with (read once, not once per candidate)."""

    model: Any  # zerofit.models.resolve.ModelSpec
    answers: Answers
    gpu: GpuSpec
    precision: str
    per_rank: int  # sequences each GPU gets per optimizer step
    world_size: int
    gpus_per_node: int
    seq_len: int
    host_ram_gib: float
    host_ram_source: str  # given | this node | assumed

    @property
    def budget_gib(self) -> float:
        """The GPU memory a configuration may use."""
        return self.gpu.memory_gib * self.answers.headroom

    def vary(
        self,
        *,
        world_size: int | None = None,
        gpus_per_node: int | None = None,
        per_rank: int | None = None,
        seq_len: int | None = None,
    ) -> "PlanInputs":
        """The same plan on another world, node size, per-GPU batch or sequence length (what a
        suggestion tries); an assumed host RAM follows the node's GPU count."""
        gpus_per_node = gpus_per_node or self.gpus_per_node
        ram, source = host_ram_gib(self.answers, self.gpu, gpus_per_node)
        return dataclasses.replace(
            self,
            world_size=world_size or self.world_size,
            gpus_per_node=gpus_per_node,
            per_rank=per_rank or self.per_rank,
            seq_len=seq_len or self.seq_len,
            host_ram_gib=ram,
            host_ram_source=source,
        )


def plan_inputs(model, answers: Answers, gpu: GpuSpec, precision: str, per_rank: int) -> PlanInputs:
    """``PlanInputs`` of the answers as given: their world, node size and sequence length."""
    ram, source = host_ram_gib(answers, gpu)
    return PlanInputs(
        model=model,
        answers=answers,
        gpu=gpu,
        precision=precision,
        per_rank=per_rank,
        world_size=answers.world_size,
        gpus_per_node=answers.gpus_per_node,
        seq_len=answers.seq_len,
        host_ram_gib=ram,
        host_ram_source=source,
    )


@dataclass(frozen=True)
class BudgetCheck:
    """The one verdict used by plan, estimate and the wizard: what the GPU must hold against its
    budget, and the host RAM offload needs against the node's."""

    gpu_fits: bool
    host_fits: bool
    gpu_need_gib: float  # the allocated peak, allocator, NCCL, CUDA context, vLLM, safety margin
    budget_gib: float  # GPU memory x headroom
    spare_gib: float  # the budget minus gpu_need_gib (negative: it does not fit)
    cpu_gib: float  # host RAM per node
    host_ram_gib: float
    host_ram_source: str  # given | this node | assumed

    @property
    def fits(self) -> bool:
        return self.gpu_fits and self.host_fits

    @property
    def failing_budget(self) -> str | None:
        """Which budget fails: "gpu", "host" (RAM), "gpu+host", or None when it fits."""
        if self.fits:
            return None
        budgets = (("gpu", self.gpu_fits), ("host", self.host_fits))
        return "+".join(name for name, ok in budgets if not ok)


def judge(estimate: MemoryEstimate, inputs: PlanInputs) -> BudgetCheck:
    """Compare ``estimate`` with the GPU budget (peak, every outside term and the safety margin)
    and the host RAM offload needs with the node's."""
    answers, capacity = inputs.answers, inputs.gpu.memory_gib
    need = estimate.gpu_need_bytes(capacity) / GIB + answers.safety_margin_gib
    return BudgetCheck(
        gpu_fits=estimate.fits(capacity, answers.headroom, answers.safety_margin_gib),
        host_fits=estimate.cpu_gib <= inputs.host_ram_gib,
        gpu_need_gib=need,
        budget_gib=inputs.budget_gib,
        spare_gib=inputs.budget_gib - need,
        cpu_gib=estimate.cpu_gib,
        host_ram_gib=inputs.host_ram_gib,
        host_ram_source=inputs.host_ram_source,
    )


@dataclass(frozen=True)
class Candidate:
    """One option at one micro batch, estimated and judged."""

    option: TrainingOption
    micro_batch: int
    estimate: MemoryEstimate
    check: BudgetCheck
    pin_memory: bool = True  # offload buffers page-locked (only matters with offload)
    pinned_cpu_gib: float | None = None  # host RAM pinned buffers needed, where unpinned instead

    @property
    def fits(self) -> bool:
        return self.check.fits

    @property
    def need_gib(self) -> float:
        """What the budget is compared with: the allocated peak, the allocator, NCCL, CUDA context
        and vLLM terms, and the safety margin."""
        return self.check.gpu_need_gib

    @property
    def spare_gib(self) -> float:
        return self.check.spare_gib

    @property
    def failing_budget(self) -> str | None:
        return self.check.failing_budget

    @property
    def tight(self) -> bool:
        """Fits, with less to spare than long runs lose to fragmentation (overheads.py)."""
        return self.fits and is_tight(self.spare_gib)

    @property
    def speed_key(self) -> tuple:
        """Sort key, fastest first (see the module docstring for the order and its evidence)."""
        option = self.option
        return (
            option.offload_param != "none",
            option.offload_optimizer != "none",
            option.stage == 3,
            option.gradient_checkpointing,
            self.tight,
            option.stage,
            -self.micro_batch,
        )

    def label(self) -> str:
        option = self.option
        where = ""
        if option.offload_optimizer != "none":
            where += f", optimizer on {option.offload_optimizer}"
        if option.offload_param != "none":
            where += f", params on {option.offload_param}"
        if where and not self.pin_memory:
            where += " (unpinned)"
        checkpointing = ", checkpointing" if option.gradient_checkpointing else ""
        return f"ZeRO-{option.stage}{where}{checkpointing}, micro {self.micro_batch}"


def pick_precision(answers: Answers, gpu) -> tuple[str, str]:
    """bf16 where the GPU has it, else fp16, unless the user chose (``Answers`` refuses bf16 on a
    GPU without it, planning/answers.py:check_hardware)."""
    if answers.precision:
        return answers.precision, f"{answers.precision}: set by you"
    if gpu.bf16:
        return "bf16", f"bf16: {gpu.name} supports it (no loss scaling needed)"
    return "fp16", f"fp16: {gpu.name} has no bf16, so mixed precision uses fp16 with loss scaling"


def pick_global_batch(answers: Answers) -> tuple[int, str]:
    """The user's global batch, or ~262k tokens per step rounded to what the batch must divide
    by."""
    world = answers.world_size
    unit = (
        world
        if answers.workload != "grpo"
        else world * answers.num_generations // math.gcd(world, answers.num_generations)
    )
    if answers.global_batch is not None:
        if answers.global_batch % world:
            example = max(world, answers.global_batch // world * world)
            raise ZerofitError(
                "global_batch",
                f"{answers.global_batch} is not divisible by the {world} GPUs",
                f"use a multiple of {world}, e.g. {example}",
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


def build_setup(
    inputs: PlanInputs, option: TrainingOption, micro_batch: int, grad_accum: int
) -> TrainSetup:
    """The memory model's view of one option at one micro batch (offload buffers pinned,
    DeepSpeed's default, unless the user said otherwise)."""
    answers = inputs.answers
    optimizer = answers.optimizer
    if optimizer is None and answers.optimizer_block and option.offload_optimizer == "none":
        # zerofit's own block sets "torch_adam": true without offload
        # (configs/deepspeed_json.py build_optimizer_block), so DeepSpeed steps torch.optim.AdamW,
        # foreach on CUDA (deepspeed/runtime/engine.py _configure_basic_optimizer), not FusedAdam.
        optimizer = "adamw_torch"
    return TrainSetup(
        stage=option.stage,
        world_size=inputs.world_size,
        gpus_per_node=inputs.gpus_per_node,
        offload_optimizer=option.offload_optimizer,
        offload_param=option.offload_param,
        precision=inputs.precision,
        gradient_checkpointing=option.gradient_checkpointing,
        micro_batch=micro_batch,
        seq_len=inputs.seq_len,
        grad_accum=grad_accum,
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
        interconnect=inputs.gpu.interconnect,
        padded=pads_batches(answers, micro_batch),
        weights_dtype=answers.weights_dtype,
        pin_optimizer_offload=answers.pin_memory is not False,
        pin_param_offload=answers.pin_memory is not False,
    )


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


def host_ram_gib(answers: Answers, gpu, gpus_per_node: int | None = None) -> tuple[float, str]:
    """Host RAM per node and where the number comes from: --host-ram-gib, else this node's
    /proc/meminfo, else the assumption above for ``gpus_per_node`` (default: the answers')."""
    if answers.host_ram_gib is not None:
        return answers.host_ram_gib, "given"
    from zerofit.hardware import detect_host_ram_gib

    detected = detect_host_ram_gib()
    if detected is not None:
        return detected, "this node"
    return assumed_host_ram_gib(gpu, gpus_per_node or answers.gpus_per_node), "assumed"


def evaluate(inputs: PlanInputs, option: TrainingOption, micro_batch: int) -> Candidate:
    """Estimate and judge ``option`` at ``micro_batch``.

    Offload buffers are pinned (page-locked: DeepSpeed's default, full-bandwidth asynchronous
    copies) unless the user chose. When the pinned buffers are what breaks the host RAM budget
    and unpinned ones fit, the candidate is the unpinned one: PyTorch's pinned allocator rounds
    every block up to a power of two (memory/pinned.py), pageable memory is allocated as asked.
    """
    setup = build_setup(inputs, option, micro_batch, inputs.per_rank // micro_batch)
    estimate = estimate_memory(inputs.model, setup)
    check = judge(estimate, inputs)
    pinned_cpu_gib = None
    if setup.pins_offload and not check.host_fits and inputs.answers.pin_memory is None:
        unpinned = estimate_memory(inputs.model, setup.with_pinning(False))
        unpinned_check = judge(unpinned, inputs)
        if unpinned_check.host_fits:
            pinned_cpu_gib = estimate.cpu_gib
            setup, estimate, check = setup.with_pinning(False), unpinned, unpinned_check
    return Candidate(
        option=option,
        micro_batch=micro_batch,
        estimate=estimate,
        check=check,
        pin_memory=setup.pins_offload or not option.offloaded,
        pinned_cpu_gib=pinned_cpu_gib,
    )


def evaluate_grid(
    inputs: PlanInputs, options: Iterable[TrainingOption], micro_batches: list[int]
) -> list[Candidate]:
    """Every option at every micro batch, in that order (options repeated are estimated once)."""
    return [
        evaluate(inputs, option, micro_batch)
        for option in dict.fromkeys(options)
        for micro_batch in micro_batches
    ]


def best_of(candidates: list[Candidate]) -> Candidate:
    """Fastest fitting candidate, else the one needing the least memory."""
    fitting = [c for c in candidates if c.fits]
    if fitting:
        return min(fitting, key=lambda c: c.speed_key)
    return min(candidates, key=lambda c: (c.estimate.peak_bytes, c.speed_key))


def fastest_fit(inputs: PlanInputs) -> Candidate | None:
    """The fastest option that fits under ``inputs`` at micro batch 1, searched over every option
    whatever the user's overrides (what a suggestion offers); None when none fits."""
    fitting = [c for c in evaluate_grid(inputs, all_options(), [1]) if c.fits]
    return min(fitting, key=lambda c: c.speed_key) if fitting else None
