"""Analytic activation bytes vs the tensors autograd really saves in transformers' Qwen2 (CPU, tiny).

Run: .venv/bin/python -m pytest tests/memory/test_activations.py -q   (~10 s, mostly importing transformers)
"""

from __future__ import annotations

import pytest

from memory_shapes import ModelSpec
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


def _saved_bytes(checkpointing: bool, batch: int = 2, seq: int = 64) -> int:
    torch = pytest.importorskip("torch")
    from torch.autograd.graph import saved_tensors_hooks
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=2000,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
        use_cache=False,
    )
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:  # count each saved storage once, weights excluded
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        hidden = model.model(input_ids=torch.randint(0, 2000, (batch, seq))).last_hidden_state
        model.lm_head(hidden)
    return sum(saved.values())


@pytest.mark.parametrize("checkpointing", [False, True])
def test_stored_activations_match_autograd(checkpointing):
    traced = _saved_bytes(checkpointing)
    predicted = act.stored_activation_bytes(TINY, 2, 2 * 64, 2, 64, "sdpa", checkpointing)
    # the remainder is token ids and the shared RoPE cos/sin tables
    assert predicted == pytest.approx(traced, rel=0.03)
