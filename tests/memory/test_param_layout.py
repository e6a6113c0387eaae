"""Where ZeRO's partition boundaries cut the parameters: memory/param_layout.py.

The real 2-rank DeepSpeed runs in tests/memory/test_zero_multirank_probe.py check these rules on
engines; here they are checked on the layouts of published shapes, by hand arithmetic.

Run: .venv/bin/python -m pytest tests/memory/test_param_layout.py -q   (~1 s)
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from memory_shapes import QWEN25_05B, QWEN25_7B

from zerofit.memory import param_layout as pl
from zerofit.models.resolve import resolve_model


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen2.5-7b", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_the_layout_adds_up_to_the_exact_parameter_count(name):
    model = resolve_model(name)
    sizes = pl.ordered_param_numels(model)
    assert sum(sizes) == model.params and min(sizes) > 0
    # the embedding comes first; an untied LM head of the same size last
    assert sizes[0] == model.vocab_size * model.hidden_size
    assert (sizes[-1] == sizes[0]) == (not model.tie_embeddings)


def test_a_rank_holds_every_parameter_it_overlaps_in_full():
    """Qwen2.5-0.5B on 8 ranks: the 136M-element embedding is more than a partition (62M), so
    ranks 0 and 1 lie inside it and rank 2 starts in it: its buffer is the whole embedding plus
    the layers it owns."""
    model = QWEN25_05B
    embedding = model.vocab_size * model.hidden_size
    part = math.ceil(model.params / 8)
    assert embedding > 2 * part
    ranks = pl.zero12_rank_grads(model, 8)
    assert ranks[0] == (embedding, part) and ranks[1] == (embedding, part)
    buffer, largest = ranks[2]
    assert buffer > embedding and largest == embedding - 2 * part
    assert pl.zero12_grad_buffer_elements(model, 8) == max(b for b, _ in ranks)
    assert pl.zero12_grad_buffer_elements(model, 1) == model.params


def test_on_large_models_the_buffer_exceeds_the_partition_by_the_cut_parameters_only():
    model = QWEN25_7B
    for world in (2, 8, 64):
        part = math.ceil(model.params / world)
        sizes = pl.ordered_param_numels(model)
        buffer = pl.zero12_grad_buffer_elements(model, world)
        assert part <= buffer <= part + 2 * max(sizes)


def test_zero3_keeps_a_small_model_gathered_and_only_the_head_of_a_large_vocabulary():
    """A weight stays gathered when its next use is within stage3_max_reuse_distance elements of
    the fetch trace: all of a model under half the distance; with Qwen2.5-7B's 545M-element LM
    head between any layer and its backward, only the head itself."""
    small = QWEN25_05B
    assert pl.zero3_kept_gathered_elements(small, 10**9, checkpointing=False) == small.params
    assert pl.zero3_kept_gathered_elements(small, 0, checkpointing=False) == 0
    big = QWEN25_7B
    head = big.vocab_size * big.hidden_size
    assert pl.zero3_kept_gathered_elements(big, 10**9, checkpointing=False) == head


def test_checkpointing_brings_the_last_layer_back_sooner():
    """With checkpointing, backward re-runs the last layer's forward right after the LM head, so
    that layer's first weight comes back after the rest of its layer, the final norm and the head
    twice; without it, after the rest of its layer twice. A distance between the two keeps it
    gathered only with checkpointing."""
    model = dataclasses.replace(QWEN25_05B, vocab_size=1000, tie_embeddings=False)
    model = dataclasses.replace(model, params=sum(pl.ordered_param_numels(model)))
    _, layer, tail, head = pl._layout(model)
    first = layer[0]  # a layer's first weight (q_proj)
    rest = sum(layer) - first
    with_recompute = rest + 2 * tail + 2 * head
    without = 2 * rest + 2 * tail + 2 * head
    distance = (with_recompute + without) // 2
    plain = pl.zero3_kept_gathered_elements(model, distance, checkpointing=False)
    recomputed = pl.zero3_kept_gathered_elements(model, distance, checkpointing=True)
    assert recomputed - plain >= first


@pytest.mark.parametrize("world", [2, 3, 8, 100, 5000])
def test_the_distinct_rows_are_every_rank_row_the_layout_has(world):
    """The estimate reads at most two rows per parameter and the last rank's, whatever the world
    size; they are exactly the rows that occur among all ranks (ranks past the last element hold
    nothing)."""
    for model in (QWEN25_05B, QWEN25_7B):
        every = set(pl.zero12_rank_grads(model, world)) - {(0, 0)}
        assert set(pl.zero12_distinct_rank_grads(model, world)) == every
    parameters = len(pl.ordered_param_numels(QWEN25_7B))
    assert len(pl.zero12_distinct_rank_grads(QWEN25_7B, 10**8)) <= 2 * parameters + 1
