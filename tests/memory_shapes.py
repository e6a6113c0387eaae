"""Published model shapes for the memory/planner tests, typed independently of zerofit.models' table
so a wrong entry there cannot hide behind the same wrong number here."""

from __future__ import annotations

from zerofit.models.resolve import ModelSpec

# transformers config fields of a tiny decoder for CPU traces: every op runs as in training, small
# enough to build in milliseconds
TINY_DECODER = dict(
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=2000,
)


# a 2-layer Llama config for the allocation replays, wide enough that the 512 B rounding of small
# tensors stays far below the tests' 2-3 % tolerances
TINY_REPLAY_LLAMA = dict(
    model_type="llama",
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=4096,
    tie_word_embeddings=True,
)


def _dense_spec(name: str, architecture: str, params: int, **shape) -> ModelSpec:
    """A dense model's ModelSpec: every parameter is active."""
    return ModelSpec(
        name=name, architecture=architecture, params=params, active_params=params, **shape
    )


QWEN25_05B = _dense_spec(
    "qwen2.5-0.5b",
    "Qwen2ForCausalLM",
    494_032_768,
    hidden_size=896,
    intermediate_size=4864,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
    head_dim=64,
    vocab_size=151936,
    tie_embeddings=True,
)
QWEN25_7B = _dense_spec(
    "qwen2.5-7b",
    "Qwen2ForCausalLM",
    7_615_616_512,
    hidden_size=3584,
    intermediate_size=18944,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    head_dim=128,
    vocab_size=152064,
    tie_embeddings=False,
)
QWEN25_72B = _dense_spec(
    "qwen2.5-72b",
    "Qwen2ForCausalLM",
    72_706_203_648,
    hidden_size=8192,
    intermediate_size=29568,
    num_layers=80,
    num_heads=64,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=152064,
    tie_embeddings=False,
)
LLAMA31_70B = _dense_spec(
    "llama-3.1-70b",
    "LlamaForCausalLM",
    70_553_706_496,
    hidden_size=8192,
    intermediate_size=28672,
    num_layers=80,
    num_heads=64,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=128256,
    tie_embeddings=False,
)
