"""Seconds per optimizer step of one training configuration, term by term as DeepSpeed runs it.

One optimizer step is ``grad_accum`` micro steps (forward, backward) and one optimizer step. Its
time is the sum of:

- compute: the step's FLOPs (speed/flops.py) over the GPU's dense 16-bit peak times an achieved
  efficiency that grows with the tokens of one micro step (``compute_efficiency``);
- recompute: gradient checkpointing's second forward, at the same efficiency;
- exposed communication: what the ZeRO stage's collectives take beyond the compute they overlap
  (``communication_seconds``), over the slowest link of the ring;
- offload: gradients to the host and parameters back over PCIe, and DeepSpeed's CPUAdam step as
  memory-bound host work (``offload_seconds``);
- the GPU optimizer step as HBM-bound work (``gpu_optimizer_seconds``);
- a fixed cost per micro step (Python, kernel launches, the data loader) and one per optimizer
  step, and DeepSpeed's hooks (per trainable tensor's gradient hook at ZeRO-2/3, per module's
  fetch and release at ZeRO-3) and checkpointing's second dispatch of each layer's forward as
  far as the GPU's work does not hide them (``hook_seconds``, ``recompute_host_seconds``);
- under LoRA, PEFT's memory-bound adapter path (``adapter_elementwise_seconds``); under
  FlashAttention-3 on Hopper, its faster attention (``attention_kernel_savings``);
- under QLoRA, bitsandbytes' dequantization of each 4-bit weight on every use, its HBM bytes and
  host calls (``qlora_dequantize_seconds``, speed/quantization.py);
- for GRPO, the rollout that feeds the step (speed/generation.py ``estimate_generation_time``).

The named constants below are the only fitted numbers; each says its value and the rows
(tests/data/step_times_public.jsonl by id, or the H100 calibration runs) it came from. None is
fitted to a single row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zerofit.hardware import GpuSpec, is_hopper
from zerofit.memory.activations import activations_basis
from zerofit.memory.estimate import DTYPE_BYTES, TrainSetup, step_sizes
from zerofit.memory.lora import is_adapter, layer_linear_shapes, targeted_modules
from zerofit.memory.param_layout import zero3_kept_gathered_elements
from zerofit.models.resolve import ModelSpec
from zerofit.speed.device import DeviceProfile, EfficiencyCurve
from zerofit.speed.flops import (
    StepFlops,
    forward_flops_per_sequence,
    keep_lm_head_positions,
    step_flops_from_terms,
)
from zerofit.speed.generation import (
    DECODE_HBM_EFFICIENCY,
    estimate_generation_time,
    scored_logit_positions,
)
from zerofit.speed.quantization import (
    DEQUANTIZE_HOST_S_PER_CALL,
    estimate_qlora_base,
    exposed_qlora_host_seconds,
)

# Fitted per GPU generation (never per row), with the per-step costs below, by least squares over
# a small grid (median |error| of the rows named):
# - Ampere (A100/A800): peak_fraction 0.65, half_tokens 50, from the Qwen README's single-A100
#   LoRA sweeps (qwen1-{1.8b,7b,14b}-lora-seq256 ... -seq8192 and the -lora-emb- rows: 36 rows,
#   stage 0, one GPU, so no communication; median |error| 6 %), timed with PEFT's memory-bound
#   adapter path (``adapter_elementwise_seconds``; without it the fit took 0.55, the curve
#   absorbing the adapters' elementwise work, and then ran full fine-tunes too slow). The
#   same rows' long sequences gave the curve a
#   near-flat shape: from 256 tokens per micro step on, an A100 runs these models' matmuls at
#   about the same rate, and what makes short micro steps slow is the fixed cost per micro step
#   below, not thin matmuls. The xtuner rows on A100 (xtuner-llama2-7b-a100x8-8k-sp1: 185 model
#   TFLOPs of 312 at 8k tokens, 0.59) and the Qwen README's full fine-tunes
#   (qwen1-1.8b-full-seq8192: ~0.6) agree with the top of the curve.
# - Hopper (H100/H200/H800/H20): peak_fraction 0.45 from torchtitan-llama3.1-8b-h100x8-fsdp and
#   -h100x128-fsdp (5,762 and 5,605 tokens/s per GPU at 16k tokens per micro step, bf16, eager
#   mode; errors -2 % and +2 % at 0.45); half_tokens 50 taken over from Ampere: no Hopper row
#   varies the micro batch.
# - Blackwell and every other GPU: Hopper's values, unfitted: no public bf16 row names a micro
#   batch on them.
EFFICIENCY = {
    "ampere": EfficiencyCurve(peak_fraction=0.65, half_tokens=50),
    "hopper": EfficiencyCurve(peak_fraction=0.45, half_tokens=50),
    "blackwell": EfficiencyCurve(peak_fraction=0.45, half_tokens=50),
    "other": EfficiencyCurve(peak_fraction=0.45, half_tokens=50),
}

# Python, kernel launches and the data loader per micro step, 0.08 s, and the optimizer step's
# own fixed cost (gradient norm and clipping over every tensor, the scheduler, logging), 0.1 s:
# fitted with Ampere's curve on the same 36 Qwen LoRA rows (qwen1-1.8b-lora-seq256 and -seq512
# both take 1.0 s for 8 micro steps, where the compute is ~0.15 s). A plain training step of
# Qwen2.5-0.5B's shape on a lent H200 (benchmarks/ds_generate_overhead.py, 16 x 320 tokens,
# torch AdamW) took 0.08 s, ~0.04 of it compute. Both hold for small models, checked on lent
# H100s at one rank (benchmarks/deepspeed_hook_costs.py ``--calibration-loop``): a plain torch
# micro step of a 24-layer model is host-bound, 0.056-0.127 s (BERT-large, Qwen2.5-0.5B; 0.01-0.02
# s of GPU work), 2.3-5.3 ms of kernel launches per layer; DeepSpeed's optimizer step takes
# 0.045-0.11 s for 335M-494M parameters (ZeRO-3 least, the bf16 ZeRO-0 optimizer most) where
# torch's clip and AdamW take 0.012-0.016 s: host bookkeeping that does not shrink with the model.
# BERT-large at micro 4 x 512 under ZeRO-2 measured 0.18-0.21 s per step, ~0.02 s of it GPU work.
# What the flat value leaves out is the launches' growth with depth (a 2-layer model pays far
# less, an 80-layer one more where its GPU work does not hide them); per layer, additive, it
# puts the Qwen README's 7B and 14B LoRA rows at seq256 29-42 % high (now 11-15 %): it stays flat.
MICRO_STEP_OVERHEAD_S = 0.08
OPTIMIZER_STEP_OVERHEAD_S = 0.1

# DeepSpeed's hooks, per micro step: a count the model knows (``trainable_tensors``,
# ``zero3_hooked_modules``) times a per-item cost of host (Python) time:
# - ``GRAD_HOOK_S_PER_TENSOR``: every trainable tensor's gradient hook where ZeRO reduces
#   gradients as backward produces them (stage 2, and stage 1 under ``overlap_comm``:
#   runtime/zero/stage_1_and_2.py ``DeepSpeedZeroOptimizer.create_reduce_and_remove_grad_hooks``
#   -> ``reduce_ready_partitions_and_remove_grads`` -> ``reduce_independent_p_g_buckets_and_
#   remove_grads``: the bucket bookkeeping, the copy into the bucket, ``average_tensor`` per full
#   bucket; stage 3: stage3.py ``create_reduce_and_remove_grad_hooks`` ->
#   ``reduce_ready_partitions_and_remove_grads``).
# - ``STAGE3_FETCH_S_PER_MODULE``: ZeRO-3 hooks every submodule, parameterless ones too
#   (runtime/zero/parameter_offload.py ``DeepSpeedZeRoOffload._register_deepspeed_module``:
#   ``_pre_forward_module_hook`` / ``_post_forward_module_hook`` and the backward pair), each
#   call running the coordinator (partitioned_param_coordinator.py
#   ``PartitionedParameterCoordinator.fetch_sub_module``: trace, prefetch queue, waits on the
#   gathers' events; ``release_sub_module``): in forward, in backward, and again in
#   checkpointing's recompute.
# - ``RECOMPUTE_HOST_S_PER_LAYER``: checkpointing dispatches each decoder layer's forward again
#   inside backward (``recompute_host_seconds``), host time the recompute's FLOPs leave out.
# The structure is measured on real engines: benchmarks/deepspeed_hook_costs.py (one gloo rank on
# CPU, tiny Linear stacks whose tensor and module counts vary apart, least squares over nine
# shapes per stage) finds ZeRO-3's cost growing with modules (+83-144 us per module over ZeRO-0
# for its two passes, four runs on a loaded 2-core host) and ZeRO-1/2's with tensors (+10-85 us
# per tensor), 0.24-0.42 and 0.01-0.11 of the H200-derived costs below (a server's host and CUDA's
# event calls may cost more). On lent H100s of the calibration runs' kind (one rank, DeepSpeed
# 0.19.8, torch 2.11, the calibration loop timed phase by phase: benchmarks/deepspeed_hook_costs.py
# ``--calibration-loop``, two machines) ZeRO-2's backward under accumulation took 29-51 ms more
# than ZeRO-1's before the boundary (the same engine, no bucket work) for Qwen2.5-0.5B's 218
# tensors, and BERT-large's ZeRO-2 backward 38-55 ms more than a plain torch one for its 391:
# 0.1-0.23 ms per tensor; ZeRO-3's forward and backward each took 0.11-0.18 s more than ZeRO-2's
# for 318 modules: 0.33-0.57 ms per module pass. The Qwen README's single-A100 ZeRO-3 rows
# (qwen1-1.8b-full-seq256 ... -seq8192: 2.1-2.3 s for 8 micro steps up to 2048 tokens, 5.6 s at
# 8192) fit ``max(host, GPU)`` per micro step with ~0.1 ms per module pass, and so do its 4-GPU
# Qwen-72B LoRA rows (qwen1-72b-lora-z3-seq256 ... -seq8192) once PEFT's own modules are counted
# (``PEFT_CALLED_MODULES_PER_ADAPTED_LINEAR``: 3,287 hooked modules, not 1,046): hosts and
# DeepSpeed versions differ by 3x or more (this repository's 2-core CPU host runs ZeRO-3's hooks
# at ~0.08 ms per module pass with DeepSpeed 0.19 on one gloo rank). The module cost is for
# DeepSpeed 0.19, the version zerofit writes configs for; DeepSpeed's own version moves it
# (below: ``STAGE3_HOOK_COST_BY_DEEPSPEED``).
# DeepSpeed's version explains about 2x of the gap between those hosts. The same CPU host,
# torch 2.13, one gloo rank, benchmarks/deepspeed_hook_costs.py's nine shapes and least squares
# with ZeRO-1 as the baseline (0.12.6's ZeRO-0 rejects CPU gradients), three interleaved runs per
# version, 0.12.6 imported
# with in-process stand-ins for what torch 2.13 and numpy 2 dropped; ZeRO-3's cost per module
# pass, us, median [range]:
#     DeepSpeed                  0.12.6       0.14.4       0.16.9       0.19.8
#     weights kept (default)     29 [28-38]   41 [36-43]   37 [34-64]   60 [59-62]
#     weights gathered (0)       31 [28-32]   41 [39-43]   39 [37-40]   62 [56-64]
# (the 8 x 8 weights sit under ``stage3_param_persistence_threshold``; at 0 each is gathered and
# released). Per trainable tensor ZeRO-3 adds 50-90 us in every version, ZeRO-2 under 20 us: no
# trend within the noise. 0.19.8's module hooks take 2.0x 0.12.6's (more Python per fetch and
# release: compiler-disable wrappers, longer ``fetch_sub_module`` / ``release_sub_module``), so
# the A100 rows' ~0.14 ms, if run on a DeepSpeed of 0.12's era, is ~0.28 ms on 0.19: most of the
# way to the H100 hosts' 0.33-0.57 ms. Host speed and CUDA's stream and event calls, which a CPU
# run does not make, are the rest.
# Both constants are fitted jointly by least squares of the relative error over the 57 predicted
# public rows and the nine H100 calibration runs, each public source's rows at its own
# DeepSpeed's module cost (benchmarks/step_times_public.py ``DEEPSPEED_OF_SOURCE``: the Qwen
# README's late-2023 runs on 0.12, ms-swift's 2025 docs on 0.16), grid 0.22-0.38 ms per module
# pass: 0.28-0.30 ms is the lowest (rms 11.7 %; public median |error| 7 %, median Kendall tau
# 0.87, plan's pick 7/7; calibration median 10 %, its ZeRO-3 runs -10 / -17 %). One cost for
# every version instead (rms 13.1 % at 0.14 ms) cannot hold both: 0.14 ms leaves the calibration's
# ZeRO-3 runs 33-40 % low, 0.26 ms puts the Qwen-1.8B one-GPU rows at +47..+61 %.
# benchmarks/deepspeed_hook_costs.py ``--zero3-one-gpu`` times the Qwen-1.8B rows' own setup on
# one lent GPU (not run yet).
# ``RECOMPUTE_HOST_S_PER_LAYER`` stays at the earlier joint fit's 2 ms (the same H100 runs:
# checkpointing added 74-81 ms to a ZeRO-2 micro step of 24 layers at 4 x 2048 tokens, 3.1-3.4 ms
# per layer, ~0.6 ms of it the recompute's FLOPs).
# An earlier value, 0.77 ms per tensor, came from one lent H200 run of
# benchmarks/ds_generate_overhead.py (0.08 / 0.21 / 0.32 s per step plain / ZeRO-2 / ZeRO-3),
# read as micro steps; but its step() runs ``engine.step()`` too, so the ZeRO-2 - plain gap
# holds DeepSpeed's optimizer step, which ``OPTIMIZER_STEP_OVERHEAD_S`` already counts.
# The hooks run on the host between kernel launches while the GPU works through its queue, so
# they cost a micro step only what they take beyond its GPU work (``exposed_hook_seconds``). The
# fixed cost per micro step above is not hidden that way: transformers' Trainer waits for each
# micro step's loss (trainer.py ``_inner_training_loop``: ``torch.isnan(tr_loss_step)`` under
# ``logging_nan_inf_filter``, on by default), so the next micro step's data loading and input
# preparation start on an idle GPU.
GRAD_HOOK_S_PER_TENSOR = 0.00014
STAGE3_FETCH_S_PER_MODULE = 0.00030
# ZeRO-3's host cost per module pass under each DeepSpeed release, as a share of 0.19's: the
# medians of the CPU measurement above (default persistence; 29, 41, 37 and 60 us)
STAGE3_HOOK_COST_BY_DEEPSPEED = {"0.12": 29 / 60, "0.14": 41 / 60, "0.16": 37 / 60, "0.19": 1.0}
RECOMPUTE_HOST_S_PER_LAYER = 0.002

# Pinned host<->GPU copies reach ~25 GB/s of PCIe Gen4 x16's 32 GB/s per direction (DeepSpeed
# offloads through pinned buffers: runtime/zero/offload_config.py ``pin_memory``).
PCIE_OFFLOAD_GBPS = 25.0

# DeepSpeed CPUAdam (deepspeed/ops/adam/cpu_adam.py ``DeepSpeedCPUAdam.step`` ->
# ops/csrc/adam/cpu_adam_impl.cpp ``Adam_Optimizer::Step_8`` -> ``Step_AVX``) streams, per
# parameter, the fp32 master, grad, exp_avg and exp_avg_sq in and the master and both states
# out: 28 bytes, and the 16-bit copy for the GPU, 2 more. Effective host memory bandwidth per
# node, 27 GB/s: the DeepSpeed issue 6695 rows (ds6695-llama2-0.3b-offload-cpu 0.31 s and
# ds6695-llama2-1.2b-offload-cpu 1.5 s per optimizer step: 29 and 24 GB/s at 30 bytes per
# parameter, 27 GB/s their mean); ZenFlow's core-binding rows agree
# (zenflow-bind-qwen2.5-3b-a100-40gbx2-offload*: 2.5-2.9 s whole steps for 3.1B parameters, at
# most ~35 GB/s). A server's STREAM bandwidth is higher (100-300 GB/s); CPUAdam's vector loop
# with the OpenMP threads DeepSpeed starts does not reach it.
CPU_ADAM_HOST_GBPS = 27.0
CPU_ADAM_BYTES_PER_PARAM = 30

# fused / foreach Adam on the GPU: per trainable parameter of this rank's partition, fp32 master,
# exp_avg and exp_avg_sq read and written (24), the fp32 gradient read (4), the 16-bit weight
# written (2). torch/optim/adam.py ``_fused_adam`` / ``_multi_tensor_adam`` (AdamW runs them with
# decoupled weight decay); DeepSpeed's FusedAdam (deepspeed/ops/adam/fused_adam.py) the same.
GPU_ADAM_BYTES_PER_PARAM = 30

# NCCL's ring reaches ~80 % of a link's datasheet bandwidth (nccl-tests' bus bandwidth on
# NVLink and InfiniBand); the same share is taken of every link.
LINK_EFFICIENCY = 0.8

# inter-node bandwidth when the caller gives none: 100 Gbit/s per node (one HDR/EDR InfiniBand or
# 100 GbE NIC), the common small-cluster case.
DEFAULT_INTER_NODE_GBITS = 100.0


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step, by term, and the rates they give."""

    compute_s: float
    recompute_s: float
    exposed_comm_s: float
    offload_transfer_s: float
    cpu_optimizer_s: float
    gpu_optimizer_s: float
    overhead_s: float
    total_s: float
    tokens_per_s_per_gpu: float
    mfu: float  # model FLOPs (no recompute) per second over the GPU's dense 16-bit peak
    # GRPO's rollout (speed/generation.py); None for workloads that generate nothing
    generation_s: float | None = None
    # QLoRA's 4-bit base: its dequantizations and peft's clones on the GPU, and their host calls
    # beyond what the GPU hides (speed/quantization.py); None for lora and full fine-tunes
    dequantize_s: float | None = None

    def breakdown(self) -> dict[str, float]:
        """The terms that add up to ``total_s``, rounded for reports (``generation_s`` only
        where the workload generates)."""
        terms = {
            "compute_s": self.compute_s,
            "recompute_s": self.recompute_s,
            "exposed_comm_s": self.exposed_comm_s,
            "offload_transfer_s": self.offload_transfer_s,
            "cpu_optimizer_s": self.cpu_optimizer_s,
            "gpu_optimizer_s": self.gpu_optimizer_s,
            "overhead_s": self.overhead_s,
        }
        if self.generation_s is not None:
            terms["generation_s"] = self.generation_s
        if self.dequantize_s is not None:
            terms["dequantize_s"] = self.dequantize_s
        return {name: round(value, 4) for name, value in terms.items()}


