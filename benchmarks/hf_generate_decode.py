"""transformers' eager generate with TRL GRPO's sampling kwargs: per-token decode time.

Random-init models of four depths (24-48 layers) in bf16 on one GPU, batch 1 and 32, prompt 256,
64 new tokens, three repeats (the first is the cold call and is left out of the mean). One JSON
line per model and batch, also written to $OUT/hf_generate_decode.jsonl. The rows in
tests/data/hf_generate_decode_h100.jsonl came from this script on one H100 (torch 2.11,
transformers 5.17); speed/generation.py's HF_DECODE_STEP_S and HF_DECODE_S_PER_LAYER are fitted
on them.

    python3 benchmarks/hf_generate_decode.py      # needs a CUDA GPU, ~90 s on an H100
"""
import torch
from generate_timing import JsonLines, generate, timed
from model_shapes import QWEN25_05B, QWEN25_7B
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

SHAPES = {  # the configs' shapes (Qwen2.5 and Llama-3.1 config.json), random weights
    "qwen2.5-0.5b": Qwen2Config(**QWEN25_05B),
    "qwen2.5-7b": Qwen2Config(**QWEN25_7B),
    "llama-3.1-8b": LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
    "qwen2.5-14b": Qwen2Config(
        hidden_size=5120,
        intermediate_size=13824,
        num_hidden_layers=48,
        num_attention_heads=40,
        num_key_value_heads=8,
        vocab_size=152064,
    ),
}
PROMPT, NEW = 256, 64


def measure(model, batch: int) -> list[float]:
    """Per-token milliseconds of three full generations, the prefill's token taken out."""
    ids = torch.randint(0, 30000, (batch, PROMPT), device="cuda")
    generate(model, ids, 4)
    repeats = []
    for _ in range(3):
        full = timed(lambda: generate(model, ids, NEW))
        first = timed(lambda: generate(model, ids, 1))
        repeats.append(1000 * (full - first) / (NEW - 1))
    return repeats


def measure_shape(out: JsonLines, name: str, config) -> None:
    """Both batches of one model shape, one row each."""
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    for batch in (1, 32):
        repeats = measure(model, batch)
        row = {
            "model": name,
            "layers": config.num_hidden_layers,
            "batch": batch,
            "prompt": PROMPT,
            "new": NEW,
            "per_token_ms": sum(repeats[1:]) / len(repeats[1:]),
            "repeats_ms": repeats,
        }
        out.write(row)
    del model
    torch.cuda.empty_cache()


def main() -> None:
    with JsonLines("hf_generate_decode") as out:
        for name, config in SHAPES.items():
            measure_shape(out, name, config)


if __name__ == "__main__":
    main()
