"""The decoder layer traced on fake tensors (memory/layer_trace.py) against the closed formulas at
full size, and against the same layer run on real tensors.

Run: .venv/bin/python -m pytest tests/memory/test_layer_trace.py -q   (~30 s, mostly imports)
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import REPO
from memory_probe import saved_tensor_bytes
from memory_shapes import TINY_DECODER

from zerofit.memory import activations as act
from zerofit.memory import layer_trace
from zerofit.models.resolve import builtin_config, resolve_model, spec_from_config

pytest.importorskip("transformers")

REPORT_MODELS = REPO / "tests" / "data" / "public_report_models"
# the real-tensor comparison runs a tiny decoder; special token ids must lie in its vocabulary
TINY = dict(TINY_DECODER, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.mark.parametrize("name", ["qwen2.5-7b", "llama-3.1-8b", "qwen3-8b", "gemma-7b"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("residual", [2, 4], ids=["bf16", "fp32-weights-autocast"])
def test_trace_agrees_with_the_formulas_at_full_size(name, attention, residual):
    """Two independent derivations of the same layer at its real width: the closed formulas
    (checked tensor by tensor on tiny real modules in test_activations.py) and the fake-tensor
    trace of transformers' code. They agree to a few bytes per token (the RMSNorms' fp32
    rsqrt, one float per token, is left out of the formulas)."""
    if name == "gemma-7b":
        config = json.loads((REPORT_MODELS / "gemma-7b.json").read_text())
        model = spec_from_config(config, name)
    else:
        config, model = builtin_config(name), resolve_model(name)
    trace = layer_trace.trace_decoder_layer(json.dumps(config), 2, attention, residual)
    assert trace is not None
    formula = act.layer_bytes_per_token(model, 2, attention, residual)
    print(f"{name} {attention} r={residual}: traced {trace.per_token:,} formula {formula:,}")
    assert trace.per_token == pytest.approx(formula, rel=0.005)
    assert trace.scores == act.scores_bytes(model, 2, 1, 1, attention)  # sdpa keeps none
    assert trace.attention == ("eager" if attention == "eager" else "kernel")


def _real_layer(family: str, attention: str, **shape) -> tuple[int, int]:
    """Per-token and per-seq**2 bytes of one decoder layer on real CPU tensors (real bf16
    weights, transformers' own mask handling): what layer_trace must reproduce."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    def saved(layers: int, seq: int) -> int:
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(
            family, attn_implementation=attention, use_cache=False, **{**TINY, **shape}
        )
        cfg.num_hidden_layers = layers
        model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).train()
        input_ids = torch.randint(3, 2000, (1, seq))
        return saved_tensor_bytes(model, lambda: model(input_ids=input_ids))

    lengths = layer_trace.TRACE_LENGTHS
    return layer_trace._solve(lengths, [saved(2, s) - saved(1, s) for s in lengths])


@pytest.mark.parametrize(
    "family,attention,shape",
    [
        ("gemma2", "eager", {}),  # no sdpa in transformers: soft-capped eager attention
        ("phi3", "sdpa", {}),  # fused qkv projection: v is a view of it
        ("cohere", "sdpa", {}),  # parallel attention and MLP over one LayerNorm
        ("starcoder2", "sdpa", {}),  # biased non-gated GELU MLP
        ("exaone4", "sdpa", {}),  # post-norms and per-head q/k norms
    ],
)
def test_fake_trace_matches_real_tensors(family, attention, shape):
    """The fake-tensor trace keeps exactly what the same layer keeps on real tensors (fake
    tensors only skip the memory), for architectures the formulas do not cover."""
    config = {"model_type": family, **TINY, **shape}
    trace = layer_trace.trace_decoder_layer(json.dumps(config), 2, attention, 2)
    assert trace is not None
    real_per_token, real_scores = _real_layer(family, attention, **shape)
    print(f"{family}: fake {trace.per_token:,}+{trace.scores}s^2 real {real_per_token:,}")
    assert trace.per_token == pytest.approx(real_per_token, rel=0.01)
    assert trace.scores == pytest.approx(real_scores, rel=0.01)


def test_gemma2_runs_eager_attention_and_keeps_softcapped_scores():
    """transformers has no sdpa for Gemma2 (``Gemma2PreTrainedModel._supports_sdpa = False``:
    sdpa cannot soft-cap), so asking for sdpa runs eager attention. Per head and per score the
    layer keeps the soft-capped tanh output (bf16, saved by the multiply back by the cap), the
    fp32 softmax and its bf16 cast: 2 + 4 + 2 bytes. Flash attention keeps none of them."""
    config = json.loads((REPORT_MODELS / "gemma-2-9b.json").read_text())
    model = spec_from_config(config, "gemma-2-9b")
    eager = act.traced_layer(model, 2, "sdpa")
    assert eager.attention == "eager" and eager.scores == model.num_heads * (2 + 4 + 2)
    assert act.activations_basis(model, 2, "sdpa") == "traced_eager"
    flash = act.traced_layer(model, 2, "flash_attention_2")
    assert flash.attention == "kernel" and flash.scores == 0
    assert act.activations_basis(model, 2, "flash_attention_2") == "traced"
    # the scores dominate a long sequence: 8k tokens keep more than the per-token tensors
    seq = 8192
    stored = act.stored_activation_bytes(model, 2, act.LayerBatch(1, seq, "sdpa"), False)
    per_token_only = model.num_layers * eager.per_token * seq
    assert stored > 2 * per_token_only


def test_a_remote_code_family_keeps_the_llama_shaped_layer():
    """Baichuan's modeling code lives in its hub repo and zerofit never runs it: no trace, and the
    estimate says its layer is Llama-shaped."""
    config = json.loads((REPORT_MODELS / "baichuan-13b.json").read_text())
    model = spec_from_config(config, "baichuan-13b")
    assert act.traced_layer(model, 2, "sdpa") is None
    assert act.activations_basis(model, 2, "sdpa") == "llama_shaped"
    llama_shaped = dataclasses.replace(model, architecture="llama")
    assert act.layer_bytes_per_token(model, 2) == act.layer_bytes_per_token(llama_shaped, 2)


def test_formula_families_are_not_traced():
    """A formula family never pays for a trace (nor imports transformers for it)."""
    model = resolve_model("qwen2.5-7b")
    assert act.traced_layer(model, 2, "sdpa") is None
    assert act.activations_basis(model, 2, "sdpa") == "formula"


def test_traces_are_cached_on_disk(tmp_path, monkeypatch):
    """A trace (and an architecture that cannot be traced) is computed once per config and
    library versions: the next process reads it from the cache without importing transformers."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    layer_trace.trace_decoder_layer.cache_clear()  # earlier tests traced in this process
    config = json.dumps({"model_type": "phi3", **TINY})
    baichuan = (REPORT_MODELS / "baichuan-13b.json").read_text()
    first = layer_trace.trace_decoder_layer(config, 2, "sdpa", 2)
    assert layer_trace.trace_decoder_layer(baichuan, 2, "sdpa", 2) is None
    assert (tmp_path / "zerofit" / "layer_traces.json").is_file()
    layer_trace.trace_decoder_layer.cache_clear()  # a new process: only the disk cache is left

    def no_trace(*args):
        raise AssertionError("traced again instead of reading the cache")

    monkeypatch.setattr(layer_trace, "_trace", no_trace)
    assert layer_trace.trace_decoder_layer(config, 2, "sdpa", 2) == first
    assert layer_trace.trace_decoder_layer(baichuan, 2, "sdpa", 2) is None
    layer_trace.trace_decoder_layer.cache_clear()