def gpu_generation(gpu: GpuSpec) -> str:
    """The efficiency curve's key for a catalog GPU."""
    key = gpu.key.upper()
    if key.startswith("B"):
        return "blackwell"
    if is_hopper(key):
        return "hopper"
    if key.startswith(("A100", "A800")):
        return "ampere"
    return "other"


# cuBLAS's bf16 matmul on a lent H100 SXM (torch 2.11.0+cu130; 20 products after 3 warm-ups) at
# 7-8B models' shapes, tokens x in x out: 16384 x 3584 x 18944 and its transpose, 4096 x 4096 x
# 14336, 8192 x 4096 x 4096, 16384 x 3584 x 152064: 708-749 TFLOP/s of 989, median 722 (0.73;
# 8192 cubed 789). A measured rate, not fitted.
HOPPER_MATMUL_EFFICIENCY = 0.73
HOPPER_REFERENCE_GPU = "H100-SXM"  # the part EFFICIENCY["hopper"] was fitted on


def hopper_efficiency(gpu: GpuSpec) -> EfficiencyCurve:
    """The Hopper curve moved to ``gpu``'s balance of tensor peak and HBM bandwidth.

    ``EFFICIENCY["hopper"]`` (0.45 of the dense peak) was fitted on H100 SXM rows, where a step's
    matmuls run at ``HOPPER_MATMUL_EFFICIENCY`` and the rest of its time (attention's softmax
    and elementwise work, norms, activations, the loss: memory-bound) is what brings the whole
    down to 0.45: per matmul FLOP at peak, 1/0.45 - 1/0.73 = 0.85 units of the rest. The same
    architecture and kernels run that rest at the part's HBM bandwidth, and its matmuls at the
    part's peak, so on a part with ``peak`` TFLOPs and ``hbm`` GB/s the rest weighs
    0.85 x (peak / 989) x (3350 / hbm): an H200 (989 TF, 4.8 TB/s) reaches 0.51, an H20 (148
    TF, 4.0 TB/s: its tensor throughput cut, its memory not) 0.68, where one peak fraction for
    every Hopper part put it at 0.45 (ms-swift's H20 rows, swift-qwen2.5-7b-h20x4-z3-flash and
    -flash3: 4 x 16384 packed tokens per GPU of Qwen2.5-7B with checkpointing in 35.5 and 32.4
    s, 0.69 and 0.76 of the peak in the FLOPs outside attention alone)."""
    from zerofit.hardware import lookup

    curve = EFFICIENCY["hopper"]
    reference = lookup(HOPPER_REFERENCE_GPU)
    matmul = HOPPER_MATMUL_EFFICIENCY
    rest_at_reference = 1 / curve.peak_fraction - 1 / matmul
    rest = rest_at_reference * (gpu.bf16_tflops / reference.bf16_tflops)
    rest *= reference.hbm_gbps / gpu.hbm_gbps
    return EfficiencyCurve(peak_fraction=1 / (1 / matmul + rest), half_tokens=curve.half_tokens)


