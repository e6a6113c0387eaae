"""Model-state bytes per GPU and per node (CPU) for DeepSpeed ZeRO 0-3, derived from DeepSpeed 0.19.

Every term names the DeepSpeed buffer it stands for (``runtime/zero/stage_1_and_2.py``,
``stage3.py``, ``partition_parameters.py``). ``b`` is the element size of the model dtype.
"""

from __future__ import annotations

import math

from zerofit.memory import pinned
from zerofit.memory.param_layout import (
    zero3_kept_gathered_elements,
    zero12_distinct_rank_grads,
    zero12_grad_buffer_elements,
)

FP32 = 4
FP64 = 8
NORM_CHUNK = 250_000_000  # stage3.py:_constant_buffered_norm2 buffer_size
ADAM_STATES = 2 * FP32  # torch AdamW exp_avg + exp_avg_sq, fp32, created lazily at the first step


def zero_paper_model_states(params: int, stage: int, world: int, k: int = 12) -> float:
    """Model-state bytes per GPU in the ZeRO paper's notation (Fig. 1): 2Ψ params, 2Ψ grads, KΨ
    optimizer (fp32 master + Adam = 12). Stage 1 partitions K, stage 2 also grads, stage 3 all."""
    p = params
    if stage == 0:
        return (2 + 2 + k) * p
    if stage == 1:
        return 2 * p + 2 * p + k * p / world
    if stage == 2:
        return 2 * p + (2 + k) * p / world
    return (2 + 2 + k) * p / world


def largest_param(model) -> int:
    """Elements of the biggest single parameter (sizes DeepSpeed's per-param offload buffer)."""
    return max(model.vocab_size * model.hidden_size, largest_layer_param(model))


def largest_layer_param(model) -> int:
    """Elements of the biggest parameter inside a decoder layer (an MLP weight, or transformers
    5's 3-D tensor of every expert's gate and up projections)."""
    h = model.hidden_size
    sizes = [h * model.intermediate_size]
    if getattr(model, "num_experts", 0):
        sizes.append(
            model.num_experts * 2 * (model.moe_intermediate_size or model.intermediate_size) * h
        )
    return max(sizes)


def embedding_params(model) -> int:
    """Input embedding (+ untied lm_head) parameter count."""
    return model.vocab_size * model.hidden_size * (1 if model.tie_embeddings else 2)


