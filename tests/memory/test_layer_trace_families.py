"""The layer traced on fake tensors (memory/layer_trace.py) for the families that are not Llama
decoders: GPT-2, BERT, RoBERTa, DeBERTa-v2 (masked LM) and T5 (seq2seq LM, one encoder and one
decoder block per layer), against the same layers run on real CPU tensors.

Run: .venv/bin/python -m pytest tests/memory/test_layer_trace_families.py -q   (~40 s)
"""

from __future__ import annotations

import json

import pytest
from memory_probe import saved_tensor_bytes
from model_families import (
    DEBERTA_V3_LAYOUT,
    build_family_model,
    family_config_json,
    family_inputs,
)

from zerofit.memory import activations as act
from zerofit.memory import layer_trace
from zerofit.models.resolve import spec_from_config

pytest.importorskip("transformers")


def run_as_on_a_gpu(monkeypatch, attention: str) -> None:
    """Dropout as CUDA runs it, on the CPU: the fused ``native_dropout`` and its bool mask
    (the CPU's multiplies by a bf16 noise tensor; layer_trace._fused_dropout says where);
    under sdpa, no dropout inside the attention kernel (GPU kernels drop inside and keep the
    RNG state; the CPU's math fallback would keep seq x seq masks)."""
    import torch

    def fused_dropout(input, p=0.5, training=True, inplace=False):
        return torch.native_dropout(input, p, True)[0] if training and p > 0 else input

    monkeypatch.setattr(torch.nn.functional, "dropout", fused_dropout)
    if attention == "sdpa":
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def sdpa_without_dropout(*args, **kwargs):
            return sdpa(*args, **{**kwargs, "dropout_p": 0.0})

        monkeypatch.setattr(
            torch.nn.functional, "scaled_dot_product_attention", sdpa_without_dropout
        )


def _real_layer(name: str, attention: str, monkeypatch, batch: int = 1) -> tuple[int, int]:
    """Per-token and per-seq**2 bytes one layer of ``name`` keeps on real CPU tensors (bf16
    weights) for a micro batch of ``batch`` sequences, from the difference between the model at
    its depth and at one layer, dropout run as on a GPU (``run_as_on_a_gpu``)."""
    import torch

    run_as_on_a_gpu(monkeypatch, attention)
    fields = family_config_json(name)
    depth = fields.get("num_layers") or fields.get("n_layer") or fields["num_hidden_layers"]
    if fields["model_type"] == "deberta-v2":  # no sdpa: transformers' default is eager
        attention = "eager"

    def saved(layers: int, seq: int) -> int:
        torch.manual_seed(0)
        model = build_family_model(name, attention, num_layers=layers).to(torch.bfloat16).train()
        inputs = family_inputs(name, batch, seq, seq)
        if "attention_mask" not in inputs and fields["model_type"] == "deberta-v2":
            inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        return saved_tensor_bytes(model, lambda: model(**inputs))

    lengths = layer_trace.TRACE_LENGTHS
    one_layer = [(saved(depth, s) - saved(1, s)) / (depth - 1) for s in lengths]
    return layer_trace._solve(lengths, one_layer)