def efficiency_curve(gpu: GpuSpec) -> EfficiencyCurve:
    """``gpu``'s achieved-efficiency curve: its generation's, a Hopper part's moved to its balance
    of peak and bandwidth (``hopper_efficiency``)."""
    generation = gpu_generation(gpu)
    if generation == "hopper":
        return hopper_efficiency(gpu)
    return EFFICIENCY[generation]


def compute_efficiency(gpu: GpuSpec, tokens_per_micro_step: int) -> float:
    """Achieved fraction of ``gpu``'s dense peak at this many tokens per micro step per GPU."""
    return efficiency_curve(gpu).at(tokens_per_micro_step)


def gpu_profile(gpu: GpuSpec, deepspeed_version: str = "0.19") -> DeviceProfile:
    """A catalog GPU as the model's device: its datasheet rates and the constants above, fitted
    on public GPU runs (speed/device.py ``cpu_profile`` is the measured CPU counterpart).
    ``deepspeed_version``: the DeepSpeed release ("0.12" ... "0.19") whose ZeRO-3 hooks the run
    pays (``STAGE3_HOOK_COST_BY_DEEPSPEED``); zerofit's configs are for 0.19."""
    if deepspeed_version not in STAGE3_HOOK_COST_BY_DEEPSPEED:
        known = ", ".join(STAGE3_HOOK_COST_BY_DEEPSPEED)
        raise ValueError(f"deepspeed_version {deepspeed_version!r}: measured for {known} only")
    fetch = STAGE3_FETCH_S_PER_MODULE * STAGE3_HOOK_COST_BY_DEEPSPEED[deepspeed_version]
    return DeviceProfile(
        name=gpu.key,
        peak_tflops=gpu.bf16_tflops,
        efficiency=efficiency_curve(gpu),
        memory_gbps=gpu.hbm_gbps,
        link_gbps=gpu.link_gbps,
        offload_gbps=PCIE_OFFLOAD_GBPS,
        cpu_adam_host_gbps=CPU_ADAM_HOST_GBPS,
        micro_step_overhead_s=MICRO_STEP_OVERHEAD_S,
        optimizer_step_overhead_s=OPTIMIZER_STEP_OVERHEAD_S,
        grad_hook_s_per_tensor=GRAD_HOOK_S_PER_TENSOR,
        stage3_fetch_s_per_module=fetch,
        recompute_host_s_per_layer=RECOMPUTE_HOST_S_PER_LAYER,
        link_efficiency=LINK_EFFICIENCY,
        memory_gib=gpu.memory_gib,
        dequantize_host_s_per_call=DEQUANTIZE_HOST_S_PER_CALL,
    )


