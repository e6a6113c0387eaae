"""Model shapes the GPU benchmarks build random-init models from (no download).

Plain dicts of transformers config keys, so a benchmark runs where zerofit itself is not
importable (a bare GPU machine without DeepSpeed). They are the values of zerofit's built-in
catalog (src/zerofit/models/builtin.py, from each model's config.json);
tests/test_model_shapes_bench.py checks that they stay equal.
"""

from __future__ import annotations

# Qwen/Qwen2.5-0.5B's config.json
QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
)

# Qwen/Qwen2.5-1.5B's config.json
QWEN25_15B = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
)
# Qwen/Qwen2.5-7B's config.json
QWEN25_7B = dict(
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    tie_word_embeddings=False,
)
# a two-layer Llama-style shape for CPU runs of the GPU benchmarks (no catalog model)
TINY = dict(
    hidden_size=64,
    intermediate_size=176,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