@pytest.mark.parametrize(
    "name,attention",
    [
        ("gpt2", "sdpa"),
        ("gpt2", "eager"),
        ("bert", "sdpa"),
        ("roberta", "sdpa"),
        ("deberta-v3", "sdpa"),  # no sdpa in DisentangledSelfAttention: eager attention
        ("deberta-v2-conv", "eager"),
        ("t5", "sdpa"),  # the relative position bias is sdpa's float mask, kept per layer
        ("t5", "eager"),
    ],
)
def test_fake_trace_matches_real_tensors(name, attention, monkeypatch):
    """The fake-tensor trace keeps what the real layer keeps on real tensors (fake tensors only
    skip the memory): the trace now builds these families' training models, where it used to
    give up on T5 and DeBERTa-v2 (no causal-LM class) and fall back to a Llama-shaped layer.
    DeBERTa-v2's relative-position indices are seq x seq tensors a micro batch keeps once, not
    once per sequence (``shared_scores``)."""
    config = family_config_json(name)
    trace = layer_trace.trace_decoder_layer(json.dumps(config), 2, attention, 2)
    assert trace is not None
    real_per_token, real_scores = _real_layer(name, attention, monkeypatch)
    print(
        f"{name} {attention}: fake {trace.per_token:,} + ({trace.scores} per sequence + "
        f"{trace.shared_scores} shared) s^2, real {real_per_token:,} + {real_scores} s^2"
    )
    assert trace.per_token == pytest.approx(real_per_token, rel=0.01)
    assert trace.scores + trace.shared_scores == pytest.approx(real_scores, rel=0.01, abs=1)
    # two sequences: twice the per-token and per-sequence bytes, the shared ones once (the split
    # is solved from one length and rounded to whole bytes: within 2 bytes per s^2 of the real)
    two_per_token, two_scores = _real_layer(name, attention, monkeypatch, batch=2)
    assert two_per_token == pytest.approx(2 * trace.per_token, rel=0.01)
    assert two_scores == pytest.approx(2 * trace.scores + trace.shared_scores, abs=2)


def _real_layer_bytes(name: str, attention: str, monkeypatch, batch: int, lengths) -> float:
    """Bytes one layer of the encoder-decoder ``name`` keeps on real CPU tensors (bf16 weights)
    for ``batch`` pairs of ``lengths`` (source, target) tokens, as ``_real_layer`` measures."""
    import torch

    run_as_on_a_gpu(monkeypatch, attention)
    depth = family_config_json(name)["num_layers"]

    def saved(layers: int) -> int:
        torch.manual_seed(0)
        model = build_family_model(name, attention, num_layers=layers).to(torch.bfloat16).train()
        inputs = family_inputs(name, batch, *lengths)
        return saved_tensor_bytes(model, lambda: model(**inputs))

    return (saved(depth) - saved(1)) / (depth - 1)


@pytest.mark.parametrize("name,attention", [("t5", "sdpa"), ("t5", "eager"), ("t5-v1.1", "sdpa")])
def test_encoder_decoder_layer_with_its_own_target_length_matches_real_tensors(
    name, attention, monkeypatch
):
    """The layer traced with source and target lengths apart (layer_trace.
    trace_encoder_decoder_layer) gives the equal-length layer back when the two are equal, and
    at lengths it was not traced at (160 source, 48 target tokens, two sequences) what the real
    layer keeps on real tensors: the encoder block scales with the source, the decoder block
    with the target, eager cross-attention's scores with both."""
    config = json.dumps(family_config_json(name))
    split = layer_trace.trace_encoder_decoder_layer(config, 2, attention, 2)
    equal = layer_trace.trace_decoder_layer(config, 2, attention, 2)
    assert split is not None and equal is not None
    for micro, seq in ((1, 96), (2, 160)):
        scores = (equal.scores * micro + equal.shared_scores) * seq * seq
        assert split.layer_bytes(micro, seq, seq) == pytest.approx(
            equal.per_token * micro * seq + scores, rel=0.001
        )
    real = _real_layer_bytes(name, attention, monkeypatch, batch=2, lengths=(160, 48))
    traced = split.layer_bytes(2, 160, 48)
    print(f"{name} {attention} 160/48: traced {traced:,} real {real:,.0f} ({split})")
    assert traced == pytest.approx(real, rel=0.01)
    assert (split.cross_scores > 0) == (attention == "eager")  # sdpa keeps no t x s tensor


def test_a_decoder_only_model_has_no_encoder_decoder_trace():
    """GPT-2 reads one sequence: no layer with a target length of its own."""
    config = json.dumps(family_config_json("gpt2"))
    assert layer_trace.trace_encoder_decoder_layer(config, 2, "sdpa", 2) is None


@pytest.mark.parametrize("name", ["t5", "deberta-v3"])
def test_t5_and_deberta_are_traced_not_llama_shaped(name):
    """The estimate's activations come from the family's own layer: T5 keeps its relative
    position bias as a seq x seq mask even under sdpa; DeBERTa-v2 runs eager attention (its
    disentangled attention has no kernel) and says so."""
    model = spec_from_config(family_config_json(name), name)
    trace = act.traced_layer(model, 2, "sdpa")
    assert trace is not None and trace.scores > 0
    expected = "traced" if name == "t5" else "traced_eager_only"
    assert act.activations_basis(model, 2, "sdpa") == expected


