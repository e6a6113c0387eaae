"""The estimate of one fixed configuration as a report: ``zerofit estimate``'s numbers, its
verdict's inputs and what its ``--json`` prints.

Knobs left unset take fixed estimate defaults (no planning): ZeRO stage 2 (3 when parameters
are offloaded), no offload, micro batch 1, no gradient checkpointing, the precision the planner
would pick. Gradient accumulation is global_batch / (micro x GPUs) when a global batch is given,
else what the user's config files say, else 1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from zerofit.errors import ZerofitError
from zerofit.memory.estimate import GIB, MemoryEstimate, TrainSetup, estimate_memory
from zerofit.planning.answers import Answers
from zerofit.planning.options import TrainingOption
from zerofit.planning.planner import (
    BudgetCheck,
    PlanInputs,
    build_setup,
    judge,
    pick_precision,
    plan_inputs,
    run_optimizer_steps,
    step_time_of,
)
from zerofit.planning.speed_report import SpeedReport, build_speed_report

# what a user's config files hand the estimate beyond Answers fields (memory/ds_config.py)
SETUP_KEYS_FROM_FILES = (
    "buckets",
    "overlap_comm",
    "memory_efficient_linear",
    "ds_optimizer_block",
    "pin_optimizer_offload",
    "pin_param_offload",
    "zero_plus",  # ZeRO++ keys (memory/ds_config.py read_zero_block): memory and communication
)

# estimate --json has always printed run_time_h before optimizer_steps (plan --json after
# them): each keeps its order for the scripts that read it
ESTIMATE_SPEED_KEYS = (
    "step_time_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "time_breakdown",
    "run_time_h",
    "optimizer_steps",
    "interconnect",
    "intra_node_gbps",
    "inter_node_gbps",
)


@dataclass(frozen=True)
class EstimateReport:
    """One configuration's per-GPU memory, its breakdown and both budgets' verdicts. The fields
    are ``--json``'s keys, in its order (``as_json``)."""

    model: str
    # where the decoder layer's bytes come from (activations.activations_basis): a formula
    # checked against transformers' modules, or this architecture's own code traced
    activations_traced: bool
    activations_basis: str
    params: int
    gpu: str  # hardware.CATALOG key
    world_size: int
    stage: int
    offload_optimizer: str
    offload_param: str
    precision: str
    micro_batch: int
    grad_accum: int
    seq_len: int
    gradient_checkpointing: bool
    workload: str
    # micro batches padded to their longest sequence (planner.pads_batches), and what that
    # adds to the peak
    padded: bool
    padding_gib: float
    peak_gib: float
    fits: bool
    budget_gib: float
    peak_phase: str
    breakdown: dict[str, float]
    cpu_gib: float
    cuda_context_gib: float
    stack: str
    optimizer: str
    loss_path: str
    # stage 0 without DeepSpeed trains the weights in their load dtype (memory/states.py)
    weights_dtype: str | None
    # stage 0 without DeepSpeed: the forward runs under torch.autocast (False: a plain loop in
    # the weights' dtype; TrainSetup.autocast)
    autocast: bool
    outside_peak_gib: dict[str, float]
    safety_margin_gib: float
    gpu_need_gib: float
    # what the budget leaves beyond everything above (negative: it does not fit)
    spare_gib: float
    gpu_memory_gib: float
    fits_gpu: bool
    host_ram_gib: float
    host_ram_source: str
    fits_host: bool
    # offload buffers page-locked (some offload block pins), and the host RAM without pinning
    pin_memory: bool
    cpu_gib_unpinned: float | None
    # --replay-allocator: the caching allocator replayed over a fake-tensor trace of the run
    # (memory/allocation_trace.py): "ran", and its max_memory_allocated / _reserved and
    # out_of_memory, or why it did not run; None when not asked
    allocator_replay: dict[str, Any] | None
    from_files: tuple[str, ...]  # inputs read from the user's config files
    # predicted speed, the run's length and the network they assume; --json prints its fields
    # at the top level, last, in ESTIMATE_SPEED_KEYS' order
    speed: SpeedReport = dataclasses.field(default_factory=SpeedReport)

    @property
    def option(self) -> TrainingOption:
        return TrainingOption(
            self.stage, self.offload_optimizer, self.offload_param, self.gradient_checkpointing
        )

    def budget_check(self) -> BudgetCheck:
        """The verdict's inputs, as the report rounds them."""
        return BudgetCheck(
            gpu_fits=self.fits_gpu,
            host_fits=self.fits_host,
            gpu_need_gib=self.gpu_need_gib,
            budget_gib=self.budget_gib,
            spare_gib=self.spare_gib,
            cpu_gib=self.cpu_gib,
            host_ram_gib=self.host_ram_gib,
            host_ram_source=self.host_ram_source,
        )

    def as_json(self) -> dict[str, Any]:
        """What ``zerofit estimate --json`` prints."""
        out = dataclasses.asdict(self)
        del out["speed"]  # its fields follow at the top level
        out["from_files"] = list(self.from_files)
        return {**out, **self.speed.as_json(ESTIMATE_SPEED_KEYS)}


