"""Analytic activation bytes vs the tensors autograd really saves in transformers' Qwen2 (CPU,
tiny).

Run: .venv/bin/python -m pytest tests/memory/test_activations.py -q
(~10 s, mostly importing transformers)
"""

from __future__ import annotations

import pytest
from memory_probe import saved_tensor_bytes
from memory_shapes import TINY_DECODER, ModelSpec

from zerofit.memory import activations as act

TINY = ModelSpec(
    name="tiny",
    architecture="Qwen2ForCausalLM",
    hidden_size=128,
    intermediate_size=352,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    vocab_size=2000,
    tie_embeddings=True,
    params=0,
    active_params=0,
)


def _saved_bytes(
    checkpointing: bool,
    batch: int = 2,
    seq: int = 64,
    autocast_fp32_weights: bool = False,
    family: str = "qwen2",
    padded: bool = False,
    **shape,
) -> int:
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    dense = dict(TINY_DECODER, tie_word_embeddings=True)
    cfg = AutoConfig.for_model(
        family, attn_implementation="sdpa", use_cache=False, **{**dense, **shape}
    )
    model = AutoModelForCausalLM.from_config(cfg).train()
    if not autocast_fp32_weights:
        model = model.to(torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # fp32 weights train under autocast, as accelerate and the HF Trainer run them without
    # DeepSpeed (Accelerator.autocast); bf16 weights need none
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_fp32_weights)
    inputs = {"input_ids": torch.randint(0, 2000, (batch, seq))}
    if padded:
        inputs["attention_mask"] = _padded_mask(torch, batch, seq)

    def forward():
        with autocast:
            hidden = model.model(**inputs).last_hidden_state
            model.lm_head(hidden)

    return saved_tensor_bytes(model, forward)


