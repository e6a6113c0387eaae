"""Training FLOPs from a model's shape against the 6·N·tokens rule and attention's growth.

Run: .venv/bin/python -m pytest tests/speed/test_flops.py -q   (<1 s)
"""

from __future__ import annotations

import pytest

from zerofit.models.resolve import resolve_model
from zerofit.speed.flops import estimate_step_flops, forward_flops_per_sequence, six_n_flops


def non_embedding_params(name: str) -> int:
    """Parameters less the input embedding (a lookup, no FLOPs): the N of 6·N·tokens."""
    model = resolve_model(name)
    return model.params - (0 if model.tie_embeddings else model.vocab_size * model.hidden_size)


@pytest.mark.parametrize("name", ["qwen2.5-7b", "llama-3.1-8b", "qwen2.5-0.5b", "qwen3-14b"])
def test_dense_model_at_short_sequence_is_six_n_tokens(name):
    model = resolve_model(name)
    flops = estimate_step_flops(model, seq_len=128, sequences=4)
    expected = six_n_flops(non_embedding_params(name), 128 * 4)
    assert flops.total == pytest.approx(expected, rel=0.03)


def test_moe_counts_the_active_experts_only():
    model = resolve_model("qwen3-30b-a3b")
    flops = estimate_step_flops(model, seq_len=128, sequences=1)
    active = model.active_params - model.vocab_size * model.hidden_size  # untied head
    assert flops.total == pytest.approx(six_n_flops(active, 128), rel=0.03)
    assert flops.total < 0.2 * six_n_flops(model.params, 128)


def test_attention_term_grows_with_the_square_of_the_sequence():
    model = resolve_model("llama-3.1-8b")
    short = forward_flops_per_sequence(model, 1024)
    long = forward_flops_per_sequence(model, 8192)
    assert long["attention"] == pytest.approx(64 * short["attention"])
    assert long["layers"] == pytest.approx(8 * short["layers"])
    # at 8k tokens causal attention is ~ seq * width / (6 * hidden^2 + ...) of the layers' matmuls:
    # for Llama 3.1 8B a sizeable share, and per token it grows with the sequence
    assert 0.1 < long["attention"] / long["layers"] < 0.3
    per_token_short = sum(short.values()) / 1024
    per_token_long = sum(long.values()) / 8192
    assert per_token_long > 1.1 * per_token_short


def test_checkpointing_adds_one_forward_of_the_layers():
    model = resolve_model("qwen2.5-7b")
    plain = estimate_step_flops(model, seq_len=2048, sequences=1)
    recomputed = estimate_step_flops(model, seq_len=2048, sequences=1, gradient_checkpointing=True)
    assert plain.recompute == 0
    assert recomputed.total / plain.total == pytest.approx(4 / 3, rel=0.02)
    assert recomputed.recompute < recomputed.forward  # the LM head is not recomputed


def test_frozen_weights_skip_the_weight_gradients():
    model = resolve_model("qwen2.5-7b")
    full = estimate_step_flops(model, seq_len=1024, sequences=1)
    lora = estimate_step_flops(model, seq_len=1024, sequences=1, frozen_weights=True)
    assert lora.total == pytest.approx(2 / 3 * full.total, rel=0.02)
    assert lora.total > 2 / 3 * full.total  # attention's backward keeps both of its products
