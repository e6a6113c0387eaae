"""Host RAM that DeepSpeed's CPU offload page-locks ("pins"), as PyTorch really allocates it.

``pin_memory: true`` in an offload block makes DeepSpeed call ``tensor.pin_memory()``
(``deepspeed/accelerator/abstract_accelerator.py:pin_memory`` -> ``_torch_pin_memory``). PyTorch
serves that from its caching host allocator, which rounds every request up to the next power of
two (``ATen/core/CachingHostAllocator.h``, ``allocate``: ``c10::llvm::PowerOf2Ceil(size)`` while
the size is below ``pinned_max_round_threshold``, unlimited by default) and keeps freed blocks
cached for reuse at that same size: nothing in torch, accelerate or DeepSpeed empties that cache
during training (``torch._C._host_emptyCache`` is only called by CUDA graphs).

So a pinned buffer of 2^k + 1 bytes holds 2^(k+1), and a buffer that is pinned and later replaced
stays held. The sizes below are DeepSpeed 0.19's own buffers, one flat tensor per parameter group
unless said otherwise; optimizer param groups other than the weight-decay one (norms and biases)
are small and are counted at their real size.
"""

from __future__ import annotations

import math

FP32 = 4
ADAM_STATES = 2 * FP32  # CPU Adam exp_avg + exp_avg_sq, fp32


def pinned_bytes(nbytes: int) -> int:
    """What a pinned buffer of ``nbytes`` occupies: the next power of two."""
    if nbytes <= 0:
        return 0
    return 1 << (nbytes - 1).bit_length()


def weight_matrix_sizes(model) -> list[int]:
    """Element counts of the model's large weights in module order (the order ``named_parameters``
    gives them to the optimizer): the embedding, each layer's q/k/v/o projections and MLP (MoE:
    the router and the experts' fused ``gate_up_proj`` / ``down_proj`` of transformers 5), then an
    untied LM head. Norm weights and biases are left out (kilobytes each)."""
    h, d = model.hidden_size, model.head_dim
    attention = [
        h * model.num_heads * d,
        h * model.num_kv_heads * d,
        h * model.num_kv_heads * d,
        model.num_heads * d * h,
    ]
    if model.num_experts:
        experts = model.num_experts
        expert_width = model.moe_intermediate_size or model.intermediate_size
        mlp = [experts * h, experts * 2 * expert_width * h, experts * expert_width * h]
    else:
        mlp = [h * model.intermediate_size] * 3
    sizes = [model.vocab_size * h]
    for _ in range(model.num_layers):
        sizes += attention + mlp
    if not model.tie_embeddings:
        sizes.append(model.vocab_size * h)
    return sizes


def zero3_sub_groups(partitions: list[int], sub_group_size: int) -> list[int]:
    """ZeRO-3's optimizer sub-groups over one rank's parameter partitions, in elements:
    ``stage3.py:_create_fp16_sub_groups`` closes a group as soon as it reaches ``sub_group_size``
    (so each group but the last holds at least that many)."""
    total = sum(partitions)
    if sub_group_size >= total:
        return [total]
    groups, current = [], 0
    for numel in partitions:
        current += numel
        if current >= sub_group_size:
            groups.append(current)
            current = 0
    if current:
        groups.append(current)
    return groups


def rank_partitions(model, world_size: int) -> list[int]:
    """One rank's ZeRO-3 partition of each large weight (``ceil(numel / world)``, padded) plus
    the rest of the rank's shard (norms, biases) as one small remainder."""
    parts = [math.ceil(numel / world_size) for numel in weight_matrix_sizes(model)]
    rest = math.ceil(model.params / world_size) - sum(parts)
    return parts + ([rest] if rest > 0 else [])


def zero12_offload_host_bytes(s, b: int, shard: int, largest: int) -> int:
    """ZeRO-1/2 with the optimizer on the CPU, per rank (``stage_1_and_2.py``): the fp32 master
    partition, its bit16 staging copy and the fp32 grad partition are pinned when ``pin_memory``
    is on (``__init__`` and ``initialize_optimizer_states``), and so is the per-parameter grad
    staging buffer of the largest parameter, ``largest`` elements
    (``temp_grad_buffer_for_cpu_offload``); CPU Adam's two fp32 moments are plain ``zeros_like``
    (``ops/adam/cpu_adam.py``)."""
    buffers = [shard * FP32, shard * b, shard * FP32, largest * b]
    if s.pin_optimizer_offload:
        buffers = [pinned_bytes(size) for size in buffers]
    return sum(buffers) + shard * ADAM_STATES


