"""The device a step runs on, as the speed model needs it: a catalog GPU or a measured CPU rank.

``estimate_step_time`` (speed/step_time.py) reads every rate and fixed cost from a
``DeviceProfile``. A catalog GPU's profile (``step_time.gpu_profile``) is its datasheet numbers
with the constants fitted on public GPU runs. A CPU rank's profile (``cpu_profile``) is measured on
the machine the run uses (``measure_cpu_device``), right before the run and in the same processes,
so that a real multi-process DeepSpeed run on CPUs over a shaped network
(benchmarks/shaped_network.py) checks the model's communication, overlap and offload structure,
which GPUs share, with nothing fitted to the run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class EfficiencyCurve:
    """Achieved fraction of the dense peak at ``tokens`` per micro step per GPU:
    ``peak_fraction * tokens / (tokens + half_tokens)``. Small micro batches leave the GPU's
    matmuls too thin to fill it: at ``half_tokens`` it reaches half of ``peak_fraction``."""

    peak_fraction: float
    half_tokens: float

    def at(self, tokens: int) -> float:
        return self.peak_fraction * tokens / (tokens + self.half_tokens)


@dataclass(frozen=True)
class DeviceProfile:
    """Rates and fixed costs of one device (one rank), for ``estimate_step_time``.

    Rates are bytes or FLOPs per second as the model divides by them; bandwidths in GB/s (1e9
    bytes). The two flags say how the device runs the same DeepSpeed code differently.
    """

    name: str
    peak_tflops: float  # dense matmul rate in the compute dtype (the GPU's bf16 datasheet peak)
    efficiency: EfficiencyCurve  # achieved share of the peak by tokens per micro step
    memory_gbps: float  # HBM (the GPU's), or the host's: bounds the optimizer step on the device
    link_gbps: float  # one direction of the link between devices of one node, per device
    offload_gbps: float  # device <-> host copies of offloaded gradients and parameters
    cpu_adam_host_gbps: float  # DeepSpeedCPUAdam's bytes per second over the host's memory
    micro_step_overhead_s: float  # Python, kernel launches, the data loader per micro step
    optimizer_step_overhead_s: float  # gradient norm, clipping, scheduler, logging per step
    # host seconds of DeepSpeed's hooks (step_time.py ``hook_seconds``): each trainable tensor's
    # gradient hook, each ZeRO-3 submodule's fetch and release, per pass of a micro step
    grad_hook_s_per_tensor: float
    stage3_fetch_s_per_module: float
    # host seconds of checkpointing's second dispatch of one decoder layer's forward
    # (step_time.py ``recompute_host_seconds``)
    recompute_host_s_per_layer: float
    link_efficiency: float  # the share of a link's bandwidth a ring collective reaches
    # Collectives run beside the compute (NCCL on its own CUDA streams: overlap_comm, ZeRO-3's
    # prefetch). False: each collective holds the rank until it ends (see cpu_profile).
    overlaps_comm: bool = True
    # Collectives and offload copies carry the compute dtype's bytes (fp32: 4). False: 2 bytes
    # per element whatever the precision, as the GPU constants were fitted (every public row).
    wire_bytes_follow_precision: bool = False
    # Seconds of the collective library's reduce-scatter and all-gather over a ring's at the
    # link's all-reduce bandwidth: NCCL runs both as rings (1.0); gloo's are measured
    # (``CpuMeasurements``): its reduce-scatter costs a whole all-reduce (2.0 on two ranks).
    reduce_scatter_cost: float = 1.0
    all_gather_cost: float = 1.0
    # the device's own memory in GiB (a catalog GPU's), for what must fit beside the training
    # (a colocated vLLM's KV cache); None where unknown (a CPU rank)
    memory_gib: float | None = None
    # parameters per second of the optimizer step that runs on the device, where it is measured
    # (a CPU rank's torch AdamW); None: HBM-bound, step_time.GPU_ADAM_BYTES_PER_PARAM per
    # parameter at ``memory_gbps`` (step_time.py ``gpu_optimizer_seconds``)
    optimizer_params_per_s: float | None = None
    # host seconds each QLoRA dequantizing call adds beyond a 16-bit linear's (speed/
    # quantization.py ``DEQUANTIZE_HOST_S_PER_CALL`` on a catalog GPU); 0 on a measured CPU rank,
    # whose fixed host costs are all left out (``cpu_profile``)
    dequantize_host_s_per_call: float = 0.0


@dataclass(frozen=True)
class CpuMeasurements:
    """One CPU rank's micro-benchmark (``measure_cpu_device``), taken in the run's conditions."""

    matmul_tflops: float  # the model's linear layers at its tokens per micro step
    memory_gbps: float  # a large elementwise add: two streams read, one written
    cpu_adam_params_per_s: float  # DeepSpeedCPUAdam.step over a partition-sized tensor
    link_gbits: float  # between the nodes, from a timed gloo all-reduce
    # ZeRO-3's bucketed reduce-scatter, its copies included, over a ring's at ``link_gbits``
    reduce_scatter_cost: float = 1.0
    all_gather_cost: float = 1.0  # a timed all-gather over a ring's at ``link_gbits``
    intra_node_gbits: float = 0.0  # between ranks of one node (0: one rank per node)
    # the model's own forward and backward at the run's micro batch, its FLOPs as speed/flops.py
    # counts them per second (``measure_training_tflops``); 0: unmeasured, ``matmul_tflops``
    training_tflops: float = 0.0
    # torch AdamW's step over a partition-sized flat tensor (``measure_torch_adam_params_per_s``),
    # the optimizer a rank steps without offload; 0: unmeasured (``memory_gbps`` bounds it)
    torch_adam_params_per_s: float = 0.0
    # ZeRO-1/2's gradient all-reduce as DeepSpeed issues it, its copies included
    # (``measure_bucket_all_reduce``), Gbit/s on the same count as ``link_gbits``; 0: unmeasured
    bucket_all_reduce_gbits: float = 0.0


def cpu_profile(measured: CpuMeasurements) -> DeviceProfile:
    """A measured CPU rank as a device, with nothing fitted to the run it predicts.

    - compute: the model's own forward and backward at the run's micro batch (its matmuls and
      everything between them: attention, norms, activations, the loss, autograd's gradient
      buffers), as FLOPs per second on speed/flops.py's count (``training_tflops``), so the
      curve is flat at 1.0 (the measurement already is the achieved rate at those tokens);
      where that is unmeasured, the linear layers' matmul rate alone;
    - the device's memory and the host are the same DRAM: the offload copies (DeepSpeed's
      "host" buffers are plain tensors on the same memory) run at the measured bandwidth,
      CPUAdam and, without offload, torch's AdamW at their own measured rates;
    - the link is measured by collectives, so its efficiency is what DeepSpeed's own
      gradient all-reduce reaches of it, its copies around the collective included
      (``bucket_all_reduce_gbits`` over ``link_gbits``; 1.0 where unmeasured), and gloo's
      reduce-scatter and all-gather, which do not run at the all-reduce's bandwidth, are
      measured beside it (``reduce_scatter_cost``, ``all_gather_cost``, rescaled so that their
      seconds stay those measured);
    - ``overlaps_comm`` False: gloo runs a collective on the calling thread and the CPU
      accelerator's streams are no-ops (deepspeed/accelerator/cpu_accelerator.py ``Stream`` is a
      null context), so ``overlap_comm`` and ZeRO-3's prefetch do not hide communication behind
      compute as NCCL's streams do;
    - ``wire_bytes_follow_precision``: the run is fp32, so gradients and parameters travel in 4
      bytes per element;
    - fixed costs per micro step and per step are left at zero: the measured rates are the whole
      claim (what Python costs here shows up as error, not as a fitted constant).
    """
    cpu_adam_gbps = measured.cpu_adam_params_per_s * CPU_ADAM_BYTES_PER_PARAM / 1e9
    intra_gbits = measured.intra_node_gbits or measured.link_gbits
    link_efficiency = 1.0
    if measured.bucket_all_reduce_gbits > 0:
        link_efficiency = min(1.0, measured.bucket_all_reduce_gbits / measured.link_gbits)
    return DeviceProfile(
        name="cpu (measured)",
        peak_tflops=compute_tflops(measured),
        efficiency=EfficiencyCurve(peak_fraction=1.0, half_tokens=0.0),
        memory_gbps=measured.memory_gbps,
        link_gbps=intra_gbits / 8,
        offload_gbps=measured.memory_gbps,
        cpu_adam_host_gbps=cpu_adam_gbps,
        micro_step_overhead_s=0.0,
        optimizer_step_overhead_s=0.0,
        grad_hook_s_per_tensor=0.0,
        stage3_fetch_s_per_module=0.0,
        recompute_host_s_per_layer=0.0,
        link_efficiency=link_efficiency,
        overlaps_comm=False,
        wire_bytes_follow_precision=True,
        reduce_scatter_cost=measured.reduce_scatter_cost * link_efficiency,
        all_gather_cost=measured.all_gather_cost * link_efficiency,
        optimizer_params_per_s=measured.torch_adam_params_per_s or None,
    )


def compute_tflops(measured: CpuMeasurements) -> float:
    """The rate the step's FLOPs run at: the model's own forward and backward where measured,
    never above its matmuls' rate (the model runs those and more; a composed rate above it is
    the noise of ``measure_training_tflops``' difference of two timings on a busy machine)."""
    if measured.training_tflops <= 0:
        return measured.matmul_tflops
    return min(measured.training_tflops, measured.matmul_tflops)


