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
    counter sees as bmm: it computes GPT-2's masked half too, which flash-attention and SDPA
    without a mask skip, so the count is the one for a kernel that does not
    (``skips_masked_blocks=False``; the encoders and T5 compute the whole square anyway)."""
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
    terms = forward_flops_per_sequence(
        spec, COUNTED_SEQ, decoder_len=COUNTED_DECODER, skips_masked_blocks=False
    )
    forward = sum(terms.values())
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


# Packed samples under flash-attention's varlen kernel: each sample's tokens attend within the
# sample alone, so a packed row costs what its samples cost as separate sequences (the linear
# layers see the same tokens; attention runs one causal block per sample).
PACKED_ROW = 128


def _tiny_decoder(name: str, attention: str = "eager"):
    """A randomly initialised decoder on the CPU and its ModelSpec: a Llama layer (GQA, gated
    MLP) from LlamaConfig, or GPT-2 from the families' configs."""
    if name == "gpt2":
        model = build_family_model("gpt2", attention)
        return model, spec_from_config(family_config_json("gpt2"), "gpt2")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_cache=False,
        attn_implementation=attention,
    )
    fields = config.to_dict()
    fields.pop("transformers_version", None)
    return LlamaForCausalLM(config), spec_from_config(fields, "tiny-llama")


def _counted_forward_of_samples(model, lengths: list[int], vocab: int) -> int:
    """torch's FLOP counter over one forward per sample: the varlen kernel's work on a row
    that packs them (per-sample causal blocks, never the blocks across samples)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        for length in lengths:
            model(input_ids=torch.randint(1, vocab, (1, length)))
    return counter.get_total_flops()


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_packed_samples_of_one_length_count_as_separate_sequences(name):
    """Four 32-token samples packed into a 128-token row: speed/flops.py's count with
    ``sample_len`` 32 equals torch's FLOP counter over the four samples run apart (eager
    attention, whose matmuls the counter sees and which computes the masked half of each
    block too: the attention term counts twice there, as in the families' test above)."""
    model, spec = _tiny_decoder(name)
    counted = _counted_forward_of_samples(model, [32] * 4, spec.vocab_size)
    packed = forward_flops_per_sequence(spec, PACKED_ROW, sample_len=32)
    assert packed["layers"] + packed["lm_head"] + 2 * packed["attention"] == pytest.approx(
        counted, rel=0.01
    )
    whole_row = forward_flops_per_sequence(spec, PACKED_ROW)
    assert packed["attention"] == pytest.approx(whole_row["attention"] * 32 / PACKED_ROW)
    assert packed["layers"] == whole_row["layers"]
    assert packed["lm_head"] == whole_row["lm_head"]


def test_packed_samples_of_mixed_lengths_count_at_least_the_mean():
    """Samples of 16, 48 and 64 tokens in one 128-token row: their attention is sum L_i^2
    (torch's counter over the three run apart), which the mean length alone (128 x 42.7)
    bounds from below, as ``packed_attention_share`` says."""
    model, spec = _tiny_decoder("llama")
    lengths = [16, 48, 64]
    counted = _counted_forward_of_samples(model, lengths, spec.vocab_size)
    mean = sum(lengths) / len(lengths)
    by_mean = forward_flops_per_sequence(spec, PACKED_ROW, sample_len=round(mean))
    linear = by_mean["layers"] + by_mean["lm_head"]
    squares = sum(length * length for length in lengths)
    exact = forward_flops_per_sequence(spec, PACKED_ROW)["attention"] * squares / PACKED_ROW**2
    # eager computes each block's masked half too: the attention term counts twice
    assert linear + 2 * exact == pytest.approx(counted, rel=0.01)
    assert linear + 2 * by_mean["attention"] < counted
    assert by_mean["attention"] < exact


