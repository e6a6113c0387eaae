"""Published model shapes for the memory/planner tests, independent of zerofit.models.

Uses zerofit.models.ModelSpec when that module exists, else a local stand-in with the same fields.
"""
from __future__ import annotations

from dataclasses import dataclass

try:
    from zerofit.models import ModelSpec
except Exception:  # noqa: BLE001 -- the models module is written in parallel; same contract fields
    @dataclass(frozen=True)
    class ModelSpec:  # type: ignore[no-redef]
        name: str
        architecture: str
        hidden_size: int
        intermediate_size: int
        num_layers: int
        num_heads: int
        num_kv_heads: int
        head_dim: int
        vocab_size: int
        tie_embeddings: bool
        params: int
        active_params: int
        num_experts: int = 0
        experts_per_token: int = 0
        moe_intermediate_size: int = 0


def _spec(name, arch, h, i, layers, heads, kv, d, vocab, tied, params):
    return ModelSpec(name=name, architecture=arch, hidden_size=h, intermediate_size=i, num_layers=layers,
                     num_heads=heads, num_kv_heads=kv, head_dim=d, vocab_size=vocab, tie_embeddings=tied,
                     params=params, active_params=params)


QWEN25_05B = _spec("qwen2.5-0.5b", "Qwen2ForCausalLM", 896, 4864, 24, 14, 2, 64, 151936, True, 494_032_768)
QWEN25_7B = _spec("qwen2.5-7b", "Qwen2ForCausalLM", 3584, 18944, 28, 28, 4, 128, 152064, False, 7_615_616_512)
QWEN25_72B = _spec("qwen2.5-72b", "Qwen2ForCausalLM", 8192, 29568, 80, 64, 8, 128, 152064, False, 72_706_203_648)
LLAMA31_70B = _spec("llama-3.1-70b", "LlamaForCausalLM", 8192, 28672, 80, 64, 8, 128, 128256, False, 70_553_706_496)