def zero3_offload_host_bytes(model, s, b: int, shard: int, sub_group_size: int) -> int:
    """ZeRO-3 with the optimizer on the CPU, per rank (``stage3.py``): the flat grad partition
    buffer (``grad_partitions_flat_buffer``, the grad-accumulation dtype) and each sub-group's
    fp32 grad (``initialize_optimizer_states``) are pinned with ``pin_memory``; the fp32 master
    sub-groups are plain clones (``_create_fp32_partitions``) and CPU Adam's moments plain."""
    groups = zero3_sub_groups(rank_partitions(model, s.world_size), sub_group_size)
    pinned = [shard * b] + [group * FP32 for group in groups]
    if s.pin_optimizer_offload:
        pinned = [pinned_bytes(size) for size in pinned]
    return sum(pinned) + shard * (FP32 + ADAM_STATES)


def zero3_param_offload_host_bytes(model, s, b: int, shard: int) -> int:
    """ZeRO-3 with the parameters on the CPU, per rank: ``zero.Init`` pins each parameter's
    partition on its own (``partition_parameters.py:_partition_param``: ``torch.empty(
    partition_size, dtype=param.dtype, device=remote_device)``, then ``pin_memory`` when the
    offload block's ``pin_memory`` is on), then the optimizer moves them into one flat buffer
    per param group (``stage3.py:_create_param_groups_fp16_flat_cpu_memory``); the
    per-parameter blocks it frees stay in PyTorch's pinned cache (see the module docstring).
    Without pinning the first copies are ordinary memory, given back when freed, but the flat
    buffer is pinned all the same: ``_create_param_groups_fp16_flat_cpu_memory`` calls
    ``get_accelerator().pin_memory(torch.empty(...))`` whatever ``pin_memory`` says."""
    flat = pinned_bytes(shard * b)
    if not s.pin_param_offload:
        return flat
    per_parameter = sum(pinned_bytes(part * b) for part in rank_partitions(model, s.world_size))
    return per_parameter + flat


def zero3_adapter_param_offload_host_bytes(base, s, b: int, adapter_sizes: list[int]) -> int:
    """ZeRO-3 with the parameters on the CPU under LoRA / QLoRA, per rank. ``zero.Init(module=
    ...)`` partitions every parameter, frozen or not, onto the CPU, each on its own and pinned
    with ``pin_memory`` (``zero3_param_offload_host_bytes``); the optimizer then moves only its
    own parameters, the adapters, into a flat buffer (``stage3.py:
    _create_param_groups_fp16_flat_cpu_memory`` walks ``trainable_param_groups``), pinned
    whatever ``pin_memory`` says. The frozen base is in no param group: its partitions stay
    where ``zero.Init`` put them, the only copy, and no flat buffer of it is made.

    ``base`` is the base model as DeepSpeed counts its parameters (a 4-bit base's packed
    weights: ``lora.zero3_parameter_model``), ``adapter_sizes`` the adapter tensors' elements.
    Pinned: every parameter's block at its power of two (the adapters' freed into the cache)
    and the flat buffer; unpinned: the base's partitions at their size and the flat buffer.
    What the partitions themselves hold, ``ds_tensor`` by ``ds_tensor``, is
    ``zero3_partition_bytes``."""
    world = s.world_size
    base_parts = rank_partitions(base, world)
    adapter_parts = [math.ceil(numel / world) for numel in adapter_sizes]
    flat = pinned_bytes(sum(adapter_parts) * b)
    if not s.pin_param_offload:
        return sum(base_parts) * b + flat
    return sum(pinned_bytes(part * b) for part in base_parts + adapter_parts) + flat


def zero3_partition_bytes(base, world_size: int, b: int, adapter_sizes: list[int]) -> int:
    """The bytes of every parameter's ZeRO-3 partition on one rank (the sum of
    ``param.ds_tensor.numel() * element_size()``): the base's partitions and the adapters'
    (views into their flat buffer), before any pinned rounding."""
    adapters = sum(math.ceil(numel / world_size) for numel in adapter_sizes)
    return (sum(rank_partitions(base, world_size)) + adapters) * b
