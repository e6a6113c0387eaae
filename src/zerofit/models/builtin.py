"""Built-in model shapes: the published config.json fields that decide parameter counts."""

from __future__ import annotations


def _cfg(
    model_type: str,
    hidden: int,
    inter: int,
    layers: int,
    attention: tuple[int, int],
    vocab: int,
    tie: bool,
    **extra,
) -> dict:
    """A config.json dict; ``attention``: (attention heads, key/value heads)."""
    heads, kv = attention
    return {
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "tie_word_embeddings": tie,
        **extra,
    }


# Published config.json values (the fields that decide parameter shapes), with the hub ids that
# share each shape (base and instruct variants), so those ids resolve without the network.
BUILTIN_CONFIGS: dict[str, tuple[tuple[str, ...], dict]] = {
    "qwen2.5-0.5b": (
        ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B-Instruct"),
        _cfg("qwen2", 896, 4864, 24, (14, 2), 151936, True),
    ),
    "qwen2.5-1.5b": (
        ("Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B-Instruct"),
        _cfg("qwen2", 1536, 8960, 28, (12, 2), 151936, True),
    ),
    "qwen2.5-3b": (
        ("Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-3B-Instruct"),
        _cfg("qwen2", 2048, 11008, 36, (16, 2), 151936, True),
    ),
    "qwen2.5-7b": (
        ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
        _cfg("qwen2", 3584, 18944, 28, (28, 4), 152064, False),
    ),
    "qwen2.5-14b": (
        ("Qwen/Qwen2.5-14B", "Qwen/Qwen2.5-14B-Instruct"),
        _cfg("qwen2", 5120, 13824, 48, (40, 8), 152064, False),
    ),
    "qwen2.5-32b": (
        ("Qwen/Qwen2.5-32B", "Qwen/Qwen2.5-32B-Instruct"),
        _cfg("qwen2", 5120, 27648, 64, (40, 8), 152064, False),
    ),
    "qwen2.5-72b": (
        ("Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct"),
        _cfg("qwen2", 8192, 29568, 80, (64, 8), 152064, False),
    ),
    "qwen3-0.6b": (
        ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B-Base"),
        _cfg("qwen3", 1024, 3072, 28, (16, 8), 151936, True, head_dim=128),
    ),
    "qwen3-1.7b": (
        ("Qwen/Qwen3-1.7B", "Qwen/Qwen3-1.7B-Base"),
        _cfg("qwen3", 2048, 6144, 28, (16, 8), 151936, True, head_dim=128),
    ),
    "qwen3-4b": (
        ("Qwen/Qwen3-4B", "Qwen/Qwen3-4B-Base"),
        _cfg("qwen3", 2560, 9728, 36, (32, 8), 151936, True, head_dim=128),
    ),
    "qwen3-8b": (
        ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B-Base"),
        _cfg("qwen3", 4096, 12288, 36, (32, 8), 151936, False, head_dim=128),
    ),
    "qwen3-14b": (
        ("Qwen/Qwen3-14B", "Qwen/Qwen3-14B-Base"),
        _cfg("qwen3", 5120, 17408, 40, (40, 8), 151936, False, head_dim=128),
    ),
    "qwen3-32b": (
        ("Qwen/Qwen3-32B",),
        _cfg("qwen3", 5120, 25600, 64, (64, 8), 151936, False, head_dim=128),
    ),
    "qwen3-30b-a3b": (
        (
            "Qwen/Qwen3-30B-A3B",
            "Qwen/Qwen3-30B-A3B-Base",
            "Qwen/Qwen3-30B-A3B-Instruct-2507",
            "Qwen/Qwen3-30B-A3B-Thinking-2507",
        ),
        _cfg(
            "qwen3_moe",
            2048,
            6144,
            48,
            (32, 4),
            151936,
            False,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=768,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        ),
    ),
    "llama-3.2-1b": (
        ("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct"),
        _cfg("llama", 2048, 8192, 16, (32, 8), 128256, True, head_dim=64),
    ),
    "llama-3.2-3b": (
        ("meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct"),
        _cfg("llama", 3072, 8192, 28, (24, 8), 128256, True, head_dim=128),
    ),
    "llama-3.1-8b": (
        (
            "meta-llama/Llama-3.1-8B",
            "meta-llama/Llama-3.1-8B-Instruct",
            "meta-llama/Meta-Llama-3.1-8B",
            "meta-llama/Meta-Llama-3.1-8B-Instruct",
        ),
        _cfg("llama", 4096, 14336, 32, (32, 8), 128256, False),
    ),
    "llama-3.1-70b": (
        (
            "meta-llama/Llama-3.1-70B",
            "meta-llama/Llama-3.1-70B-Instruct",
            "meta-llama/Meta-Llama-3.1-70B",
            "meta-llama/Meta-Llama-3.1-70B-Instruct",
        ),
        _cfg("llama", 8192, 28672, 80, (64, 8), 128256, False),
    ),
    "mistral-7b-v0.3": (
        ("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
        _cfg("mistral", 4096, 14336, 32, (32, 8), 32768, False, head_dim=128),
    ),
    "mixtral-8x7b": (
        ("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
        _cfg(
            "mixtral",
            4096,
            14336,
            32,
            (32, 8),
            32000,
            False,
            num_local_experts=8,
            num_experts_per_tok=2,
        ),
    ),
}