@dataclass(frozen=True)
class Links:
    """Bandwidths in GB/s (bytes) a ring collective sees."""

    intra_node_gbps: float
    inter_node_gbps: float  # the node's whole network, bytes/s / 1e9
    efficiency: float = LINK_EFFICIENCY  # the share of either a ring reaches (DeviceProfile)
    # bytes per element the collectives carry: 2 for the GPU model, the compute dtype's on a
    # device whose ``wire_bytes_follow_precision`` (an fp32 CPU run: 4)
    element_bytes: int = 2
    # the library's reduce-scatter and all-gather over a ring's seconds (DeviceProfile)
    reduce_scatter_cost: float = 1.0
    all_gather_cost: float = 1.0

    def ring_gbps(self, setup: TrainSetup) -> float:
        """The slowest link bounds a ring: inside one node the GPUs' link; across nodes the
        node's network too (NCCL runs one ring per NIC, so a node's NICs add up)."""
        intra = self.intra_node_gbps * self.efficiency
        if setup.world_size <= setup.gpus_per_node:
            return intra
        return min(intra, self.inter_node_gbps * self.efficiency)


def ring_seconds(bytes_per_rank: float, ranks: int, bandwidth_gbps: float) -> float:
    """Seconds of a ring reduce-scatter or all-gather of ``bytes_per_rank`` (the whole buffer)
    over ``ranks``: each rank sends (n-1)/n of it (an all-reduce is two of these)."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * bytes_per_rank / (bandwidth_gbps * 1e9)


@dataclass(frozen=True)
class CommSeconds:
    """A step's collectives: what overlaps forward, what overlaps backward, what follows."""

    during_forward: float
    during_backward: float
    after_step: float


def communication_seconds(
    setup: TrainSetup, model: ModelSpec, links: Links, trainable: int
) -> CommSeconds:
    """The collectives one optimizer step issues, per ZeRO stage as DeepSpeed issues them.

    - stage 0: DDP all-reduces the gradients once per step, during the last micro step's
      backward (torch/nn/parallel/distributed.py ``DistributedDataParallel`` buckets under
      ``no_sync`` until the accumulation boundary; DeepSpeed's engine likewise only at
      ``is_gradient_accumulation_boundary``: runtime/engine.py ``allreduce_gradients``).
    - stage 1: gradients reduced at the boundary, the updated 16-bit partitions all-gathered
      after the step (runtime/zero/stage_1_and_2.py ``DeepSpeedZeroOptimizer.reduce_gradients``
      then ``step`` -> runtime/utils.py ``all_gather_dp_groups``). The reduction is a whole
      all-reduce of each bucket, not a reduce-scatter: ``average_tensor`` sends every slice to
      ``allreduce_and_scatter`` while ``use_multi_rank_bucket_allreduce`` (runtime/zero/config.py
      ``DeepSpeedZeroConfig``, default True) holds, and each rank keeps its partition of the sum.
    - stage 2: the same, but gradients are reduced in every micro step's backward as buckets
      fill (stage_1_and_2.py ``reduce_independent_p_g_buckets_and_remove_grads`` ->
      ``average_tensor``), since a rank keeps only its partition.
    - stage 3: every micro step all-gathers the parameters in forward and again in backward
      those forward released (``stage3_backward_gather_elements``)
      (runtime/zero/partitioned_param_coordinator.py ``fetch_sub_module`` ->
      partition_parameters.py ``Init``'s ``all_gather_coalesced``) and reduce-scatters the
      gradients (stage3.py ``DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition_ipg_grads`` ->
      ``reduce_scatter_coalesced``); frozen weights are gathered all the same. ZeRO++ changes
      which links these cross and how many bytes they carry (``zero_plus_communication_seconds``).
    """
    if setup.stage == 3 and setup.zero_plus != "none":
        return zero_plus_communication_seconds(setup, model, links, trainable)
    ranks = setup.world_size
    bandwidth = links.ring_gbps(setup)
    # 16-bit gradients and parameters (DeepSpeed reduces and gathers in the compute dtype)
    grad_bytes = trainable * links.element_bytes
    param_bytes = model.params * links.element_bytes
    micro_steps = setup.grad_accum
    all_reduce = 2 * ring_seconds(grad_bytes, ranks, bandwidth)
    if setup.stage == 0:
        return CommSeconds(0.0, all_reduce, 0.0)
    gather_trainable = ring_seconds(grad_bytes, ranks, bandwidth) * links.all_gather_cost
    if setup.stage == 1:
        return CommSeconds(0.0, all_reduce, gather_trainable)
    if setup.stage == 2:
        return CommSeconds(0.0, micro_steps * all_reduce, gather_trainable)
    reduce_scatter = ring_seconds(grad_bytes, ranks, bandwidth) * links.reduce_scatter_cost
    gather = ring_seconds(param_bytes, ranks, bandwidth) * links.all_gather_cost
    regather_bytes = stage3_backward_gather_elements(setup, model) * links.element_bytes
    regather = ring_seconds(regather_bytes, ranks, bandwidth) * links.all_gather_cost
    return CommSeconds(micro_steps * gather, micro_steps * (regather + reduce_scatter), 0.0)


def stage3_backward_gather_elements(setup: TrainSetup, model: ModelSpec) -> int:
    """Parameters ZeRO-3 gathers again in backward: all but those forward kept gathered because
    they come back within ``stage3_max_reuse_distance`` of the recorded fetch order
    (partitioned_param_coordinator.py ``__params_to_release``, counted by
    memory/param_layout.py ``zero3_kept_gathered_elements``). With DeepSpeed's default distance
    (1e9 elements) a model under ~0.5B parameters is gathered once per micro step, not twice."""
    reuse = int(setup.bucket_sizes(model.hidden_size).get("stage3_max_reuse_distance", 10**9))
    kept = zero3_kept_gathered_elements(model, reuse, setup.gradient_checkpointing)
    return max(0, model.params - kept)


# qwZ's bytes per gathered element: int8 weights and one fp32 scale per group of at most 8,000
# (partition_parameters.py ``CUDAQuantizer.quantize``, ``target_group_size = 8000``).
QWZ_BYTES_PER_ELEMENT = 1 + 4 / 8000
# qgZ's bytes per gradient element: int4 (coalesced_collectives.py ``all_to_all_quant_reduce``:
# ``swizzle_quant(tensor, ..., 4, ...)``), scales left out (one per row or column group).
QGZ_BYTES_PER_ELEMENT = 0.5


def zero_plus_communication_seconds(
    setup: TrainSetup, model: ModelSpec, links: Links, trainable: int
) -> CommSeconds:
    """ZeRO-3's collectives under ZeRO++ (planning/options.py, or any of hpz, qwz, qgz from a
    user's file: memory/ds_config.py ``read_zero_block``), as DeepSpeed 0.19 issues them.

    - hpZ: forward releases each parameter into a second shard inside the node
      (partition_parameters.py ``Init._partition_param_sec``), and every later all-gather of it
      reads that shard over the node's ring (a parameter's ``all_gather_coalesced``, set by
      ``Init._convert_to_deepspeed_param``: ``use_secondary_tensor`` ->
      ``zero_param_process_group``) until the optimizer step drops it (stage3.py
      ``_post_step`` -> ``invalidate_secondary_tensor``). So only the first micro step's forward
      gathers across nodes; backward's and the later micro steps' forward gathers stay inside
      the node.
      Backward gathers again only what forward released, as without hpZ
      (``stage3_backward_gather_elements``): each rank's secondary shard holds 1/L of a
      parameter, and the node's all-gather of those shards sends (L-1)/L of the released
      parameters to each rank, not of the whole model.
    - qwZ: every all-gather, the node's included, sends int8 weights and fp32 group scales
      instead of 16-bit weights (``_all_gather_coalesced`` with ``quantize``).
    - qgZ: the gradients of 2-D weights leave through an int4 all-to-all inside the node, a local
      reduction, and an int4 all-to-all between the nodes (coalesced_collectives.py
      ``all_to_all_quant_reduce``, called by stage3.py ``__avg_scatter_grads`` only when
      ``num_nodes > 1``): each GPU sends (L-1)/L of its gradient over the node's link, each node
      (N-1)/N of one gradient's worth over its network, both in int4, where the ring
      reduce-scatter sends (W-1)/W of 16-bit gradients through the network: about 4x fewer bytes
      between nodes.
    """
    ranks = setup.world_size
    per_node = max(1, min(setup.gpus_per_node, ranks))
    nodes = math.ceil(ranks / per_node)
    intra = links.intra_node_gbps * links.efficiency
    network = links.inter_node_gbps * links.efficiency
    world = links.ring_gbps(setup)
    micro_steps = setup.grad_accum
    weight_bytes = QWZ_BYTES_PER_ELEMENT if "qwz" in setup.zero_plus else links.element_bytes
    world_gather = ring_seconds(model.params * weight_bytes, ranks, world)
    node_gather = ring_seconds(model.params * weight_bytes, per_node, intra)
    if "qgz" in setup.zero_plus and nodes > 1:
        grad_bytes = trainable * QGZ_BYTES_PER_ELEMENT
        reduce = ring_seconds(grad_bytes, per_node, intra) + ring_seconds(
            grad_bytes, nodes, network
        )
    else:
        reduce = ring_seconds(trainable * links.element_bytes, ranks, world)
    regather_elements = stage3_backward_gather_elements(setup, model)
    if not setup.zero_plus.startswith("hpz"):  # qwZ / qgZ alone: every gather crosses nodes
        world_regather = ring_seconds(regather_elements * weight_bytes, ranks, world)
        return CommSeconds(micro_steps * world_gather, micro_steps * (world_regather + reduce), 0)
    node_regather = ring_seconds(regather_elements * weight_bytes, per_node, intra)
    forward = world_gather + (micro_steps - 1) * node_gather
    return CommSeconds(forward, micro_steps * (node_regather + reduce), 0.0)