def _padded_mask(torch, batch: int, seq: int):
    """An attention mask whose last row ends in padding, as a collator pads a shorter sequence."""
    mask = torch.ones((batch, seq), dtype=torch.long)
    mask[-1, seq - seq // 4 :] = 0
    return mask


@pytest.mark.parametrize("checkpointing", [False, True])
def test_stored_activations_match_autograd(checkpointing):
    traced = _saved_bytes(checkpointing)
    predicted = act.stored_activation_bytes(TINY, 2, act.LayerBatch(2, 64, "sdpa"), checkpointing)
    # the remainder is token ids and the shared RoPE cos/sin tables
    assert predicted == pytest.approx(traced, rel=0.03)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fp32_weights_under_autocast_keep_an_fp32_residual_and_weight_casts(checkpointing):
    """Without DeepSpeed, fp32 weights run under autocast: the residual stream and the RMSNorms
    stay fp32, every projection saves its own bf16 cast of its input, and the bf16 casts of the
    weights are saved too (only the lm_head's under checkpointing)."""
    from zerofit.memory import states as st

    traced = _saved_bytes(checkpointing, autocast_fp32_weights=True)
    tiny = _with_params(TINY)
    batch = act.LayerBatch(2, 64, "sdpa", residual=4)
    stored = act.stored_activation_bytes(tiny, 2, batch, checkpointing)
    if checkpointing:
        casts = tiny.vocab_size * tiny.hidden_size * 2  # lm_head's weight (tied), outside
    else:
        casts = st.autocast_weight_bytes(tiny, 2)
    print(f"autocast checkpointing={checkpointing}: traced {traced:,} predicted {stored + casts:,}")
    assert stored + casts == pytest.approx(traced, rel=0.03)


def _with_params(spec: ModelSpec) -> ModelSpec:
    """TINY with its real parameter count (a tied Qwen2: embedding + layers + final norm)."""
    import dataclasses

    h, i, layers = spec.hidden_size, spec.intermediate_size, spec.num_layers
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    attention = h * q + q + 2 * (h * kv + kv) + q * h  # q/k/v with Qwen2's biases, o without
    layer = attention + 3 * h * i + 2 * h
    params = spec.vocab_size * h + layers * layer + h
    return dataclasses.replace(spec, params=params, active_params=params)


def test_qwen3_head_norms_are_counted():
    """Qwen3 normalises q and k per head (q_norm / k_norm): each saves an fp32 upcast and the
    normalised copy, on top of what a Qwen2 layer of the same shape keeps."""
    import dataclasses

    qwen3 = dataclasses.replace(TINY, architecture="qwen3")
    traced = _saved_bytes(False, family="qwen3")
    predicted = act.stored_activation_bytes(qwen3, 2, act.LayerBatch(2, 64, "sdpa"), False)
    assert predicted > act.stored_activation_bytes(TINY, 2, act.LayerBatch(2, 64, "sdpa"), False)
    assert predicted == pytest.approx(traced, rel=0.03)


# tiny MoE shapes: 8 experts, 2 per token, expert width 96
MOE_SHAPES = {
    "qwen3_moe": dict(moe_intermediate_size=96, num_experts=8, num_experts_per_tok=2),
    "mixtral": dict(intermediate_size=96, num_local_experts=8, num_experts_per_tok=2),
}


@pytest.mark.parametrize("family", sorted(MOE_SHAPES))
def test_moe_layers_match_autograd(family):
    """transformers 5 MoE experts (grouped matmuls over the routed rows): per chosen expert the
    gathered token, the gated MLP's four tensors and the expert's output (saved by the multiply
    with its routing weight), plus the fp32 router softmax."""
    from zerofit.models.resolve import spec_from_config

    traced = _saved_bytes(False, family=family, **MOE_SHAPES[family])
    config = {
        "model_type": family,
        "hidden_size": 128,
        "intermediate_size": 352,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 2000,
        "tie_word_embeddings": True,
        **MOE_SHAPES[family],
    }
    spec = spec_from_config(config, "probe")
    assert spec.num_experts == 8 and spec.experts_per_token == 2
    predicted = act.stored_activation_bytes(spec, 2, act.LayerBatch(2, 64, "sdpa"), False)
    assert predicted == pytest.approx(traced, rel=0.03)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("family", ["gemma", "gemma3_text", "olmo2"])
def test_other_norm_layouts_match_autograd(family, checkpointing):
    """Gemma's fp32 (1 + weight) norm, Gemma3's pre + post norms and per-head q/k norms, OLMo2's
    post norms and full q/k norms (activations.NORM_LAYOUTS), traced on transformers' modules."""
    import dataclasses

    traced = _saved_bytes(checkpointing, family=family)
    spec = dataclasses.replace(TINY, architecture=family)
    predicted = act.stored_activation_bytes(spec, 2, act.LayerBatch(2, 64, "sdpa"), checkpointing)
    assert predicted == pytest.approx(traced, rel=0.03)


def test_padded_batch_keeps_a_mask_copy_and_repeated_kv_per_layer():
    """A padded micro batch (attention mask with zeros): transformers passes a boolean mask, so
    sdpa cannot run GQA natively (K and V are repeated to every head) and torch converts the
    mask to an additive bf16 copy in every layer, which the kernel saves
    (activations.padded_attention_bytes)."""
    traced = _saved_bytes(False, padded=True)
    unpadded = act.stored_activation_bytes(TINY, 2, act.LayerBatch(2, 64, "sdpa"), False)
    padded_batch = act.LayerBatch(2, 64, "sdpa", padded=True)
    padded = act.stored_activation_bytes(TINY, 2, padded_batch, False)
    per_layer = act.padded_attention_bytes(TINY, 2, 2, 64, "sdpa")
    # K and V at 4 heads instead of 2 (head_dim 32, bf16), plus the [2, 1, 64, 64] bf16 mask
    assert per_layer == 2 * 64 * 2 * (4 - 2) * 32 * 2 + 2 * 64 * 64 * 2
    assert padded == unpadded + TINY.num_layers * per_layer
    assert padded == pytest.approx(traced, rel=0.03)
    assert traced - _saved_bytes(False) == TINY.num_layers * per_layer


def test_flash_and_eager_attention_save_nothing_more_when_padded():
    assert act.padded_attention_bytes(TINY, 2, 2, 64, "flash_attention_2") == 0
    assert act.padded_attention_bytes(TINY, 2, 2, 64, "eager") == 0
    assert act.padding_mask_bytes(2, 64, "flash_attention_2") == 0


@pytest.mark.parametrize("checkpointing", [False, True])
def test_boolean_mask_outlives_the_forward_only_under_checkpointing(checkpointing):
    """Under non-reentrant checkpointing every layer's recompute closure holds the boolean mask
    until backward (activations.padding_mask_bytes); without it the mask dies with the forward."""
    import gc

    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        "qwen2", attn_implementation="sdpa", use_cache=False, **dict(TINY_DECODER)
    )
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch, seq = 2, 64
    ids = torch.randint(0, 2000, (batch, seq))
    # masks other tests left alive (a fake-tensor trace's, held by a library's cache) are not
    # this forward's
    gc.collect()
    before = {id(t) for t in gc.get_objects() if _is_4d_bool_tensor(torch, t)}
    loss = model(input_ids=ids, attention_mask=_padded_mask(torch, batch, seq), labels=ids).loss
    gc.collect()
    masks = [
        t for t in gc.get_objects() if _is_4d_bool_tensor(torch, t) and id(t) not in before
    ]
    expected = act.padding_mask_bytes(batch, seq, "sdpa") if checkpointing else 0
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in masks}
    assert sum(storages.values()) == expected
    loss.backward()


def _is_4d_bool_tensor(torch, obj) -> bool:
    # type() instead of isinstance(): isinstance on some torch module attributes warns
    return issubclass(type(obj), torch.Tensor) and obj.dtype == torch.bool and obj.dim() == 4


@pytest.mark.parametrize(("dtype", "element_bytes"), [("bfloat16", 2), ("float32", 4)])
def test_eager_attention_keeps_the_softmax_and_its_cast_only_when_they_differ(dtype, element_bytes):
    """Eager attention saves its fp32 softmax and, in 16-bit, the ``.to(query.dtype)`` copy the
    probs @ v matmul takes; in fp32 that ``.to`` is the softmax output itself, saved once
    (activations.eager_scores_bytes), traced on transformers' modules without autocast."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "qwen2", attn_implementation="eager", use_cache=False, **TINY_DECODER
    )
    model = AutoModelForCausalLM.from_config(config).to(getattr(torch, dtype)).train()
    inputs = {"input_ids": torch.randint(0, 2000, (2, 64))}

    def forward():
        hidden = model.model(**inputs).last_hidden_state
        model.lm_head(hidden)

    traced = saved_tensor_bytes(model, forward)
    scores = act.eager_scores_bytes(TINY, element_bytes, 2, 64)
    assert scores == 2 * 4 * 64 * 64 * (4 + (2 if element_bytes == 2 else 0))
    batch = act.LayerBatch(2, 64, "eager")
    predicted = act.stored_activation_bytes(TINY, element_bytes, batch, False)
    assert predicted == pytest.approx(traced, rel=0.03)
