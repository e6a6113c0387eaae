"""Three optimizer steps of a tiny random Qwen2 under `accelerate launch` (CPU or GPU).

    accelerate launch --num_processes 2 --config_file OUT/accelerate.yaml \\
        tests/scripts/tiny_train.py

Used by tests/configs/test_deepspeed_engine.py: asserts a real 2-process world and a finite loss,
and prints one marker line (`ZEROFIT_TINY_TRAIN ...`) with what the DeepSpeed engine ended up using.
"""

import argparse
import math
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from torch.utils.data import DataLoader, TensorDataset
from transformers import AutoModelForCausalLM, Qwen2Config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=2, help="DataLoader batch (micro batch)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    parser.add_argument("--world", type=int, default=2, help="expected number of processes")
    args = parser.parse_args()

    # Without gloo on a CPU machine accelerate treats every rank as a lone process (no error).
    kwargs = [] if torch.cuda.is_available() else [InitProcessGroupKwargs(backend="gloo")]
    accelerator = Accelerator(kwargs_handlers=kwargs)
    assert (
        accelerator.num_processes == args.world
    ), f"world {accelerator.num_processes} != {args.world}"
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = AutoModelForCausalLM.from_config(
        config
    )  # from_config honours zero3_init_flag (zero.Init)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    ds_config = (
        accelerator.state.deepspeed_plugin.deepspeed_config
        if accelerator.state.deepspeed_plugin
        else {}
    )
    accum = ds_config.get("gradient_accumulation_steps", 1)
    accum = accum if isinstance(accum, int) else 1
    tokens = torch.randint(
        0,
        128,
        (args.batch_size * accum * args.world * args.steps, 16),
        generator=torch.Generator().manual_seed(0),
    )
    loader = DataLoader(TensorDataset(tokens), batch_size=args.batch_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    model.train()
    steps, loss = 0, None
    for (batch,) in loader:
        with accelerator.accumulate(model):
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            steps += 1
    value = accelerator.reduce(loss.detach().float(), reduction="mean").item()
    assert math.isfinite(value), f"loss {value} is not finite"
    inner = optimizer  # AcceleratedOptimizer -> DeepSpeed ZeRO wrapper -> the optimizer that steps
    while hasattr(inner, "optimizer"):
        inner = inner.optimizer
    if accelerator.is_main_process:
        engine = getattr(model, "zero_optimization_stage", None)
        stage = engine() if callable(engine) else 0
        cfg = accelerator.deepspeed_config if accelerator.state.deepspeed_plugin else {}
        print(
            f"ZEROFIT_TINY_TRAIN world={accelerator.num_processes} stage={stage} steps={steps} "
            f"train_batch_size={cfg.get('train_batch_size')} "
            f"micro={cfg.get('train_micro_batch_size_per_gpu')} "
            f"accum={cfg.get('gradient_accumulation_steps')} optimizer={type(inner).__name__} "
            f"dtype={next(model.parameters()).dtype} loss={value:.4f}",
            flush=True,
        )
    # Both ranks reach here before either tears its process group down: a rank that exits while
    # its peer still has gloo work in flight can abort with "terminate called without an active
    # exception" (seen once here, SIGABRT after the run had finished).
    accelerator.wait_for_everyone()
    accelerator.end_training()
    # The run is over and reported. Leave without running C++ static destructors: under load a
    # gloo / shm-comm worker thread can still be joinable when they run, and std::terminate then
    # aborts a run that succeeded (SIGABRT, "terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