def layer_params(model) -> int:
    """Parameters of one decoder layer (all experts for MoE)."""
    return max(0, (model.params - embedding_params(model)) // max(1, model.num_layers))


def resident_states(model, s, b: int, buckets: dict) -> dict[str, int]:
    """Bytes on each GPU that live through the whole step (from step 2 on, Adam states exist)."""
    p, n = model.params, s.world_size
    shard = p if s.stage == 0 else math.ceil(p / n)
    out: dict[str, int] = {}
    on_gpu_opt = s.offload_optimizer == "none"
    if s.stage == 3:
        out["params"] = 0 if s.offload_param != "none" else shard * b
        out.update(zero_plus_resident(model, s, b))
    else:
        out["params"] = p * b  # bit16_groups_flat: the full flat copy
    if on_gpu_opt:
        out["master_fp32"] = shard * FP32  # single_partition_of_fp32_groups
        out["optimizer_states"] = shard * ADAM_STATES
    if s.stage == 3 and on_gpu_opt:
        out["gradients"] = shard * b  # grad_partitions_flat_buffer, allocated at init
    elif s.stage in (1, 2) and s.grad_accum > 1 and on_gpu_opt:
        # between micro steps ZeRO-1 keeps the full .grad tensors, ZeRO-2 its gradient buffer
        out["gradients"] = p * b if s.stage == 1 else zero12_grad_buffer_elements(model, n) * b
    elif s.stage == 0 and s.grad_accum > 1:
        out["gradients"] = p * b
    if s.stage == 3 and buckets.get("reduce_bucket_size"):
        out["comm_buckets"] = (
            int(buckets["reduce_bucket_size"]) * b
        )  # ipg bucket, allocated at init
    if s.stage in (1, 2) and not on_gpu_opt:
        out["comm_buckets"] = largest_param(model) * b  # temp_grad_buffer_for_gpu_offload
    return out


def backward_buffers(model, s, b: int, buckets: dict) -> dict[str, int]:
    """Gradient buffers alive while backward runs, on top of the resident states."""
    p, n = model.params, s.world_size
    out: dict[str, int] = {}
    if s.stage in (1, 2):
        bucket = int(buckets.get("reduce_bucket_size", 500_000_000))
        # setup_buckets(): one ipg buffer, two with overlap_comm, allocated at the first grad hook
        out["comm_buckets"] = (2 if s.overlap_comm else 1) * bucket * b
        if s.offload_optimizer == "none" and p > bucket and s.grad_accum == 1:
            # grads_in_partition is allocated when the first bucket is reduced
            out["gradients"] = zero12_grad_buffer_elements(model, n) * b
    elif s.stage == 0:
        out["gradients"] = p * b if s.grad_accum == 1 else 0  # .grad filled as backward goes
        if n > 1:
            out["comm_buckets"] = min(p, 500_000_000) * b  # buffered allreduce flattens a bucket
    if s.stage in (1, 2, 3) and model.tie_embeddings:
        # the tied embedding's grad from lm_head waits in autograd's buffer until the
        # embedding backward at the very end
        out["tied_embedding_grad"] = model.vocab_size * model.hidden_size * b
    if s.stage == 3 and "qgz" in s.zero_plus:
        out["qgz_buffers"] = qgz_buffer_bytes(model, s)
    return out


def backward_moments(model, s, b: int) -> dict[str, dict[str, int]]:
    """ZeRO-1/2/3: what one parameter's gradient adds, on top of ``backward_buffers``, at each
    moment of backward that can set its peak; the estimate adds the activations alive then.

    - ``head``: an untied LM head's grad is the first one backward produces, while every
      activation is still saved. It exists on its own until it is copied into a bucket or, bigger
      than the bucket, while it is reduced by itself
      (stage_1_and_2.py:reduce_independent_p_g_buckets_and_remove_grads,
      ``extra_large_param_to_reduce``; stage3.py:__add_grad_to_ipg_bucket copies only what fits).
    - ``layers``: a decoder layer's grads, while one layer is recomputed (or backpropagated).
    - ``end``: the (tied) embedding's grad, after every activation is freed.

    With the optimizer on the CPU, each param's grad goes to the host at the boundary, one at a
    time, through GPU temporaries (``offload_grad_temps``).
    """
    if s.stage not in (1, 2, 3):
        return {}
    head = model.vocab_size * model.hidden_size

    def temps(elements: int) -> dict[str, int]:
        if s.offload_optimizer == "none":
            return {}
        return {"offload_grad_temps": offload_grad_temp_bytes(model, s, b, elements)}

    moments = {"layers": temps(largest_layer_param(model))}
    if model.tie_embeddings:
        # autograd sums the embedding's own grad and the LM head's (backward_buffers) out of
        # place (torch/csrc/autograd/input_buffer.cpp: accumulate): both and the sum coexist
        moments["end"] = {"tied_embedding_sum": 2 * head * b, **temps(head)}
    else:
        moments["head"] = {"lm_head_grad": head * b, **temps(head)}
    return moments


def offload_grad_temp_bytes(model, s, b: int, elements: int) -> int:
    """GPU temporaries while one parameter's grad (``elements``) goes to the offloaded optimizer.

    ZeRO-1/2 (stage_1_and_2.py:copy_grads_in_partition): the norm of this rank's slice in fp64
    (``set_norm_for_param_grad_in_gpu``: ``.to(get_norm_dtype())``, torch.double wherever the
    device has fp64), then an fp32 copy for the host buffer
    (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``): the fp64 one is the larger, 8 bytes
    per element of the slice (at most the partition).
    ZeRO-3 (stage3.py:partition_grads): the host grad buffer of this rank's slice is copied back to
    the GPU (``grad_buffer.to(device)``), then ``_offload_grad_partition_at_boundary`` takes its
    norm in fp64 chunks of 250M elements (``_constant_buffered_norm2``) and its fp32 copy for the
    host, one after the other.
    """
    if s.stage == 3:
        piece = math.ceil(elements / s.world_size)
        return piece * b + max(min(piece, NORM_CHUNK) * FP64, piece * FP32)
    return min(elements, math.ceil(model.params / s.world_size)) * FP64


def step_buffers(model, s, b: int, buckets: dict, optimizer: str = "adamw_torch") -> dict[str, int]:
    """Transient bytes of ``optimizer.step()`` on the GPU, on top of the resident states.

    Stage 1/2: the rank's bit16 gradient buffer (every parameter overlapping its partition,
    param_layout.py) is held while the grad norm copies one slice at a time to fp64, then while
    the flattened copy and the fp32 copy (``flat_grad_partition.to(fp32)``) of the partition
    coexist; the rank where that sum is largest counts. Then the fp32 grad plus the optimizer's own
    temporaries (``optimizers.step_temporary_bytes``: torch foreach AdamW's ``sqrt(exp_avg_sq)``,
    the for-loop's sqrt and quotient, none for fused kernels). The optimizer steps the flat fp32
    partition, one tensor. Stage 3 does the same per sub-group (``sub_group_size``).
    Offloaded optimizers step on CPU.
    """
    from zerofit.memory.optimizers import step_temporary_bytes

    p, n = model.params, s.world_size
    if s.offload_optimizer != "none":
        return {}
    if s.stage == 3:
        sub = min(math.ceil(p / n), int(buckets.get("sub_group_size", 1_000_000_000)))
        temp = step_temporary_bytes(optimizer, sub, sub)
        if b + FP32 > FP32 + temp:  # flatten copy + cast copy outweigh the optimizer's temporary
            return {"fp32_grads": sub * (b + FP32)}
        return {"fp32_grads": sub * FP32, "optimizer_step_temp": temp}
    shard = p if s.stage == 0 else math.ceil(p / n)
    # the averaged bit16 grads are still referenced until the fp32 copy exists
    # (with accumulation they are already counted among the resident states)
    # per rank: the gradient buffer it holds until the fp32 copy exists, and its largest slice
    ranks = [(shard, 0)] if s.stage == 0 else zero12_distinct_rank_grads(model, n)

    def before_cast(buffer: int, largest_slice: int) -> dict[str, int]:
        held = {"gradients": buffer * b} if s.grad_accum == 1 else {}
        # the grad norm first copies one parameter's slice at a time to fp64 (stage_1_and_2.py:
        # step -> scaled_global_norm -> get_grad_norm_direct), then the flattened bit16 copy
        # and the fp32 copy coexist
        norm, cast = largest_slice * FP64, shard * (b + FP32)
        return {**held, **({"grad_norm_fp64": norm} if norm > cast else {"fp32_grads": cast})}

    first = max((before_cast(*rank) for rank in ranks), key=lambda parts: sum(parts.values()))
    temp = step_temporary_bytes(optimizer, shard, shard)
    if sum(first.values()) >= shard * FP32 + temp:
        return first
    # by the optimizer's own step the bit16 grads and the flattened copy are freed
    return {"fp32_grads": shard * FP32, "optimizer_step_temp": temp}


def stage3_live_params(model, s, b: int, buckets: dict) -> int:
    """Gathered (full) parameters resident during forward/backward under ZeRO-3 with N > 1:
    the current module, the prefetch bucket and, at the loss, the lm_head matrix (bounded by
    ``stage3_max_live_parameters``), or, when more, every weight reused within
    ``stage3_max_reuse_distance`` (param_layout.zero3_kept_gathered_elements). With one rank
    DeepSpeed skips the gather (``partition_parameters.py:_no_gather_coalesced``):
    ``NoGatherHandle`` sets ``param.data = ds_tensor.to(device)``, no copy when the partition is
    on the GPU, a full copy of each module when parameters are offloaded to the CPU."""
    if s.stage != 3 or (s.world_size == 1 and s.offload_param == "none"):
        return 0
    prefetch = int(buckets.get("stage3_prefetch_bucket_size", 50_000_000))
    live = model.vocab_size * model.hidden_size + layer_params(model) + prefetch
    live = min(
        live, int(buckets.get("stage3_max_live_parameters", 1_000_000_000)) + layer_params(model)
    )
    # what is reused soon stays gathered from the end of forward into backward
    # (param_layout.zero3_kept_gathered_elements); stage3_max_live_parameters only caps prefetch
    reuse = int(buckets.get("stage3_max_reuse_distance", 1_000_000_000))
    kept = zero3_kept_gathered_elements(model, reuse, s.gradient_checkpointing)
    return min(max(live, kept), model.params) * b + qwz_gather_buffer_bytes(model, s, prefetch)


# --- ZeRO++ (stage 3 across nodes; planning/options.py) ----------------------------------------
def zero_plus_resident(model, s, b: int) -> dict[str, int]:
    """hpZ's secondary partition: ``partition_parameters.py`` ``Init._partition_param_sec`` gives
    every parameter, when forward releases it, a second 16-bit shard of
    ``tensor_size // num_ranks_in_param_group`` elements (``dtype=param.dtype``) on
    ``Init.remote_device``, the GPU unless parameters are offloaded; the group is
    ``zero_hpz_partition_size`` ranks, a node. It lives through backward (whose all-gather reads
    it) and the optimizer step, until ``stage3.py`` ``_post_step`` ->
    ``invalidate_secondary_tensor``: params x b / GPUs per node on each rank.

    A reference model (DPO, GRPO with beta > 0) gets the same ZeRO-3 config at stage 3
    (trl/models/utils.py ``prepare_deepspeed`` keeps ``zero_optimization``), so its forwards
    leave a secondary shard too, and with no optimizer step of its own nothing drops it."""
    if not s.zero_plus.startswith("hpz") or s.offload_param != "none":
        return {}
    group = max(1, min(s.gpus_per_node, s.world_size))
    shard = math.ceil(model.params / group) * b
    out = {"hpz_secondary_params": shard}
    if s.uses_reference:
        out["hpz_secondary_reference"] = shard
    return out


def qwz_gather_buffer_bytes(model, s, prefetch: int) -> int:
    """qwZ: a quantized all-gather lands in an int8 buffer of the gathered elements before it is
    dequantized into the parameters (``_all_gather_coalesced`` in
    ``Init._convert_to_deepspeed_param``: ``torch.empty(partition_sz
    * world_size, dtype=torch.int8)``, fp32 scales per group of at most 8,000 elements,
    ``CUDAQuantizer.target_group_size``). The module being computed has been dequantized already
    (``AllGatherCoalescedHandle.wait``), so what is alive beside it is the prefetch in flight:
    one byte per element of the prefetch bucket."""
    if "qwz" not in s.zero_plus:
        return 0
    return min(prefetch, model.params)


def qgz_buffer_bytes(model, s) -> int:
    """qgZ's temporaries while one gradient is reduced (runtime/comm/coalesced_collectives.py
    ``all_to_all_quant_reduce``, one parameter at a time): the int4 copy of the whole gradient
    and its intra-node all-to-all output (half a byte per element each), the int4 node-level
    partial sums sent and received across nodes (1/L of it each) and their dequantized 16-bit
    result (``quantizer_module.dequantize``, 2 bytes per element of 1/L), L the GPUs per node;
    the largest parameter (the LM head or embedding) sets it."""
    largest = largest_param(model)
    per_node = max(1, min(s.gpus_per_node, s.world_size))
    return largest + math.ceil(3 * largest / per_node)


def cpu_bytes_per_rank(model, s, b: int, buckets: dict) -> int:
    """Host RAM one rank holds for offload (multiply by GPUs per node for the node), with pinned
    buffers at the size PyTorch's pinned allocator really gives them (``memory/pinned.py``)."""
    p, n = model.params, s.world_size
    shard = math.ceil(p / n)
    sub_group = int(buckets.get("sub_group_size", 1_000_000_000))
    total = 0
    if s.offload_optimizer == "cpu":
        # fp32 master, Adam states, fp32 grads and a bit16 buffer (pinned.py names each)
        if s.stage == 3:
            total += pinned.zero3_offload_host_bytes(model, s, b, shard, sub_group)
        else:
            total += pinned.zero12_offload_host_bytes(s, b, shard, largest_param(model))
    elif s.offload_optimizer == "nvme":
        sub = min(shard, sub_group)
        total += 2 * sub * (FP32 + ADAM_STATES + FP32)  # swap-in/out of one sub-group's states
    if s.offload_param == "cpu":
        total += pinned.zero3_param_offload_host_bytes(model, s, b, shard)
    elif s.offload_param == "nvme":
        total += 5 * 100_000_000 * b  # aio buffer_count x buffer_size defaults
    return total


# --- Without DeepSpeed: DDP or one GPU (stage 0 of an accelerate/HF Trainer config) ----------
# The weights stay in the dtype they were loaded in (``w``) and the optimizer steps them
# directly: there is no separate fp32 master copy. torch.optim.AdamW creates ``exp_avg`` and
# ``exp_avg_sq`` with ``torch.zeros_like(param)`` (``torch/optim/adamw.py`` ->
# ``adam.py:_init_group``), so the states take the weights' dtype too, and so do the ``.grad``
# tensors autograd accumulates. With fp32 weights and bf16/fp16 mixed precision, accelerate runs
# the forward under ``torch.autocast`` (``Accelerator.autocast``, used by the HF Trainer's
# ``compute_loss_context_manager`` and by TRL), which casts each weight once and keeps the cast
# in its cache until the autocast region exits (``aten/src/ATen/autocast_mode.cpp:cached_cast``:
# leaf tensors that require grad are cached).


def autocast_weight_bytes(model, a: int) -> int:
    """The compute-dtype copies autocast makes of every weight a linear layer uses: all but the
    input embedding (``embedding`` is not an autocast op) and the RMSNorm weights (applied with
    ``mul``, not autocast either). A tied LM head casts the shared matrix for ``lm_head``."""
    h = model.hidden_size
    norms = (2 * model.num_layers + 1) * h
    embedding_input = 0 if model.tie_embeddings else model.vocab_size * h
    return max(0, model.params - embedding_input - norms) * a


def ddp_bucket_bytes(model, s, w: int) -> int:
    """DDP's reducer keeps its own flat copy of every gradient, in buckets allocated when the
    model is wrapped (``torch/nn/parallel/distributed.py``: with ``gradient_as_bucket_view=False``,
    the default of DDP and of accelerate's ``DistributedDataParallelKwargs``, which the HF
    Trainer does not change, the buckets hold a copy of the grads; True would save "the total
    gradients size"). One process uses no DDP wrapper."""
    return model.params * w if s.world_size > 1 else 0


def plain_resident_states(model, s, w: int) -> dict[str, int]:
    """Bytes that live through the whole step without DeepSpeed (from step 2 on)."""
    p = model.params
    out = {"params": p * w, "optimizer_states": 2 * p * w}
    if s.grad_accum > 1:
        out["gradients"] = p * w  # .grad accumulates across micro steps
    buckets = ddp_bucket_bytes(model, s, w)
    if buckets:
        out["comm_buckets"] = buckets
    return out


def plain_backward_buffers(model, s, w: int) -> dict[str, int]:
    """Gradients filled as backward goes (already resident when accumulating)."""
    return {"gradients": model.params * w} if s.grad_accum == 1 else {}


def plain_step_buffers(model, s, w: int, optimizer: str) -> dict[str, int]:
    """``optimizer.step()`` without DeepSpeed: the grads are still held (``zero_grad`` comes
    after) and the optimizer's temporaries are in the weights' dtype, over every parameter at once
    for foreach (``_multi_tensor_adam`` groups all tensors of a device and dtype)."""
    from zerofit.memory.optimizers import step_temporary_bytes

    p = model.params
    out = {"gradients": p * w} if s.grad_accum == 1 else {}
    temp = step_temporary_bytes(optimizer, p, largest_param(model), w)
    if temp:
        out["optimizer_step_temp"] = temp
    return out
