"""The planner: the fastest ZeRO configuration that fits, with a reason per decision.

Every candidate (an option at a micro batch) gets its predicted seconds per optimizer step from
the speed model (speed/step_time.py ``estimate_step_time``) on the network the answers give
(``Network``). All candidates of one plan train the same global batch, each GPU the same
sequences per optimizer step, so their step times compare directly whatever their micro batch
and accumulation. The fastest fit wins; fits within ``NEAR_TIE`` (3 %) of it are a tie the
model cannot call, and the tie goes to the one with more memory to spare: a fit that leaves
less than the median fragmentation of long runs (``Candidate.tight``, memory/overheads.py:
public OOM messages lost a median 1.25 GiB to it) is one varying batch away from an OOM at
hour 20. Spare memory counts up to that median: beyond it a fit is roomy, and between roomy
fits of a tie the faster wins, then the simpler (the grid's order: lower stage, no offload, no
checkpointing, smaller micro batch), so that 0.2 GiB more spare never decides a plan.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from zerofit.errors import ZerofitError
from zerofit.hardware import GpuSpec, pcie_link_gbps
from zerofit.memory.activations import is_encoder_decoder
from zerofit.memory.estimate import GIB, MemoryEstimate, TrainSetup, estimate_memory
from zerofit.memory.overheads import FRAGMENTATION_AT_OOM_MEDIAN_GIB, is_tight
from zerofit.planning.answers import Answers
from zerofit.planning.options import TrainingOption, all_options
from zerofit.speed.step_time import DEFAULT_INTER_NODE_GBITS, StepTime, estimate_step_time

MAX_MICRO = 64
# Where the node's RAM cannot be read (and --host-ram-gib is not given), offload plans assume a
# typical server: about twice the node's GPU memory, at least 64 GiB.
HOST_RAM_PER_GPU_MEMORY = 2.0
MIN_HOST_RAM_GIB = 64.0
DEFAULT_TOKENS_PER_STEP = 2**18  # default global batch: ~262k tokens per optimizer step
# Step times within 3 % of the fastest fit are a tie: below what the speed model resolves (its
# per-scenario order is checked where measured times differ by more than 10 %).
NEAR_TIE = 0.03


@dataclass(frozen=True)
class Network:
    """The links a step's collectives cross and where each number comes from.

    ``interconnect``: the GPUs' link inside a node (nvlink | pcie; it also sizes NCCL's
    buffers, memory/overheads.py). ``intra_node_gbps``: GB/s per GPU, one direction, over it.
    ``inter_node_gbps``: Gbit/s per node between nodes (only used on more than one node).
    """

    interconnect: str
    intra_node_gbps: float
    inter_node_gbps: float
    intra_source: str  # catalog | pcie | bridge | given
    inter_source: str  # given | default


def intra_node_link(answers: Answers, gpu: GpuSpec, gpus_per_node: int) -> tuple[str, float, str]:
    """(interconnect, GB/s per GPU one way, source) of the link inside a node.

    ``auto``: the catalog GPU's usual link (NVLink/NVSwitch on SXM parts, PCIe on PCIe cards).
    ``pcie`` on a GPU that usually has NVLink (an A100 or H100 in PCIe form, NVLink left out):
    its PCIe generation at x16, one direction (hardware.pcie_link_gbps: Gen5 64 GB/s on Hopper
    and Blackwell, Gen4 32 GB/s on Ampere, Gen3 16 GB/s on Volta), the bound of a ring whose
    GPUs talk through the host bridge or a PCIe switch. ``nvlink`` on a PCIe card: its NVLink
    bridge, which joins two cards, so only with two GPUs per node (more: the ring crosses PCIe).
    A measured ``intra_node_gbps`` (--intra-node-gbps, --cluster-facts) wins over all of these.
    """
    interconnect = gpu.interconnect if answers.interconnect == "auto" else answers.interconnect
    if answers.intra_node_gbps is not None:
        return interconnect, answers.intra_node_gbps, "given"
    if interconnect == gpu.interconnect:
        return interconnect, gpu.link_gbps, "catalog"
    if interconnect == "pcie":
        return interconnect, pcie_link_gbps(gpu), "pcie"
    if not gpu.bridge_gbps:
        raise ZerofitError(
            "interconnect",
            f"{gpu.name} has no NVLink",
            "use --interconnect pcie or auto, or give the measured link with --intra-node-gbps",
        )
    if gpus_per_node <= 2:
        return interconnect, gpu.bridge_gbps, "bridge"
    return interconnect, pcie_link_gbps(gpu), "pcie"


def network_of(answers: Answers, gpu: GpuSpec, gpus_per_node: int) -> Network:
    """The network the answers give: their interconnect and bandwidths, else the catalog's link
    and ``DEFAULT_INTER_NODE_GBITS`` (100 Gbit/s per node)."""
    interconnect, intra, intra_source = intra_node_link(answers, gpu, gpus_per_node)
    inter = answers.inter_node_gbps
    return Network(
        interconnect=interconnect,
        intra_node_gbps=intra,
        inter_node_gbps=DEFAULT_INTER_NODE_GBITS if inter is None else inter,
        intra_source=intra_source,
        inter_source="default" if inter is None else "given",
    )


def trainable_params(inputs: "PlanInputs") -> int | None:
    """The parameters the optimizer steps, for the speed model: None, every weight (full
    fine-tuning). An adapter (LoRA) returns its own count here."""
    from zerofit.memory.lora import count_trainable_params

    return count_trainable_params(inputs.model, inputs.answers)


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
    network: Network

    @property
    def budget_gib(self) -> float:
        """The GPU memory a configuration may use."""
        return self.gpu.memory_gib * self.answers.headroom

    @property
    def num_nodes(self) -> int:
        """Nodes of this world (a suggestion's world may span more nodes than the answers')."""
        return math.ceil(self.world_size / max(1, self.gpus_per_node))

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
            network=network_of(self.answers, self.gpu, gpus_per_node),
        )


def takes_target_len(model) -> bool:
    """Whether ``model`` has targets of their own length: an encoder-decoder (T5), whose decoder
    and loss run on them (memory/activations.py ``is_encoder_decoder``)."""
    return is_encoder_decoder(model)


def check_target_len(model, answers: Answers) -> None:
    """``target_len`` is an encoder-decoder's (T5's) target length: any other model reads one
    sequence, whose length is ``seq_len``."""
    if answers.target_len is not None and not takes_target_len(model):
        raise ZerofitError(
            "target_len",
            f"applies to encoder-decoder models only (T5); {model.name} ({model.architecture}) "
            "reads one sequence",
            "drop --target-len; a decoder-only model's prompt and answer are both in --seq-len",
        )


def plan_inputs(model, answers: Answers, gpu: GpuSpec, precision: str, per_rank: int) -> PlanInputs:
    """``PlanInputs`` of the answers as given: their world, node size and sequence length."""
    check_target_len(model, answers)
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
        network=network_of(answers, gpu, answers.gpus_per_node),
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
    step: StepTime  # one optimizer step's predicted seconds (GRPO's with its generation)
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
    def step_s(self) -> float:
        """Predicted seconds per optimizer step."""
        return self.step.total_s

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
        zero = f"ZeRO-{option.stage}{option.zero_plus_label}"
        return f"{zero}{where}{checkpointing}, micro {self.micro_batch}"


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
        zero_plus=option.zero_plus,
        micro_batch=micro_batch,
        seq_len=inputs.seq_len,
        target_len=answers.target_len,
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
        interconnect=inputs.network.interconnect,
        gpu=inputs.gpu.key,
        padded=pads_batches(answers, micro_batch),
        weights_dtype=answers.weights_dtype,
        autocast=answers.autocast,
        finetuning=answers.finetuning,
        lora_rank=answers.lora_rank,
        lora_targets=answers.lora_targets,
        lora_dropout=answers.lora_dropout,
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
    grad_accum = inputs.per_rank // micro_batch
    setup = build_setup(inputs, option, micro_batch, grad_accum)
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
        step=step_time_of(inputs, setup),
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


def step_time_of(inputs: PlanInputs, setup: TrainSetup) -> StepTime:
    """The speed model's seconds per optimizer step of ``setup`` on the answers' network."""
    network = inputs.network
    return estimate_step_time(
        setup,
        inputs.model,
        inputs.gpu,
        inter_node_gbps=network.inter_node_gbps,
        intra_node_gbps=network.intra_node_gbps,
        trainable_params=trainable_params(inputs),
        sample_len=packed_sample_len(inputs.answers),
    )


def packed_sample_len(answers: Answers) -> int | None:
    """The mean tokens of the samples packed into each row: ``avg_seq_len`` where rows are
    packed or padding-free (``padding`` false, as ``sequences_per_epoch`` reads it); None
    otherwise, and for GRPO, whose rows are its generated completions. The speed model
    shrinks their attention where the kernel keeps the samples apart
    (speed/step_time.py ``attention_sample_len``)."""
    if answers.padding is not False or answers.workload == "grpo":
        return None
    return answers.avg_seq_len


def fastest_of(fitting: list[Candidate]) -> Candidate:
    """The predicted fastest of ``fitting`` (every one trains the same sequences per optimizer
    step, so step times compare across micro batches); among those within ``NEAR_TIE`` of it,
    the one with more memory to spare, counted up to what long runs lose to fragmentation, then
    the faster, then the first in the grid (see the module docstring)."""
    fastest = min(c.step_s for c in fitting)
    near = [c for c in fitting if c.step_s <= fastest * (1 + NEAR_TIE)]
    # spare memory in tenths of a GiB, as reports print it: 0.01 GiB never outweighs speed
    return max(
        near,
        key=lambda c: (round(min(c.spare_gib, FRAGMENTATION_AT_OOM_MEDIAN_GIB), 1), -c.step_s),
    )


def best_of(candidates: list[Candidate]) -> Candidate:
    """Fastest fitting candidate, else the one needing the least memory (the faster of equals)."""
    fitting = [c for c in candidates if c.fits]
    if fitting:
        return fastest_of(fitting)
    return min(candidates, key=lambda c: (c.estimate.peak_bytes, c.step_s))


def fastest_fit(inputs: PlanInputs) -> Candidate | None:
    """The fastest option that fits under ``inputs`` at micro batch 1, searched over every option
    whatever the user's overrides (what a suggestion offers), ZeRO++ included where ``inputs``
    span more than one node; None when none fits."""
    fitting = [c for c in evaluate_grid(inputs, all_options(inputs.num_nodes), [1]) if c.fits]
    return fastest_of(fitting) if fitting else None


def sequences_per_epoch(answers: Answers, seq_len: int) -> int | None:
    """Rows of the global batch one pass over the data fills; None without a dataset size.

    The speed model runs sequences of ``seq_len`` tokens, so:
    - ``dataset_tokens``: the tokens packed into sequences of ``seq_len``;
    - ``dataset_samples`` packed (``padding`` false: packing or padding-free collation): their
      tokens, ``avg_seq_len`` each (default ``seq_len``; a longer sample is truncated to
      ``seq_len``, as the tokenizer's max_length does), into sequences of ``seq_len``;
    - ``dataset_samples`` otherwise: one sample per sequence, padded (estimated at ``seq_len``:
      an upper bound when samples are shorter; lower ``--seq-len`` to the padded length);
    - GRPO: each prompt sample gives ``num_generations`` completions, the rows it counts.
    """
    if answers.dataset_tokens is not None:
        return math.ceil(answers.dataset_tokens / seq_len)
    samples = answers.dataset_samples
    if samples is None:
        return None
    if answers.workload == "grpo":
        return samples * answers.num_generations
    if answers.padding is False:
        tokens = samples * min(answers.avg_seq_len or seq_len, seq_len)
        return math.ceil(tokens / seq_len)
    return samples


def run_optimizer_steps(answers: Answers, seq_len: int, global_batch: int) -> int | None:
    """Optimizer steps of the whole run: ``epochs`` passes of ``ceil(sequences / global batch)``
    steps (a last, partial batch still takes a step, as the HF Trainer's dataloader keeps it),
    rounded up; None without a dataset size."""
    sequences = sequences_per_epoch(answers, seq_len)
    if sequences is None:
        return None
    return math.ceil(answers.epochs * math.ceil(sequences / global_batch))


def run_hours(steps: int | None, step_s: float | None) -> float | None:
    """The run's wall time in hours: optimizer steps x seconds per step (None if either is)."""
    if steps is None or step_s is None:
        return None
    return steps * step_s / 3600
