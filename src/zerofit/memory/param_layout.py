"""Where each parameter falls when DeepSpeed ZeRO-1/2 splits the flat model across ranks.

ZeRO-1/2 flattens a parameter group in its parameters' order and gives rank ``k`` the elements
``[k * S, (k + 1) * S)`` of it, ``S = ceil(P / N)`` (``stage_1_and_2.py``: ``__init__`` ->
``flatten_dense_tensors_aligned`` and ``get_data_parallel_partitions``). Two buffers follow the
parameters rather than the partition, so they depend on where the boundaries cut:

- the gradient buffer a rank fills in backward holds every parameter that *overlaps* its
  partition in full (``copy_grads_in_partition``: ``total_size += param_in_partition.numel()``
  over ``params_in_partition``, which lists a parameter cut by a boundary on both sides). A rank
  whose partition starts inside a large embedding holds that whole matrix's gradient besides its
  own share;
- the gradient norm converts each parameter's slice of the partition to fp64, one slice at a time
  (``get_grad_norm_direct``: ``g.data.to(get_norm_dtype())``), so its temporary is the largest
  slice any rank owns.

The order is what transformers' decoder models register: the token embedding, then each layer's
attention and MLP weights, then an untied LM head. Norm weights and biases (kilobytes) are folded
into a per-layer remainder so the sizes add up to the model's exact parameter count. An HF Trainer
puts norms and biases in a second, no-decay group; that group is that small, so one group in this
order is what matters for where the boundaries fall.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math


def ordered_param_numels(model) -> list[int]:
    """Element counts of the model's parameters in registration order (see the module
    docstring): embedding, each layer's weights and a remainder, an untied LM head."""
    embedding, layer, tail, head = _layout(model)
    sizes = [embedding] + layer * max(1, model.num_layers) + [tail] + ([head] if head else [])
    return [x for x in sizes if x > 0]


