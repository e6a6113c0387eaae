"""Tiny real multi-node training run: accelerate + DeepSpeed (from the launcher's config), gloo
on CPU.

A random-init 2-layer Qwen2 trains a few steps on random tokens; each rank prints its progress so a
test can tell when the job is mid-run. Launched by the scripts `zerofit launch` writes, e.g.:

    zerofit launch --config accelerate.yaml --main-addr 127.0.0.1 --out launch/ \
        -- tests/scripts/multinode_train.py --steps 3 --expect-world-size 2
    bash launch/node0.sh & bash launch/node1.sh
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--micro-batch", type=int, default=2)  # must equal the DS JSON's micro batch
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--expect-world-size", type=int, default=2)
    p.add_argument(
        "--timeout", type=float, default=60.0, help="seconds a collective waits for a lost peer"
    )
    p.add_argument(
        "--step-sleep", type=float, default=0.0, help="pause after each step (fault tests)"
    )
    p.add_argument(
        "--note",
        action="append",
        default=[],
        help="any text; printed back verbatim (quoting tests)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs
    from transformers import Qwen2Config, Qwen2ForCausalLM

    # Without an explicit gloo backend on CPU, accelerate runs every rank alone
    # (accelerate/state.py, PartialState._prepare_backend picks no backend without CUDA).
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    pg = InitProcessGroupKwargs(backend=backend, timeout=timedelta(seconds=args.timeout))
    acc = Accelerator(kwargs_handlers=[pg])
    rank, world = acc.process_index, acc.num_processes
    if args.note:
        print(f"multinode_train: rank {rank} notes {args.note!r}", flush=True)
    if world != args.expect_world_size:
        print(
            f"multinode_train: world size {world}, expected {args.expect_world_size}",
            file=sys.stderr,
        )
        return 3

    torch.manual_seed(0)  # identical initial weights on every rank
    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
    )
    model = Qwen2ForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = acc.prepare(model, optimizer)
    engine = getattr(model, "zero_optimization_stage", None)
    stage = engine() if callable(engine) else None
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data shard
    try:
        for step in range(args.steps):
            ids = torch.randint(
                0, config.vocab_size, (args.micro_batch, args.seq_len), generator=gen
            )
            loss = model(input_ids=ids, labels=ids).loss
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            mean = acc.reduce(loss.detach(), "mean").item()
            print(f"rank {rank}/{world} step {step} loss {mean:.4f} zero_stage {stage}", flush=True)
            time.sleep(args.step_sleep)
        acc.wait_for_everyone()
    except Exception as exc:  # a dead peer surfaces as a gloo/DeepSpeed error inside a collective
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        print(
            f"multinode_train: rank {rank} lost its peers ({type(exc).__name__}: {first})",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)  # skip process-group teardown, which can block on the dead peer
    if acc.is_main_process:
        print(f"multinode_train: done, {args.steps} steps, world size {world}", flush=True)
    acc.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