def offload_seconds(
    setup: TrainSetup, model: ModelSpec, trainable: int, device: DeviceProfile
) -> tuple[float, float]:
    """(PCIe transfer seconds, CPUAdam seconds) of one step's optimizer / parameter offload on
    ``device`` (its offload link and its host's CPUAdam rate).

    Optimizer offload: each micro step copies this rank's gradient partition to the host in the
    16-bit compute dtype (stage_1_and_2.py ``async_accumulate_grad_in_cpu_via_gpu``: a pinned
    buffer of ``param.dtype``; stage3.py ``DeepSpeedZeroOptimizer_Stage3.partition_grads``), the
    step copies the updated 16-bit partition back; CPUAdam then steps every partition of the
    node.
    Parameter offload (stage 3): every micro step brings each partition over twice, forward and
    backward (partitioned_param_coordinator.py ``fetch_sub_module`` from the host copy).
    """
    element_bytes = wire_element_bytes(setup, device)
    ranks = setup.world_size
    transfer_bytes = 0.0
    cpu_adam = 0.0
    if setup.offload_optimizer != "none":
        partition = trainable / ranks
        transfer_bytes += setup.grad_accum * partition * element_bytes + partition * element_bytes
        params_on_node = trainable * min(setup.gpus_per_node, ranks) / ranks
        cpu_adam = params_on_node * CPU_ADAM_BYTES_PER_PARAM / (device.cpu_adam_host_gbps * 1e9)
    if setup.offload_param != "none" and setup.stage == 3:
        transfer_bytes += setup.grad_accum * 2 * (model.params / ranks) * element_bytes
    return transfer_bytes / (device.offload_gbps * 1e9), cpu_adam


def gpu_optimizer_seconds(
    setup: TrainSetup, gpu: GpuSpec | DeviceProfile, trainable: int
) -> float:
    """The optimizer step on the GPU, HBM-bound: this rank's trainable partition's bytes; on a
    device whose optimizer rate is measured (``DeviceProfile.optimizer_params_per_s``: a CPU
    rank's torch AdamW), its parameters at that rate."""
    if setup.offload_optimizer != "none":
        return 0.0
    device = as_device(gpu)
    partition = trainable if setup.stage == 0 else trainable / setup.world_size
    if device.optimizer_params_per_s:
        return partition / device.optimizer_params_per_s
    return partition * GPU_ADAM_BYTES_PER_PARAM / (device.memory_gbps * 1e9)


def as_device(gpu: GpuSpec | DeviceProfile) -> DeviceProfile:
    """A catalog GPU's profile, or the profile given."""
    return gpu if isinstance(gpu, DeviceProfile) else gpu_profile(gpu)


def wire_element_bytes(setup: TrainSetup, device: DeviceProfile) -> int:
    """Bytes per element of gradients and parameters on the wire and over the offload link."""
    return DTYPE_BYTES[setup.precision] if device.wire_bytes_follow_precision else 2


def exposed_communication_seconds(
    setup: TrainSetup,
    device: DeviceProfile,
    comm: CommSeconds,
    *,
    forward_s: float,
    backward_s: float,
) -> float:
    """What of ``comm`` the step waits for: ZeRO-3's prefetched gathers hide behind forward,
    the backward's collectives behind backward under ``overlap_comm`` (stage 0: DDP's buckets
    always), the step's all-gather behind nothing. On a device that does not overlap
    (``DeviceProfile.overlaps_comm`` False) every collective is waited for."""
    if not device.overlaps_comm:
        return comm.during_forward + comm.during_backward + comm.after_step
    if setup.stage == 3:  # the coordinator prefetches: gathers overlap the compute
        exposed_forward = max(0.0, comm.during_forward - forward_s)
    else:
        exposed_forward = comm.during_forward
    hidden_by_backward = backward_s if setup.overlap_comm or setup.stage == 0 else 0
    exposed_backward = max(0.0, comm.during_backward - hidden_by_backward)
    return exposed_forward + exposed_backward + comm.after_step


# FlashAttention-3 on Hopper against FlashAttention-2, the kernel the efficiency curves were
# fitted under (the public rows run flash-attention 2 or SDPA's flash backend): 1.5-2.0x its
# forward and 1.5-1.75x its backward (Shah et al. 2024, "FlashAttention-3", arXiv 2407.08608,
# section 4.1, bf16 at head dim 64-256); the middle of each range. Datasheet-like ratios, not
# fitted on any row. transformers runs it as ``attn_implementation="flash_attention_3"``.
FLASH_ATTENTION_3_SPEEDUP = {"forward": 1.75, "backward": 1.6}


def attention_kernel_savings(
    setup: TrainSetup,
    model: ModelSpec,
    device: DeviceProfile,
    sequences: int,
    sample_len: int | None = None,
) -> StepFlops:
    """FLOPs' worth of time one micro step's attention saves under FlashAttention-3 on a Hopper
    GPU (``FLASH_ATTENTION_3_SPEEDUP``); nothing for any other kernel or device. The backward
    of the products is two forwards' worth (speed/flops.py), checkpointing's recompute one.
    ``sample_len``: packed samples the kernel keeps apart (``attention_sample_len``)."""
    if setup.attention != "flash_attention_3" or not is_hopper(device.name):
        return StepFlops(forward=0.0, backward=0.0, recompute=0.0)
    terms = forward_flops_per_sequence(model, setup.seq_len, setup.target_len, sample_len)
    attention = terms["attention"] * sequences
    forward_saved = attention * (1 - 1 / FLASH_ATTENTION_3_SPEEDUP["forward"])
    backward_saved = 2 * attention * (1 - 1 / FLASH_ATTENTION_3_SPEEDUP["backward"])
    recompute_saved = forward_saved if setup.gradient_checkpointing else 0.0
    return StepFlops(forward=forward_saved, backward=backward_saved, recompute=recompute_saved)


# Attention kernels that run each packed sample apart when given the samples' boundaries:
# transformers' ``_flash_attention_forward`` (modeling_flash_attention_utils.py) calls
# ``flash_varlen_fn`` with ``cu_seqlens`` when the batch carries them (TRL's padding-free
# collator, trl/trainer/sft_trainer.py ``DataCollatorForLanguageModeling``: ``cu_seq_lens_q``)
# or when ``_is_packed_sequence`` reads restarting position_ids; the varlen kernel computes each
# sample's causal block alone. SDPA is not here: for packed position_ids transformers builds a
# dense block-diagonal mask (masking_utils.py ``find_packed_sequence_indices`` ->
# ``packed_sequence_mask_function``, ``allow_is_causal_skip = False``), a non-null ``attn_mask``
# that rules out SDPA's flash kernel (PyTorch sdp_utils.cpp ``check_for_attn_mask``), and the
# kernel that takes the mask computes every block of the row, masked or not. Eager's matmuls
# likewise compute the whole row.
SAMPLE_BOUNDED_ATTENTION = ("flash_attention_2", "flash_attention_3")