def estimate_option(answers: Answers) -> TrainingOption:
    """The option ``estimate`` runs: the user's knobs, else stage 2 (3 with parameters
    offloaded), the optimizer offloaded with the parameters, no checkpointing."""
    offload_param = answers.offload_param or "none"
    stage = answers.stage if answers.stage is not None else (3 if offload_param != "none" else 2)
    offload_optimizer = answers.offload_optimizer or (
        "none" if offload_param == "none" else offload_param
    )
    if offload_param != "none" and stage != 3:
        raise ZerofitError(
            "offload_param",
            f"needs ZeRO stage 3, not {stage}",
            "use --stage 3 or --offload-param none",
        )
    if offload_optimizer != "none" and stage == 0:
        raise ZerofitError(
            "offload_optimizer",
            "needs ZeRO stage 1, 2 or 3",
            "use --stage 2 or --offload-optimizer none",
        )
    return TrainingOption(
        stage, offload_optimizer, offload_param, bool(answers.gradient_checkpointing)
    )


def estimate_grad_accum(answers: Answers, micro_batch: int, files: dict) -> int:
    """global_batch / (micro x GPUs) when a global batch is given, else the files' accumulation
    (or their train batch size over micro x GPUs), else 1."""
    world_size = answers.world_size
    if answers.global_batch is not None:
        if answers.global_batch % (micro_batch * world_size):
            raise ZerofitError(
                "global_batch",
                f"{answers.global_batch} is not a multiple of micro {micro_batch} x "
                f"{world_size} GPUs",
                f"use a multiple of {micro_batch * world_size}",
            )
        return answers.global_batch // (micro_batch * world_size)
    if "train_batch_size" in files and "grad_accum" not in files:
        return max(1, files["train_batch_size"] // (micro_batch * world_size))
    return files.get("grad_accum", 1)


def estimate_setup(
    inputs: PlanInputs, option: TrainingOption, micro_batch: int, grad_accum: int, files: dict
) -> TrainSetup:
    """The planner's setup of ``option``, with what the user's config files say beyond Answers
    (bucket sizes, overlap_comm, the optimizer block, pin_memory); ``--(no-)pin-memory`` wins
    over the files' offload blocks."""
    answers = inputs.answers
    setup = build_setup(inputs, option, micro_batch, grad_accum)
    from_files = {key: files[key] for key in SETUP_KEYS_FROM_FILES if key in files}
    if files.get("optimizer") and answers.optimizer is None:
        from_files["optimizer"] = files["optimizer"]
    setup = dataclasses.replace(setup, **from_files)
    if answers.pin_memory is not None:
        setup = setup.with_pinning(answers.pin_memory)
    return setup


def build_estimate_report(
    answers: Answers,
    files: dict | None = None,
    model: Any = None,
    replay_allocator: bool = False,
) -> EstimateReport:
    """Estimate the configuration ``answers`` fix (see the module docstring for the defaults).

    ``files``: inputs read from the user's config files that are not Answers fields (buckets,
    overlap_comm, optimizer block, grad_accum); ``model`` skips resolving ``answers.model``.
    ``replay_allocator``: replay the caching allocator over a trace of the run
    (``with_allocator_replay``) where the setup allows it.
    """
    from zerofit.hardware import lookup

    if model is None:
        from zerofit.models.resolve import resolve_model

        model = resolve_model(answers.model)
    files = files or {}
    gpu = lookup(answers.gpu)
    precision = pick_precision(answers, gpu)[0]
    option = estimate_option(answers)
    micro_batch = answers.micro_batch or 1
    grad_accum = estimate_grad_accum(answers, micro_batch, files)
    inputs = plan_inputs(model, answers, gpu, precision, micro_batch * grad_accum)
    setup = estimate_setup(inputs, option, micro_batch, grad_accum, files)
    estimate = estimate_memory(model, setup)
    replay = None
    if replay_allocator:
        estimate, replay = with_allocator_replay(model, setup, estimate, gpu.memory_gib)
    check = judge(estimate, inputs)
    if replay and replay.get("out_of_memory"):
        check = dataclasses.replace(check, gpu_fits=False)
    unpinned_cpu_gib, padding_gib = _unpinned_and_padding_gib(model, setup, estimate)
    outside = estimate.outside_bytes(gpu.memory_gib)
    return EstimateReport(
        model=model.name,
        activations_traced=estimate.activations_basis != "llama_shaped",
        activations_basis=estimate.activations_basis,
        params=model.params,
        gpu=gpu.key,
        world_size=inputs.world_size,
        stage=option.stage,
        offload_optimizer=option.offload_optimizer,
        offload_param=option.offload_param,
        precision=precision,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        seq_len=answers.seq_len,
        gradient_checkpointing=option.gradient_checkpointing,
        workload=answers.workload,
        padded=setup.padded,
        padding_gib=padding_gib,
        peak_gib=round(estimate.peak_gib, 3),
        fits=check.fits,
        budget_gib=round(check.budget_gib, 2),
        peak_phase=estimate.phase,
        breakdown=estimate.breakdown_gib(gpu.memory_gib),
        cpu_gib=round(estimate.cpu_gib, 3),
        cuda_context_gib=round(estimate.context_bytes / GIB, 3),
        stack=answers.stack,
        optimizer=estimate.optimizer,
        loss_path=estimate.loss_path,
        weights_dtype=setup.weight_dtype if setup.without_deepspeed else None,
        autocast=setup.autocast or not setup.without_deepspeed,
        outside_peak_gib={name: round(value / GIB, 3) for name, value in outside.items()},
        safety_margin_gib=answers.safety_margin_gib,
        gpu_need_gib=round(check.gpu_need_gib, 3),
        spare_gib=round(check.spare_gib, 3),
        gpu_memory_gib=gpu.memory_gib,
        fits_gpu=check.gpu_fits,
        host_ram_gib=round(check.host_ram_gib, 1),
        host_ram_source=check.host_ram_source,
        fits_host=check.host_fits,
        pin_memory=setup.pins_offload,
        cpu_gib_unpinned=unpinned_cpu_gib,
        allocator_replay=replay,
        from_files=tuple(sorted(key for key in files if key != "buckets"))
        + (("buckets",) if "buckets" in files else ()),
        speed=_speed_of(inputs, setup),
    )


def with_allocator_replay(
    model, setup: TrainSetup, estimate: MemoryEstimate, gpu_memory_gib: float
) -> tuple[MemoryEstimate, dict[str, Any]]:
    """The estimate with the caching allocator's fragmentation taken from a replay of the run
    (memory/allocation_trace.py: the model loaded, its steps recorded on fake tensors at the
    real shape, every allocation replayed through memory/allocator.py), and what the replay
    showed. The reserved memory the verdict counts is then the replay's ``max_memory_reserved``
    (the allocator term becomes what it holds beyond the estimated peak); the replay runs on a
    GPU of the catalog's memory less the CUDA context, NCCL's and vLLM's shares, and running
    out of memory there is a verdict of its own. Where the setup cannot be replayed the
    estimate is unchanged and the reason is reported."""
    from zerofit.memory.allocation_trace import replay_support, replay_training_run

    reason = replay_support(model, setup)
    if reason:
        return estimate, {"ran": False, "reason": reason}
    outside = estimate.outside_bytes(gpu_memory_gib)
    others = sum(value for name, value in outside.items() if name != "allocator_fragmentation")
    capacity = int(gpu_memory_gib * GIB) - others
    run = replay_training_run(model, setup, capacity=capacity)
    if run is None:
        reason = (
            "torch, transformers or peft is missing, or the model cannot be built on fake "
            "tensors"
        )
        return estimate, {"ran": False, "reason": reason}
    fragmentation = max(0, run.max_reserved - estimate.peak_bytes)
    estimate = dataclasses.replace(estimate, allocator_bytes=fragmentation)
    return estimate, {
        "ran": True,
        "max_allocated_gib": round(run.max_allocated / GIB, 3),
        "max_reserved_gib": round(run.max_reserved / GIB, 3),
        "out_of_memory": run.out_of_memory,
        "steps": run.steps,
        "seconds": round(run.seconds, 1),
    }


def _speed_of(inputs: PlanInputs, setup: TrainSetup) -> SpeedReport:
    """speed/step_time.py's estimate of one optimizer step of ``setup`` on the answers' network,
    and the run's optimizer steps and hours when the dataset size is given (GRPO's step
    includes its generation: speed/generation.py)."""
    answers = inputs.answers
    global_batch = setup.micro_batch * setup.grad_accum * inputs.world_size
    steps = run_optimizer_steps(answers, answers.seq_len, global_batch)
    return build_speed_report(step_time_of(inputs, setup), steps, inputs.network)


def _unpinned_and_padding_gib(
    model, setup: TrainSetup, estimate: MemoryEstimate
) -> tuple[float | None, float]:
    """The host RAM the same offload needs with pin_memory false (memory/pinned.py; None when
    nothing is pinned), and what padding the micro batch adds to the peak (memory/activations.py:
    padded_attention_bytes; 0 for equal-length rows)."""
    unpinned_cpu_gib = None
    if setup.pins_offload:
        unpinned = estimate_memory(model, setup.with_pinning(False))
        unpinned_cpu_gib = round(unpinned.cpu_gib, 3)
    padding_gib = 0.0
    if setup.padded:
        unpadded = estimate_memory(model, dataclasses.replace(setup, padded=False))
        padding_gib = round(estimate.peak_gib - unpadded.peak_gib, 3)
    return unpinned_cpu_gib, padding_gib