# the bytes per parameter DeepSpeedCPUAdam streams (step_time.CPU_ADAM_BYTES_PER_PARAM's source)
CPU_ADAM_BYTES_PER_PARAM = 30


def median_seconds(work, repeats: int) -> float:
    """Median seconds of ``work()`` over ``repeats`` runs after one warm-up run."""
    work()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_matmul_tflops(
    hidden: int, intermediate: int, vocab: int, tokens: int, dtype_name: str = "fp32"
) -> float:
    """Achieved TFLOP/s of a decoder's linear layers (attention and MLP projections, LM head)
    at ``tokens`` rows, weighted by their FLOPs as a step runs them."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    weights = [(hidden, hidden), (hidden, intermediate), (intermediate, hidden), (hidden, vocab)]
    flops = 0.0
    seconds = 0.0
    for rows, cols in weights:
        activations = torch.randn(tokens, rows, dtype=dtype)
        weight = torch.randn(rows, cols, dtype=dtype)
        seconds += median_seconds(lambda a=activations, w=weight: a @ w, 5)
        flops += 2.0 * tokens * rows * cols
    return flops / seconds / 1e12


def measure_memory_gbps(elements: int = 16 * 2**20) -> float:
    """GB/s of a large fp32 add (two streams read, one written): the host's memory bandwidth."""
    import torch

    left, right, out = (torch.ones(elements) for _ in range(3))
    seconds = median_seconds(lambda: torch.add(left, right, out=out), 5)
    return 3 * elements * 4 / seconds / 1e9