def attention_sample_len(setup: TrainSetup, sample_len: int | None) -> int | None:
    """The mean length of the packed samples whose attention the kernel keeps apart, or None:
    the products span the whole row (no packing given, padded rows, a sample as long as the
    row, or a kernel that computes across samples: ``SAMPLE_BOUNDED_ATTENTION``)."""
    if sample_len is None or setup.padded or sample_len >= setup.seq_len:
        return None
    if setup.attention not in SAMPLE_BOUNDED_ATTENTION:
        return None
    return sample_len


# Which kernels skip the blocks a decoder's causal mask hides, and so run half the seq x seq
# products (speed/flops.py ``skips_masked_blocks``):
# - flash-attention 2 and 3 always: transformers passes ``causal=True`` and, on a padded batch,
#   unpads to the varlen kernel (modeling_flash_attention_utils.py ``_flash_attention_forward``,
#   ``_upad_input``; masking_utils.py ``flash_attention_mask`` keeps only the 2D padding mask).
#   Its products then cover the real tokens only, sum L_i^2 / 2 <= seq_len^2 / 2 per row; the
#   speed model keeps seq_len^2 / 2, as it does not know the samples' lengths under padding.
# - SDPA without a mask: transformers drops an all-ones mask (masking_utils.py ``sdpa_mask``,
#   ``_ignore_causal_mask_sdpa``) and calls torch's SDPA with ``is_causal=True``
#   (integrations/sdpa_attention.py ``sdpa_attention_forward``: ``is_causal = q_length > 1 and
#   attention_mask is None and is_causal``), which its flash and memory-efficient kernels honour
#   by stopping each query block's key loop at the diagonal (mem_eff_attention/kernel_forward.h:
#   ``num_keys`` cut to ``query_start + kQueriesPerBlock`` for the causal ``custom_mask_type``).
# - SDPA on a padded batch does not: the mask has zeros, so transformers passes the 4D boolean
#   mask and ``is_causal=False``; a non-null ``attn_mask`` rules out the flash kernel (torch
#   sdp_utils_cpp.h ``check_for_attn_mask``), and the kernel that takes the mask computes the
#   whole square. The memory-efficient kernel runs with ``NoCustomMask`` (attention.cu
#   ``_scaled_dot_product_efficient_attention_cuda``: the causal mask type only when
#   ``is_causal``), loops over every key block and adds the mask as a bias tile by tile
#   (kernel_forward.h, ``attn_bias_ptr``); on Hopper, torch 2.11 picks cuDNN attention for the
#   masked call instead (``torch._fused_sdp_choice`` on an H200), which reached 0.53-0.64 of its
#   own unmasked rate on the same square (benchmarks/sdpa_masked_attention.py): that lower rate
#   is not counted.
# - eager never does: ``eager_attention_forward`` (models/llama/modeling_llama.py) runs
#   ``torch.matmul(query, key.transpose(2, 3))`` over the whole square, adds the mask, then
#   multiplies the whole probability matrix by V, padded or not.
# - a model class without the kernel asked for runs eager: transformers loads a class without
#   ``_supports_sdpa`` with eager when no implementation is named (modeling_utils.py
#   ``_check_and_adjust_attn_implementation`` -> ``get_correct_attn_implementation``: sdpa is the
#   default, eager where ``_sdpa_can_dispatch`` refuses; named, sdpa refuses to load). Gemma2
#   has ``_supports_sdpa = False`` (sdpa cannot soft-cap). The memory model traces that class
#   and says so (memory/activations.py ``activations_basis``: ``traced_eager``); the speed model
#   counts what it says runs (``runs_eager_attention``).
CAUSAL_SKIPPING_ATTENTION = ("flash_attention_2", "flash_attention_3")


def attention_skips_masked_blocks(setup: TrainSetup, model: ModelSpec | None = None) -> bool:
    """Whether the setup's attention kernel skips the blocks the causal mask hides (half the
    seq x seq products) rather than computing the whole square: flash-attention always, SDPA
    on unpadded batches only (``setup.padded``: memory/estimate.py), eager never, nor a
    ``model`` whose class transformers runs eager whatever was asked
    (``runs_eager_attention``; None: the kernel asked runs)."""
    if setup.attention in CAUSAL_SKIPPING_ATTENTION:
        skips = True
    elif setup.attention == "sdpa":
        skips = not setup.padded
    else:
        return False
    return skips and (model is None or not runs_eager_attention(setup, model))


def runs_eager_attention(setup: TrainSetup, model: ModelSpec) -> bool:
    """Whether transformers runs eager attention for ``model`` where ``setup.attention`` asks for
    a kernel: the memory model's traced layer found no kernel of that kind in the model class
    (memory/activations.py ``activations_basis``, asked as memory/estimate.py asks it, so the
    trace is the one the memory estimate made). Formula families, which all have sdpa and flash,
    and untraced models (no config.json, remote code) keep the kernel asked."""
    sizes = step_sizes(model, setup)
    basis = activations_basis(model, sizes.compute_bytes, setup.attention, sizes.residual_bytes)
    return basis.startswith("traced_eager")


def layer_submodules(model: ModelSpec) -> int:
    """Modules of one decoder layer: its linear layers (memory/lora.py ``layer_linear_shapes``),
    two norms, the attention and MLP containers, the activation and the layer itself."""
    return len(layer_linear_shapes(model)) + 6


# Modules PEFT adds under each adapted linear that run in every forward: peft/tuners/lora/
# layer.py ``Linear.forward`` calls ``self.base_layer(x)``, then per active adapter
# ``lora_dropout[name]`` (``nn.Dropout``, or ``nn.Identity`` at dropout 0), ``lora_A[name]`` and
# ``lora_B[name]``; the wrapper takes the replaced linear's place. ZeRO-3 hooks them all
# (parameter_offload.py ``_register_deepspeed_module`` recurses into every child); the
# ``ModuleDict``s holding them are never called, so their hooks never fire. Above the model,
# peft/peft_model.py ``PeftModelForCausalLM`` is one more called module (its ``LoraModel``
# hands the call to the model's ``forward``: no hook of its own fires). Counted on peft 0.21.2:
# a two-layer Qwen2 fires 32 pre-forward hooks plain and 89 = 32 + 4 x 14 + 1 with its 14
# linears adapted (tests/speed/test_step_time.py).
PEFT_CALLED_MODULES_PER_ADAPTED_LINEAR = 4


def adapted_linears(model: ModelSpec, setup: TrainSetup) -> int:
    """Linear layers PEFT wraps with an adapter (memory/lora.py ``targeted_modules``: those in
    every decoder layer, and the LM head or embedding outside them); 0 without adapters."""
    if not is_adapter(setup):
        return 0
    targets = targeted_modules(model, setup.lora_targets)
    inside = sum(1 for name in targets if name not in OUTSIDE_LAYERS)
    return inside * model.num_layers + len(targets) - inside


def zero3_hooked_modules(model: ModelSpec, setup: TrainSetup | None = None) -> int:
    """Every module ZeRO-3 hooks and a forward calls (parameter_offload.py
    ``_register_deepspeed_module`` recurses into all children): the layers' and, outside them,
    the root, the decoder, the embedding, the final norm, the rotary embedding and the LM head;
    under ``setup``'s adapters, PEFT's modules inside each adapted linear and its model
    wrapper too (``PEFT_CALLED_MODULES_PER_ADAPTED_LINEAR``)."""
    modules = model.num_layers * layer_submodules(model) + 6
    adapted = 0 if setup is None else adapted_linears(model, setup)
    if adapted:
        modules += PEFT_CALLED_MODULES_PER_ADAPTED_LINEAR * adapted + 1
    return modules


