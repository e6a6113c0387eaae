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
