"""Training FLOPs from a model's shape against the 6·N·tokens rule and attention's growth.

Run: .venv/bin/python -m pytest tests/speed/test_flops.py -q   (~10 s: the FLOP-counter checks
import transformers and run tiny models)
"""

from __future__ import annotations

import pytest
from model_families import FAMILY_CONFIGS, build_family_model, family_config_json, family_inputs

from zerofit.models.resolve import resolve_model, spec_from_config
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


# the families counted from their own modules (speed/flops.py FAMILY_FORWARD_TERMS): a length and
# a T5 target length that differ, so that a swapped encoder / decoder term shows
COUNTED_SEQ, COUNTED_DECODER = 96, 40


@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_family_flops_match_torchs_flop_counter(name):
    """Forward and backward FLOPs of one sequence against torch's own FLOP counter
    (``torch.utils.flop_counter.FlopCounterMode``: every mm / addmm / bmm / convolution the real
    modules dispatch) on the family's randomly initialised model. Eager attention, which the
    counter sees as bmm: it computes GPT-2's masked half too, which the kernels skip and
    speed/flops.py does not count, so GPT-2's products count twice here."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = build_family_model(name).train()
    spec = spec_from_config(family_config_json(name), name)
    torch.manual_seed(0)
    inputs = family_inputs(name, 1, COUNTED_SEQ, COUNTED_DECODER)
    with FlopCounterMode(display=False) as forward_counter:
        logits = model(**inputs).logits
    with FlopCounterMode(display=False) as backward_counter:
        logits.float().sum().backward()
    terms = forward_flops_per_sequence(spec, COUNTED_SEQ, decoder_len=COUNTED_DECODER)
    masked_half = 2 if spec.architecture == "gpt2" else 1
    forward = terms["layers"] + terms["lm_head"] + masked_half * terms["attention"]
    counted = forward_counter.get_total_flops()
    print(f"{name}: counter {counted:,} zerofit {forward:,.0f} ({counted / forward - 1:+.3%})")
    assert forward == pytest.approx(counted, rel=0.01)
    # every matmul's backward is two of its size (input and weight gradients): speed/flops.py's 2x
    assert backward_counter.get_total_flops() == pytest.approx(2 * counted, rel=0.01)


def test_gpt2_mlp_width_is_n_inner_or_four_times_n_embd():
    """GPT2Block: ``inner_dim = n_inner if n_inner is not None else 4 * hidden_size``."""
    default = spec_from_config(family_config_json("gpt2"), "gpt2")
    explicit = spec_from_config(family_config_json("gpt2-n_inner"), "gpt2-n_inner")
    assert default.intermediate_size == 4 * default.hidden_size
    assert explicit.intermediate_size == 80


def test_t5_targets_cost_less_than_inputs_of_the_same_length():
    """T5's encoder runs the inputs, its decoder (self- and cross-attention, the LM head) the
    targets: at a fixed input length, shorter targets cut the decoder's and the head's FLOPs
    only, and the cross-attention's k / v still run over every input token."""
    spec = spec_from_config(family_config_json("t5"), "t5")
    same = forward_flops_per_sequence(spec, 512)
    short = forward_flops_per_sequence(spec, 512, decoder_len=128)
    assert short["lm_head"] == pytest.approx(same["lm_head"] / 4)
    assert short["layers"] < same["layers"]
    encoder_and_cross_kv = forward_flops_per_sequence(spec, 512, decoder_len=1)["layers"]
    assert short["layers"] > encoder_and_cross_kv
    steps = estimate_step_flops(spec, seq_len=512, sequences=2, decoder_len=128)
    assert steps.forward == pytest.approx(2 * sum(short.values()))


def test_encoders_count_the_whole_attention_and_decoders_half():
    """BERT's attention is bidirectional (every score computed); GPT-2's is causal and the
    sdpa / flash kernels skip the masked half, as for the Llama-style decoders."""
    bert = spec_from_config(family_config_json("bert"), "bert")
    gpt2 = spec_from_config(family_config_json("gpt2"), "gpt2")
    seq = 1024
    assert forward_flops_per_sequence(bert, seq)["attention"] == pytest.approx(
        2 * 2 * seq * seq * bert.hidden_size * bert.num_layers
    )
    assert forward_flops_per_sequence(gpt2, seq)["attention"] == pytest.approx(
        2 * seq * seq * gpt2.hidden_size * gpt2.num_layers
    )