def trainable_tensors(model: ModelSpec, setup: TrainSetup, trainable: int) -> int:
    """Parameter tensors that get a gradient hook: each adapter's A and B under LoRA
    (memory/lora.py ``targeted_modules``; adapters known only by their count: one pair per
    linear layer), else every linear weight and both norms of each layer, the embedding, the
    final norm and an untied LM head."""
    linears = len(layer_linear_shapes(model))
    if is_adapter(setup):
        return 2 * adapted_linears(model, setup)
    if trainable < model.params:
        return 2 * linears * model.num_layers
    return model.num_layers * (linears + 2) + 2 + (0 if model.tie_embeddings else 1)


def hook_seconds(
    setup: TrainSetup,
    model: ModelSpec,
    device: DeviceProfile,
    trainable: int,
    *,
    boundary: bool = True,
) -> float:
    """Host seconds of DeepSpeed's hooks in one micro step (``boundary``: the last of the
    optimizer step's micro steps): the counts above times the device's per-item costs
    (``GRAD_HOOK_S_PER_TENSOR``, ``STAGE3_FETCH_S_PER_MODULE``).

    Gradient hooks run where ZeRO reduces gradients as backward makes them: stages 2 and 3, and
    stage 1 under ``overlap_comm`` (stage_1_and_2.py ``DeepSpeedZeroOptimizer.__init__``:
    ``if self.partition_gradients or self.overlap_comm``, then
    ``create_reduce_and_remove_grad_hooks``); stage 0 reduces at the boundary, no hook per
    tensor. Stage 1's hook does its bucket work only at the accumulation boundary
    (``reduce_ready_partitions_and_remove_grads``: ``if self.partition_gradients or
    self.is_gradient_accumulation_boundary()``); before it, autograd accumulates into
    ``param.grad`` and the hook returns. ZeRO-3 fetches and releases each module in forward, in
    backward, and in checkpointing's recompute (the recomputed forward calls the pre-forward
    hooks again)."""
    if setup.stage == 0:
        return 0.0
    seconds = 0.0
    reduces_now = setup.stage >= 2 or (setup.overlap_comm and boundary)
    if reduces_now:
        seconds += trainable_tensors(model, setup, trainable) * device.grad_hook_s_per_tensor
    if setup.stage == 3:
        passes = 3 if setup.gradient_checkpointing else 2
        seconds += passes * zero3_hooked_modules(model, setup) * device.stage3_fetch_s_per_module
    return seconds


def recompute_host_seconds(setup: TrainSetup, model: ModelSpec, device: DeviceProfile) -> float:
    """Host seconds gradient checkpointing adds to one micro step: every decoder layer's forward
    is dispatched again inside backward (transformers' modeling_layers.py
    ``GradientCheckpointingLayer.__call__`` -> torch/utils/checkpoint.py ``checkpoint``: the
    reentrant ``CheckpointFunction.backward`` re-runs the layer's Python forward and a nested
    ``torch.autograd.backward``), the device's ``recompute_host_s_per_layer`` each (a catalog
    GPU's ``RECOMPUTE_HOST_S_PER_LAYER``; 0 for a measured CPU, speed/device.py ``cpu_profile``,
    whose measured rates hold its host time already)."""
    if not setup.gradient_checkpointing:
        return 0.0
    return model.num_layers * device.recompute_host_s_per_layer


def exposed_hook_seconds(
    setup: TrainSetup,
    model: ModelSpec,
    device: DeviceProfile,
    trainable: int,
    gpu_micro_step_s: float,
    *,
    boundary: bool = True,
) -> float:
    """What the hooks add to one micro step (``hooks`` host seconds beside ``gpu`` seconds of
    the micro step's kernels; ``boundary``: the optimizer step's last micro step).

    The host runs the hooks between kernel launches while the GPU works through its queue. On
    one rank ZeRO-3's fetch has no collective to start (partition_parameters.py
    ``all_gather_coalesced``: ``_partition_world_size == 1`` -> ``_no_gather_coalesced``), but
    its handle's wait synchronizes the compute stream (``NoGatherHandle.wait``,
    ``NoGatherCoalescedHandle.wait``: ``current_stream().synchronize()``, in DeepSpeed 0.12.4
    as in 0.19), so the host runs at most one fetched module ahead of the GPU. Each stretch
    between two fetches takes the longer of its host and its GPU time; a decoder's layers are
    alike, so the stretches are too and add up to the longer of the two totals: only
    ``hooks - gpu`` shows (qwen1-1.8b-full-seq256 ... -seq8192 follow it from 2.1 to 5.6 s per
    step; ``hooks + gpu`` would put seq8192 30 % high). Across ranks
    the coordinator lets the host run at most two fetches ahead of the gathers
    (partitioned_param_coordinator.py ``fetch_sub_module``: ``__max_ongoing_fetch_events = 2``,
    ``Event.synchronize``), and the gradient hooks wait on the buckets' reductions, so host
    and GPU take turns module by module: the hooks are hidden in proportion to the GPU's share
    of the pair, ``hooks x gpu / (hooks + gpu)``, leaving ``hooks^2 / (hooks + gpu)``."""
    hooks = hook_seconds(setup, model, device, trainable, boundary=boundary)
    hooks += recompute_host_seconds(setup, model, device)
    if hooks <= 0:
        return 0.0
    if setup.world_size <= 1:
        return max(0.0, hooks - gpu_micro_step_s)
    return hooks * hooks / (hooks + gpu_micro_step_s)


def adapter_elementwise_seconds(
    setup: TrainSetup, model: ModelSpec, device: DeviceProfile, sequences: int
) -> float:
    """One micro step's memory-bound work of PEFT's LoRA path, which the FLOP count leaves out.

    peft/tuners/lora/layer.py ``Linear.forward``: ``result = result + lora_B(lora_A(dropout(x)))
    * scaling`` per targeted module. Per token, in bytes of the compute dtype (``b``): forward,
    dropout reads x and writes its copy and a one-byte mask (in x (2b + 1); nothing at
    ``lora_dropout`` 0, PEFT's ``nn.Identity``), lora_A reads the copy (in x b; its r-wide
    output is negligible), lora_B writes out x b, the scaling reads and writes out x 2b, the
    add reads two and writes one (out x 3b); backward, the scaling's gradient (out x 2b),
    lora_B's input and weight gradients read it (out x 2b), lora_A's input gradient written and
    its weight gradient reading the copy (in x 2b), dropout's backward (in x (2b + 1)) and the
    input gradient added to the base layer's (in x 3b). Checkpointing runs the forward twice.
    At the device's memory bandwidth, at the streaming share generation.py's decode uses
    (``DECODE_HBM_EFFICIENCY``)."""
    if not is_adapter(setup):
        return 0.0
    b = wire_element_bytes(setup, device)
    dropout_bytes = 2 * b + 1 if setup.lora_dropout > 0 else 0
    forward_in, forward_out = dropout_bytes + b, 6 * b
    backward_in, backward_out = 2 * b + dropout_bytes + 3 * b, 4 * b
    passes = 2 if setup.gradient_checkpointing else 1
    per_token = 0.0
    for name, (fan_in, fan_out) in targeted_modules(model, setup.lora_targets).items():
        copies = 1 if name in OUTSIDE_LAYERS else model.num_layers
        module_bytes = passes * (forward_in * fan_in + forward_out * fan_out)
        module_bytes += backward_in * fan_in + backward_out * fan_out
        per_token += copies * module_bytes
    tokens = sequences * setup.seq_len
    return tokens * per_token / (device.memory_gbps * 1e9 * DECODE_HBM_EFFICIENCY)


def qlora_dequantize_seconds(
    setup: TrainSetup,
    model: ModelSpec,
    device: DeviceProfile,
    trainable: int,
    gpu_micro_step_s: float,
) -> float | None:
    """One optimizer step's seconds of QLoRA's 4-bit base (speed/quantization.py
    ``estimate_qlora_base``): its dequantizations' and clones' HBM work in every micro step, and
    its dequantizing calls' host time as far as the micro step's GPU work (``gpu_micro_step_s``
    and that HBM work) does not hide it beyond the host's other work in the micro step: its
    fixed cost, DeepSpeed's hooks and checkpointing's dispatch (speed/quantization.py
    ``exposed_qlora_host_seconds``). None for lora and full fine-tunes."""
    if setup.finetuning != "qlora":
        return None
    trained, _ = sequences_per_micro_step(setup)
    base = estimate_qlora_base(setup, model, device, trained, wire_element_bytes(setup, device))
    gpu_s = gpu_micro_step_s + base.gpu_s
    host_s = device.micro_step_overhead_s + recompute_host_seconds(setup, model, device)
    exposed_s = 0.0
    for boundary, micro_steps in ((False, setup.grad_accum - 1), (True, 1)):
        other_host_s = host_s + hook_seconds(setup, model, device, trainable, boundary=boundary)
        exposed_s += micro_steps * exposed_qlora_host_seconds(base.host_s, other_host_s, gpu_s)
    return setup.grad_accum * base.gpu_s + exposed_s