def _layout(model) -> tuple[int, list[int], int, int]:
    """(embedding, one layer's parameters in order, what follows the layers, untied LM head)."""
    embedding = model.vocab_size * model.hidden_size
    head = 0 if model.tie_embeddings else embedding
    layers = max(1, model.num_layers)
    per_layer = max(0, (model.params - embedding - head) // layers)
    weights = _layer_weights(model)
    if sum(weights) > per_layer:
        weights = [per_layer]  # a shape these formulas do not describe: one block per layer
    layer = weights + [per_layer - sum(weights)]
    tail = model.params - embedding - head - per_layer * layers  # the final norm, rounding
    return embedding, [x for x in layer if x > 0], tail, head


def _layer_weights(model) -> list[int]:
    """A decoder layer's projection weights, attention first, then the MLP or the experts
    (transformers 5 keeps all experts' gate+up and down projections as two 3-D tensors)."""
    h, d = model.hidden_size, model.head_dim
    q, kv = model.num_heads * d, model.num_kv_heads * d
    attention = [h * q, h * kv, h * kv, q * h]
    experts = getattr(model, "num_experts", 0)
    if experts:
        inner = model.moe_intermediate_size or model.intermediate_size
        mlp = [experts * h, experts * 2 * inner * h, experts * inner * h]
    else:
        mlp = [h * model.intermediate_size] * 3
    return attention + mlp


def _rank_row(sizes: list[int], starts: list[int], lo: int, hi: int) -> tuple[int, int]:
    """``(gradient buffer elements, largest slice)`` of the partition ``[lo, hi)``: the full size
    of every parameter overlapping it and the largest part of one inside it."""
    buffer = largest = 0
    index = max(0, bisect.bisect_right(starts, lo) - 1)
    while index < len(sizes) and starts[index] < hi:
        inside = min(hi, starts[index] + sizes[index]) - max(lo, starts[index])
        if inside > 0:
            buffer += sizes[index]
            largest = max(largest, inside)
        index += 1
    return buffer, largest


# The planner estimates dozens of candidates of one model: each layout is computed once
# (ModelSpec is a frozen dataclass, so it can key a cache).
@functools.lru_cache(maxsize=256)
def zero12_rank_grads(model, world: int) -> tuple[tuple[int, int], ...]:
    """Per rank, ``(gradient buffer elements, largest slice)``: the full size of every parameter
    overlapping the rank's partition (``copy_grads_in_partition``) and the largest slice one
    parameter has inside it, what the gradient norm converts to fp64 at once
    (``get_grad_norm_direct``). One row per rank: for a few ranks (tests, the probe); the
    estimate uses ``zero12_distinct_rank_grads``, whose size does not grow with the world."""
    if world <= 1:
        return ((model.params, max(ordered_param_numels(model))),)
    sizes = ordered_param_numels(model)
    starts = list(itertools.accumulate([0] + sizes[:-1]))
    part = math.ceil(sum(sizes) / world)
    return tuple(_rank_row(sizes, starts, rank * part, (rank + 1) * part) for rank in range(world))


@functools.lru_cache(maxsize=256)
def zero12_distinct_rank_grads(model, world: int) -> tuple[tuple[int, int], ...]:
    """The rows of ``zero12_rank_grads`` that can differ: two per parameter and one more,
    whatever the world size. A rank is either cut by a parameter's start (the rank holding each
    start), or lies inside one parameter, where every such rank has the same row (the rank after
    the start's is one), or is the last rank with elements; ranks past the elements hold
    nothing."""
    if world <= 1:
        return zero12_rank_grads(model, world)
    sizes = ordered_param_numels(model)
    starts = list(itertools.accumulate([0] + sizes[:-1]))
    part = math.ceil(sum(sizes) / world)
    ranks = {start // part + step for start in starts for step in (0, 1)}
    ranks.add((sum(sizes) - 1) // part)
    return tuple(
        _rank_row(sizes, starts, rank * part, (rank + 1) * part)
        for rank in sorted(ranks)
        if rank < world
    )


def zero12_grad_buffer_elements(model, world: int) -> int:
    """Elements of the largest ZeRO-1/2 gradient buffer on any rank."""
    return max(buffer for buffer, _ in zero12_distinct_rank_grads(model, world))


@functools.lru_cache(maxsize=256)
def zero3_kept_gathered_elements(model, reuse_distance: int, checkpointing: bool) -> int:
    """Elements ZeRO-3 keeps gathered at the end of forward because they are used again soon.

    After a module runs, DeepSpeed releases its gathered parameters unless they come back within
    ``stage3_max_reuse_distance`` elements of the recorded fetch order
    (``partitioned_param_coordinator.py:__params_to_release``: it walks the trace after the
    current step, counting each module's parameters, and keeps a parameter it meets before the
    count reaches the distance). The trace is forward, then backward in reverse, where
    checkpointing first re-runs each layer's forward. So a weight used late in forward, or the
    LM head, stays gathered into backward: with the default distance (1e9) that is the whole of
    a small model.
    """
    embedding, layer, tail, head = _layout(model)
    layers = max(1, model.num_layers)
    # (parameter id, elements) in fetch order; a tied LM head is the embedding's parameter
    head_entry = ("embedding", embedding) if not head else ("head", head)
    forward = [("embedding", embedding)]
    for i in range(layers):
        forward += [((i, j), size) for j, size in enumerate(layer)]
    forward += [("tail", tail), head_entry]
    backward = [head_entry, ("tail", tail)]
    for i in reversed(range(layers)):
        own = [((i, j), size) for j, size in enumerate(layer)]
        backward += (own if checkpointing else []) + list(reversed(own))
    backward.append(("embedding", embedding))
    trace = [entry for entry in forward + backward if entry[1] > 0]
    kept: dict = {}
    for index in range(len(forward)):
        name, size = trace[index]
        between = 0
        for later_name, later_size in trace[index + 1 :]:
            if between >= reuse_distance:
                break
            if later_name == name:
                kept[name] = size
                break
            between += later_size
    return sum(kept.values())