def test_without_packed_samples_the_count_is_unchanged():
    """No sample length, or samples as long as the row (or longer: cut to it), count the whole
    row's attention as before; the encoders and T5 ignore it."""
    llama = resolve_model("llama-3.1-8b")
    whole = forward_flops_per_sequence(llama, 4096)
    assert forward_flops_per_sequence(llama, 4096, sample_len=None) == whole
    assert forward_flops_per_sequence(llama, 4096, sample_len=4096) == whole
    assert forward_flops_per_sequence(llama, 4096, sample_len=10_000) == whole
    assert estimate_step_flops(llama, seq_len=4096, sequences=2, sample_len=None) == (
        estimate_step_flops(llama, seq_len=4096, sequences=2)
    )
    bert = spec_from_config(family_config_json("bert"), "bert")
    assert forward_flops_per_sequence(bert, 256, sample_len=64) == (
        forward_flops_per_sequence(bert, 256)
    )


def test_packed_step_flops_shrink_attention_in_every_phase():
    """Forward, backward (two of the products' forwards) and checkpointing's recompute each
    lose the same attention share; the matmuls with weights keep theirs."""
    model = resolve_model("qwen2.5-7b")
    whole = estimate_step_flops(model, seq_len=16384, sequences=1, gradient_checkpointing=True)
    packed = estimate_step_flops(
        model, seq_len=16384, sequences=1, gradient_checkpointing=True, sample_len=4096
    )
    attention = forward_flops_per_sequence(model, 16384)["attention"]
    saved = attention * (1 - 4096 / 16384)
    assert whole.forward - packed.forward == pytest.approx(saved)
    assert whole.backward - packed.backward == pytest.approx(2 * saved)
    assert whole.recompute - packed.recompute == pytest.approx(saved)


# Whether the attention kernel skips the blocks a causal mask hides (speed/step_time.py
# ``attention_skips_masked_blocks``): eager never does, SDPA only when transformers hands it no
# mask. torch's FLOP counter cannot see a kernel's skipped blocks (``flop_counter.sdpa_flop``
# counts the op's whole square), so the kernel side is cited there and the tests below check
# what transformers hands the kernel and what eager's matmuls compute.
PADDED_ROW = 64


def _padded_batch(vocab: int) -> dict:
    """Two rows of ``PADDED_ROW`` token ids, the second right-padded after 40 real tokens."""
    import torch

    torch.manual_seed(0)
    mask = torch.ones(2, PADDED_ROW, dtype=torch.long)
    mask[1, 40:] = 0
    return {"input_ids": torch.randint(1, vocab, (2, PADDED_ROW)), "attention_mask": mask}


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_eager_attention_computes_the_whole_square(name):
    """Eager attention (``eager_attention_forward``: matmul over every query and key, then the
    mask) runs the whole seq x seq products whether the batch is padded or not: torch's FLOP
    counter on the real forward matches ``skips_masked_blocks=False``, twice the causal half."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model, spec = _tiny_decoder(name)
    batch = _padded_batch(spec.vocab_size)
    whole = forward_flops_per_sequence(spec, PADDED_ROW, skips_masked_blocks=False)
    half = forward_flops_per_sequence(spec, PADDED_ROW)
    assert whole["attention"] == pytest.approx(2 * half["attention"])
    assert {whole["layers"], whole["lm_head"]} == {half["layers"], half["lm_head"]}
    for inputs in (batch, {"input_ids": batch["input_ids"]}):
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(**inputs)
        assert counter.get_total_flops() == pytest.approx(2 * sum(whole.values()), rel=0.01)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_transformers_gives_sdpa_a_mask_only_on_padded_batches(name, monkeypatch):
    """What transformers hands torch's SDPA (integrations/sdpa_attention.py
    ``sdpa_attention_forward``): no mask and ``is_causal=True`` for rows without padding, the
    kernels' causal path that skips the hidden blocks; the padded batch's 4D mask and
    ``is_causal=False`` otherwise, which rules out the flash kernel and runs the
    memory-efficient one over every block (speed/step_time.py ``CAUSAL_SKIPPING_ATTENTION``)."""
    import torch

    model, spec = _tiny_decoder(name, "sdpa")
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(*args, **kwargs):
        calls.append((kwargs.get("attn_mask") is not None, kwargs.get("is_causal")))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    batch = _padded_batch(spec.vocab_size)
    with torch.no_grad():
        model(input_ids=batch["input_ids"], attention_mask=torch.ones_like(batch["input_ids"]))
        unpadded, calls[:] = list(calls), []
        model(**batch)
    assert unpadded and set(unpadded) == {(False, True)}
    assert calls and set(calls) == {(True, False)}