# (family config fields, micro batch, seq len) of the whole-step probes: activation-bound shapes
WHOLE_STEP = {
    "gpt2": dict(n_embd=256, n_layer=4, n_head=4, bos_token_id=0, eos_token_id=0),
    "bert": dict(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
    ),
    "deberta-v2": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        position_buckets=64,
        **DEBERTA_V3_LAYOUT,
    ),
    "t5": dict(
        d_model=256,
        d_kv=64,
        d_ff=1024,
        num_layers=4,
        num_heads=4,
        feed_forward_proj="gated-gelu",
        decoder_start_token_id=0,
    ),
}


def whole_step_peaks(
    family: str, monkeypatch, micro: int, seq: int, target_len: int | None = None
) -> tuple[int, int]:
    """(measured, predicted) peak bytes of the second training step of the family's real model
    (``WHOLE_STEP``) on CPU: stage 0 without DeepSpeed, bf16 weights, forward with labels,
    backward, foreach AdamW, tracked by MemTracker (tests/memory_probe.py), dropout run as on a
    GPU (``run_as_on_a_gpu``). ``target_len``: T5's labels that long (None: the inputs)."""
    import torch
    from memory_probe import make_optimizer_states, tracked_peak
    from transformers import AutoConfig

    from zerofit.memory.estimate import TrainSetup, estimate_memory
    from zerofit.models.resolve import training_model_class

    fields = {**WHOLE_STEP[family], "vocab_size": 2000}
    attention = "eager" if family == "deberta-v2" else "sdpa"
    run_as_on_a_gpu(monkeypatch, attention)
    torch.manual_seed(0)
    config = AutoConfig.for_model(family, attn_implementation=attention, use_cache=False, **fields)
    model = training_model_class(config).from_config(config).to(torch.bfloat16).train()
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    ids = torch.randint(3, 2000, (micro, seq))
    labels = ids if target_len is None else torch.randint(3, 2000, (micro, target_len))
    inputs = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}

    def step():
        model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    make_optimizer_states(model, optimizer)
    measured, _, _ = tracked_peak(step, model, optimizer)
    spec = spec_from_config({"model_type": family, **fields}, family)
    setup = TrainSetup(
        stage=0,
        stack="accelerate",
        weights_dtype="bf16",
        micro_batch=micro,
        seq_len=seq,
        target_len=target_len,
        optimizer="adamw_torch",
        padded=False,
    )
    return measured, estimate_memory(spec, setup).peak_bytes


@pytest.mark.parametrize("family", list(WHOLE_STEP))
def test_a_whole_step_with_the_traced_layer_matches_torch(family, monkeypatch):
    """The estimate's peak, whose activations come from the traced layer, is within a few % of
    what torch allocates in a whole step (``whole_step_peaks``)."""
    measured, predicted = whole_step_peaks(family, monkeypatch, micro=2, seq=256)
    error = predicted / measured - 1
    print(f"{family}: measured {measured:,} predicted {predicted:,} ({error:+.1%})")
    assert predicted == pytest.approx(measured, rel=0.03)


@pytest.mark.parametrize("seq,target", [(128, 32), (128, 128)])
def test_t5_with_shorter_targets_matches_torch(seq, target, monkeypatch):
    """T5 with its own target length (``TrainSetup.target_len``): the encoder over ``seq``
    tokens, the decoder, the LM head and the loss over ``target``; a micro batch of 8 makes the
    activations the peak. Within the same few % as the equal-length step (a ``target_len`` equal
    to ``seq_len`` is that step's count), where counting the targets as long as the inputs
    overestimates 128 / 32 by about half."""
    measured, predicted = whole_step_peaks("t5", monkeypatch, micro=8, seq=seq, target_len=target)
    error = predicted / measured - 1
    print(f"t5 {seq}/{target}: measured {measured:,} predicted {predicted:,} ({error:+.1%})")
    assert predicted == pytest.approx(measured, rel=0.03)