# adapter targets outside the decoder layers (memory/lora.py ``targeted_modules``)
OUTSIDE_LAYERS = ("lm_head", "embed_tokens")


def sequences_per_micro_step(setup: TrainSetup) -> tuple[int, int]:
    """(sequences through forward and backward, sequences through a no-grad forward): DPO runs
    chosen and rejected together, and the reference model on both unless precomputed."""
    if setup.workload == "dpo":
        return 2 * setup.micro_batch, (2 * setup.micro_batch if setup.uses_reference else 0)
    return setup.micro_batch, 0


def micro_step_flops(
    setup: TrainSetup, model: ModelSpec, trainable: int, sample_len: int | None
) -> tuple[StepFlops, StepFlops]:
    """One micro step's FLOPs: the trained sequences' and the reference model's forward (DPO,
    GRPO; nothing otherwise), counted from ``model``'s terms with attention as the step's kernel
    runs it (``attention_skips_masked_blocks``) over ``sample_len``-token packed samples, and
    the LM head over the positions whose logits the client keeps."""
    trained, reference = sequences_per_micro_step(setup)
    # an encoder-decoder's decoder and LM head run on its targets (``decoder_len``; None: seq_len)
    skips_masked_blocks = attention_skips_masked_blocks(setup, model)
    terms = forward_flops_per_sequence(
        model, setup.seq_len, setup.target_len, sample_len, skips_masked_blocks
    )
    # GRPO under TRL runs the LM head over the completion only, in its forward and backward
    # (generation.py ``scored_logit_positions``); every other workload over every position
    terms = keep_lm_head_positions(terms, setup.seq_len, scored_logit_positions(setup))
    flops = step_flops_from_terms(
        terms,
        sequences=trained,
        gradient_checkpointing=setup.gradient_checkpointing,
        frozen_weights=trainable < model.params,
    )
    return flops, step_flops_from_terms(terms, sequences=reference)


def matmul_seconds(
    setup: TrainSetup,
    model: ModelSpec,
    device: DeviceProfile,
    flops: StepFlops,
    reference_flops: StepFlops,
    sample_len: int | None,
) -> tuple[float, float, float]:
    """Forward (the reference model's included), backward and recompute seconds of one
    optimizer step's micro steps at the efficiency ``device`` reaches on one micro step's
    tokens, less what FlashAttention-3 saves (``attention_kernel_savings``)."""
    trained, _ = sequences_per_micro_step(setup)
    peak = device.peak_tflops * 1e12
    efficiency = device.efficiency.at(trained * setup.seq_len)
    micro_steps = setup.grad_accum
    forward_s = (flops.forward + reference_flops.forward) * micro_steps / (peak * efficiency)
    backward_s = flops.backward * micro_steps / (peak * efficiency)
    recompute_s = flops.recompute * micro_steps / (peak * efficiency)
    saved = attention_kernel_savings(setup, model, device, trained, sample_len)
    forward_s -= saved.forward * micro_steps / (peak * efficiency)
    backward_s -= saved.backward * micro_steps / (peak * efficiency)
    recompute_s -= saved.recompute * micro_steps / (peak * efficiency)
    return forward_s, backward_s, recompute_s


def estimate_step_time(
    setup: TrainSetup,
    model: ModelSpec,
    gpu: GpuSpec | DeviceProfile,
    *,
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBITS,
    intra_node_gbps: float | None = None,
    trainable_params: int | None = None,
    sample_len: int | None = None,
) -> StepTime:
    """Seconds per optimizer step of ``model`` trained as ``setup`` on ``gpu``: a catalog GPU,
    or any device's ``DeviceProfile`` (speed/device.py; a catalog GPU is ``gpu_profile(gpu)``).

    ``inter_node_gbps``: the network of one node in Gbit/s, as NICs are sold (10 for 10GbE, 400
    for one NDR port; a DGX's eight NDR ports: 3200); used only when the job spans nodes.
    ``intra_node_gbps``: the GPUs' link inside a node in GB/s (bytes) per GPU, when the user's
    differs from the catalog's usual one (PCIe cards in an NVLink GPU's place); None: the catalog's.
    ``trainable_params``: LoRA and other adapters (None: every weight trains).
    ``sample_len``: the mean tokens of the samples packed into each row (packing or
    padding-free collation); their attention shrinks where the kernel keeps them apart
    (``attention_sample_len``). None: each row is one sequence.
    Attention's products count the causal half or the whole square as ``setup.attention`` (or
    the eager attention a model class without that kernel runs instead) computes them on
    ``setup.padded`` batches (``attention_skips_masked_blocks``).
    """
    trainable = model.params if trainable_params is None else trainable_params
    trained, _ = sequences_per_micro_step(setup)
    sample_len = attention_sample_len(setup, sample_len)
    flops, reference_flops = micro_step_flops(setup, model, trainable, sample_len)
    device = as_device(gpu)
    peak = device.peak_tflops * 1e12
    micro_steps = setup.grad_accum
    forward_s, backward_s, recompute_s = matmul_seconds(
        setup, model, device, flops, reference_flops, sample_len
    )

    intra = device.link_gbps if intra_node_gbps is None else intra_node_gbps
    links = Links(
        intra,
        inter_node_gbps / 8,
        efficiency=device.link_efficiency,
        element_bytes=wire_element_bytes(setup, device),
        reduce_scatter_cost=device.reduce_scatter_cost,
        all_gather_cost=device.all_gather_cost,
    )
    comm = communication_seconds(setup, model, links, trainable)
    exposed_comm_s = exposed_communication_seconds(
        setup, device, comm, forward_s=forward_s, backward_s=backward_s + recompute_s
    )

    transfer_s, cpu_adam_s = offload_seconds(setup, model, trainable, device)
    gpu_step_s = gpu_optimizer_seconds(setup, device, trainable)
    backward_s += micro_steps * adapter_elementwise_seconds(setup, model, device, trained)
    gpu_micro_step_s = (forward_s + backward_s + recompute_s) / micro_steps
    overhead_s = micro_steps * device.micro_step_overhead_s + device.optimizer_step_overhead_s
    overhead_s += (micro_steps - 1) * exposed_hook_seconds(
        setup, model, device, trainable, gpu_micro_step_s, boundary=False
    ) + exposed_hook_seconds(setup, model, device, trainable, gpu_micro_step_s)
    compute_s = forward_s + backward_s
    generation_s = None
    if setup.workload == "grpo":  # TRL generates before the micro steps that train on it
        generation_s = estimate_generation_time(
            setup, model, gpu, ring_gbps=links.ring_gbps(setup)
        ).total_s
    total_s = (
        compute_s + recompute_s + exposed_comm_s + transfer_s + cpu_adam_s + gpu_step_s
    ) + overhead_s + (generation_s or 0.0)
    dequantize_s = qlora_dequantize_seconds(setup, model, device, trainable, gpu_micro_step_s)
    total_s += dequantize_s or 0.0
    tokens = trained * setup.seq_len * micro_steps
    model_flops = (flops.forward + flops.backward + reference_flops.forward) * micro_steps
    return StepTime(
        compute_s=compute_s,
        recompute_s=recompute_s,
        exposed_comm_s=exposed_comm_s,
        offload_transfer_s=transfer_s,
        cpu_optimizer_s=cpu_adam_s,
        gpu_optimizer_s=gpu_step_s,
        overhead_s=overhead_s,
        total_s=total_s,
        tokens_per_s_per_gpu=tokens / total_s,
        mfu=model_flops / total_s / peak,
        generation_s=generation_s,
        dequantize_s=dequantize_s,
    )