def measure_cpu_adam_params_per_s(params: int) -> float:
    """Parameters per second of DeepSpeedCPUAdam's step (deepspeed/ops/adam/cpu_adam.py
    ``DeepSpeedCPUAdam.step``) over ``params`` fp32 parameters; the first step, which allocates
    the states, is the warm-up."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return optimizer_params_per_s(DeepSpeedCPUAdam, params)


def optimizer_params_per_s(optimizer_class, params: int) -> float:
    """Parameters per second of ``optimizer_class``'s step over one flat fp32 parameter of
    ``params`` elements with a gradient; the first step, which allocates the states, is the
    warm-up (``median_seconds``)."""
    import torch

    weight = torch.nn.Parameter(torch.zeros(params))
    weight.grad = torch.ones(params)
    optimizer = optimizer_class([weight], lr=1e-4)
    return params / median_seconds(optimizer.step, 3)


def measure_training_tflops(model_config: dict, micro_batch: int, seq_len: int) -> float:
    """FLOPs per second (speed/flops.py's count) of the model's own forward and backward at
    ``micro_batch`` x ``seq_len`` random tokens: its matmuls and everything between them
    (attention, norms, activations, the loss, autograd's fresh gradient buffers), which the
    matmul rate alone leaves out. The model built from ``model_config`` (a transformers
    config.json's fields) with none and with two decoder layers gives the seconds outside the
    layers and those of one layer; the whole depth is composed from them, so the measurement
    holds two layers' weights, not the model's."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from zerofit.models.resolve import spec_from_config
    from zerofit.speed.flops import forward_flops_per_sequence, step_flops_from_terms

    fields = {key: value for key, value in model_config.items() if key != "model_type"}
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model_config["vocab_size"], (micro_batch, seq_len), generator=generator)
    seconds = {}
    for depth in (0, 2):
        config = AutoConfig.for_model(model_config["model_type"], **fields)
        config.num_hidden_layers = depth
        model = AutoModelForCausalLM.from_config(config)

        def forward_backward(model=model) -> None:
            model(input_ids=ids, labels=ids).loss.backward()
            model.zero_grad(set_to_none=True)  # every micro step's gradients start fresh

        seconds[depth] = median_seconds(forward_backward, 5)
    per_layer = max(0.0, seconds[2] - seconds[0]) / 2
    step_s = seconds[0] + model_config["num_hidden_layers"] * per_layer
    terms = forward_flops_per_sequence(spec_from_config(model_config, "measured"), seq_len)
    flops = step_flops_from_terms(terms, sequences=micro_batch)
    return (flops.forward + flops.backward) / step_s / 1e12


def measure_torch_adam_params_per_s(params: int) -> float:
    """Parameters per second of torch's AdamW step (torch/optim/adamw.py, the single-tensor
    loop it runs on CPU tensors) over one flat fp32 tensor of ``params``: the optimizer
    DeepSpeed steps a rank's flat partition with when the optimizer stays on the device
    (runtime/engine.py ``_configure_basic_optimizer``, ``torch_adam``). Its temporaries
    (``exp_avg_sq.sqrt()``, the step's divisions) are fresh tensors of the partition's size, so
    it runs well below the memory bandwidth that bounds it on a GPU."""
    import torch

    return optimizer_params_per_s(torch.optim.AdamW, params)


@dataclass(frozen=True)
class LinkMeasurements:
    """The link between the ranks, by a timed collective of each kind DeepSpeed issues."""

    gbits: float  # per rank, from the all-reduce: a ring all-reduce sends 2 (n-1)/n of the buffer
    reduce_scatter_cost: float  # ZeRO-3's bucketed reduce-scatter over a ring's at ``gbits``
    all_gather_cost: float  # all-gather seconds over a ring's (n-1)/n at ``gbits``
    bucket_gbits: float = 0.0  # ZeRO-1/2's bucketed all-reduce, on the count of ``gbits``


def copy_into_bucket(grads: list, bucket) -> list:
    """Each gradient copied, flattened, into the next stretch of the contiguous ``bucket``, as
    DeepSpeed fills its reduction buckets; the bucket's views, one per gradient."""
    views = []
    offset = 0
    for grad in grads:
        view = bucket.narrow(0, offset, grad.numel())
        view.copy_(grad.view(-1))
        views.append(view)
        offset += grad.numel()
    return views


def bucket_all_reduce(grads: list, bucket, partition, group=None) -> None:
    """ZeRO-1/2's reduction of one gradient bucket without ``overlap_comm``, as DeepSpeed 0.19
    issues it on the calling thread (runtime/zero/stage_1_and_2.py): each gradient copied into
    the contiguous bucket (``reduce_independent_p_g_buckets_and_remove_grads``), the bucket
    divided by the ranks (``average_tensor``), flattened into a new tensor and all-reduced
    (``allreduce_bucket``: ``self.flatten``, torch's ``_flatten_dense_tensors``), this rank's
    slice copied back into the bucket (``allreduce_and_copy_with_multiple_ranks``) and from
    there into the rank's gradient partition (``copy_grads_in_partition``). The new tensor is
    what costs most on a CPU: past glibc's mmap threshold every such buffer is fresh pages."""
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors

    ranks = dist.get_world_size(group)
    slices = copy_into_bucket(grads, bucket)
    offset = sum(view.numel() for view in slices)
    filled = bucket.narrow(0, 0, offset)
    filled.div_(ranks)
    flat = _flatten_dense_tensors(slices)
    dist.all_reduce(flat, group=group)
    share = offset // ranks
    start = dist.get_rank(group) * share
    filled.narrow(0, start, share).copy_(flat.narrow(0, start, share))
    partition.copy_(filled.narrow(0, start, share))


def bucket_reduce_scatter(grads: list, bucket, partition, group=None) -> None:
    """ZeRO-3's reduction of one gradient bucket as DeepSpeed 0.19 issues it (runtime/zero/
    stage3.py): each gradient copied into the contiguous bucket (``__add_grad_to_ipg_bucket``),
    each gradient's rank slices interleaved into a new tensor, divided by the ranks and
    reduce-scattered (``__avg_scatter_grads`` -> runtime/comm/coalesced_collectives.py
    ``reduce_scatter_coalesced``: ``torch.cat``, ``div_``), and this rank's slices copied into
    its gradient partition (``partition_grads``)."""
    import torch
    import torch.distributed as dist

    ranks = dist.get_world_size(group)
    rank = dist.get_rank(group)
    views = copy_into_bucket(grads, bucket)
    slices = [view.chunk(ranks)[index] for index in range(ranks) for view in views]
    flat = torch.cat(slices)
    flat.div_(ranks)
    dist.reduce_scatter_tensor(flat.chunk(ranks)[rank], flat, group=group)
    partition.copy_(flat.chunk(ranks)[rank])


def measure_link(megabytes: float = 8.0, group=None, repeats: int = 3) -> LinkMeasurements:
    """Time an all-reduce and an all-gather of ``megabytes`` (the whole buffer) over ``group``
    (None: every rank), and the gradient reductions of as many bytes as DeepSpeed issues them,
    with their copies: ZeRO-1/2's bucketed all-reduce (``bucket_all_reduce``) and ZeRO-3's
    bucketed reduce-scatter (``bucket_reduce_scatter``); large enough that bandwidth, not
    latency, sets the time. The reduce-scatter and all-gather are the calls DeepSpeed makes on
    gloo (deepspeed/comm/comm.py ``reduce_scatter_fn`` and ``allgather_fn``: the ``*_tensor``
    forms); ZeRO-1/2's step gathers into the parameters' existing flat buffer, copying nothing."""
    import torch
    import torch.distributed as dist

    ranks = dist.get_world_size(group)
    whole = torch.ones(int(megabytes * 2**20 / 4 / ranks) * ranks)
    shard = torch.empty(whole.numel() // ranks)
    all_reduce_s = median_seconds(lambda: dist.all_reduce(whole, group=group), repeats)
    all_gather_s = median_seconds(
        lambda: dist.all_gather_into_tensor(whole, shard, group=group), repeats
    )
    grads = list(torch.ones(whole.numel()).chunk(8))
    bucket = torch.empty(whole.numel())
    bucket_s = median_seconds(lambda: bucket_all_reduce(grads, bucket, shard, group), repeats)
    reduce_scatter_s = median_seconds(
        lambda: bucket_reduce_scatter(grads, bucket, shard, group), repeats
    )
    ring_s = all_reduce_s / 2  # one ring pass of the buffer at the all-reduce's bandwidth
    sent = 2 * (ranks - 1) / ranks * whole.numel() * 4
    return LinkMeasurements(
        gbits=sent * 8 / all_reduce_s / 1e9,
        reduce_scatter_cost=reduce_scatter_s / ring_s,
        all_gather_cost=all_gather_s / ring_s,
        bucket_gbits=sent * 8 / bucket_s / 1e9,
    )


def measure_cpu_device(
    *,
    model_config: dict,
    micro_batch: int,
    seq_len: int,
    partition_params: int,
    link_megabytes: float = 8.0,
) -> CpuMeasurements:
    """Every rate of ``cpu_profile``, measured in this rank (torch.distributed initialized, the
    other ranks calling it at the same time so that they contend for the cores as in the run).
    ``model_config``: the model's transformers config fields (its shapes, and its own layers
    for ``measure_training_tflops``), trained at ``micro_batch`` x ``seq_len`` tokens.
    ``link_megabytes``: the collectives' buffer, no larger than the model's gradients."""
    link = measure_link(link_megabytes, repeats=2)
    matmul_tflops = measure_matmul_tflops(
        model_config["hidden_size"],
        model_config["intermediate_size"],
        model_config["vocab_size"],
        micro_batch * seq_len,
    )
    return CpuMeasurements(
        matmul_tflops=matmul_tflops,
        memory_gbps=measure_memory_gbps(),
        cpu_adam_params_per_s=measure_cpu_adam_params_per_s(partition_params),
        link_gbits=link.gbits,
        reduce_scatter_cost=link.reduce_scatter_cost,
        all_gather_cost=link.all_gather_cost,
        training_tflops=measure_training_tflops(model_config, micro_batch, seq_len),
        torch_adam_params_per_s=measure_torch_adam_params_per_s(partition_params),
        bucket_all_reduce_gbits=link.bucket_gbits,
    )
