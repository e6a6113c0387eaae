"""What DeepSpeed adds to a GRPO step on one GPU: transformers generate and one training micro step,
plain, under a ZeRO-2 engine, and under a ZeRO-3 engine with TRL's gather and hook removal
(trl/models/utils.py ``_unwrap_model_for_generation``, ``remove_hooks`` / ``add_hooks``).

The shape of the TRL GRPO reference in tests/data/mem_h100_qwen2.5-0.5b.md: Qwen2.5-0.5B, random
init, bf16, 64 completions of 256 tokens after 64-token prompts, TRL's sampling kwargs; the
training micro step is 16 sequences of 320 tokens. Three repeats each (the first generation is
the cold call). JSON lines to stdout and $OUT/ds_generate_overhead.jsonl.

    python3 benchmarks/ds_generate_overhead.py          # a CUDA GPU, DeepSpeed installed, ~2 min
    TINY=1 python benchmarks/ds_generate_overhead.py    # a 2-layer model, runs on a CPU

speed/generation.py names what one run of it on an H200 showed.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext

import torch
from generate_timing import JsonLines, generate_seconds, timed
from model_shapes import QWEN25_05B
from transformers import AutoModelForCausalLM, Qwen2Config

TINY = os.environ.get("TINY") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if TINY:
    CONFIG = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        tie_word_embeddings=True,
    )
    BATCH, PROMPT, NEW, MICRO = 4, 8, 8, 2
else:
    CONFIG = Qwen2Config(**QWEN25_05B)
    BATCH, PROMPT, NEW, MICRO = 64, 64, 256, 16


@contextmanager
def zero3_gathered(engine):
    """TRL's ZeRO-3 generation context: every parameter gathered, the engine's hooks removed."""
    import deepspeed

    offload = getattr(engine.optimizer, "parameter_offload", engine.optimizer)
    with deepspeed.zero.GatheredParameters(engine.module.parameters()):
        for param in offload.module.parameters(recurse=True):
            param.ds_active_sub_modules.clear()
        for hook in offload.forward_hooks + offload.backward_hooks:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        yield
        coordinator = getattr(offload, "param_coordinator", None)
        if coordinator is not None and not coordinator.is_invalid_trace():
            coordinator._invalidate_trace()
        offload._register_deepspeed_module(offload.module)


def training_ids():
    return torch.randint(0, CONFIG.vocab_size, (MICRO, PROMPT + NEW), device=DEVICE)


def measure(name: str, module, generation_context, train_step) -> dict:
    """Three generations of the batch and three training micro steps."""
    ids = torch.randint(0, CONFIG.vocab_size, (BATCH, PROMPT), device=DEVICE)
    with generation_context:
        generate_seconds(module, ids, 2)
        generations = [generate_seconds(module, ids, NEW) for _ in range(3)]
    train_step()
    return {
        "setup": name,
        "generate_s": generations,
        "train_micro_s": [timed(train_step) for _ in range(3)],
    }


def plain_row() -> dict:
    model = AutoModelForCausalLM.from_config(CONFIG, dtype=torch.bfloat16).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def step():
        ids = training_ids()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return measure("plain", model, nullcontext(), step)


def deepspeed_row(stage: int) -> dict:
    import deepspeed

    model = AutoModelForCausalLM.from_config(CONFIG, dtype=torch.bfloat16).to(DEVICE)
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    def step():
        ids = training_ids()
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()

    step()  # the optimizer's states exist, as they do in training
    context = zero3_gathered(engine) if stage == 3 else nullcontext()
    return measure(f"zero{stage}", engine.module, context, step)


def main() -> None:
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511")):
        os.environ.setdefault(key, value)
    for key in ("RANK", "LOCAL_RANK"):
        os.environ.setdefault(key, "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    rows = [plain_row()]
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if DEVICE == "cuda" else "gloo")
    rows += [deepspeed_row(2), deepspeed_row(3)]
    with JsonLines("ds_generate_overhead") as out:
        for row in rows:
            out.write(row)


if __name__ == "__main__":
    main()
