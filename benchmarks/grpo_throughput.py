"""Completion tokens/s of one GRPO optimizer step: recipes/grpo.py vs trl's GRPOTrainer.

Both run at the same shape through `accelerate launch` on the same random-init model, data, batch
and generation length, in one invocation, and the result is printed as JSON (and written to --out).

    .venv/bin/python benchmarks/grpo_throughput.py                 # CPU: tiny model, plain
    python benchmarks/grpo_throughput.py --modes plain zero2 zero3 # GPU: Qwen2.5-0.5B shape, bf16

GPU setting (that of the H100 reference in tests/data/mem_h100_qwen2.5-0.5b.md): Qwen2.5-0.5B-shaped
random init, 8 prompts x 8 generations x 256 completion tokens, prompt 64 tokens, micro-batch 16 x
accumulation 4, beta 0. Tokens/s counts the completion tokens actually generated (EOS may end a
sequence early), over the timed steps after warm-up.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

from launch_setup import (
    Launch,
    gloo_if_cpu_ddp,
    run_recipe,
    run_trl_worker,
    save_random_model,
    step_timer,
    trl_worker_command,
    worker_setting,
    write_zero_configs,
)


def setting(gpu: bool) -> dict:
    """The benchmark shape: the issue's GPU anchor, or a CPU-sized version of it."""
    if gpu:
        return {
            "shape": "qwen2.5-0.5b",
            "prompts": 8,
            "gens": 8,
            "completion": 256,
            "prompt": 64,
            "micro": 16,
            "accum": 4,
        }
    return {
        "shape": "tiny",
        "prompts": 4,
        "gens": 8,
        "completion": 32,
        "prompt": 16,
        "micro": 16,
        "accum": 2,
    }


def write_inputs(work: Path, cfg: dict, gpu: bool) -> None:
    """Model dir (random init, saved), prompts of exactly `prompt` tokens, and the ZeRO configs."""
    import torch

    save_random_model(work, cfg["shape"], max_positions=1024)
    gen = torch.Generator().manual_seed(0)
    with open(work / "data.jsonl", "w") as f:
        for _ in range(64):
            digits = "".join(
                str(int(d)) for d in torch.randint(0, 10, (cfg["prompt"] - 1,), generator=gen)
            )
            f.write(json.dumps({"prompt": digits + "=", "answer": str(int(digits[-2:]))}) + "\n")
    write_zero_configs(work, cfg, gpu)


def run_ours(launch: Launch, warmup: int, steps: int) -> dict:
    cfg = launch.cfg
    flags = [
        "--num-generations",
        str(cfg["gens"]),
        "--max-completion-len",
        str(cfg["completion"]),
        "--max-prompt-len",
        str(cfg["prompt"]),
        "--rewards",
        "format",
        "--reward-weights",
        "1",
    ]
    rows = run_recipe("grpo", launch, warmup + steps, flags, launch.work / f"ours-{launch.mode}")
    if isinstance(rows, dict):
        return rows
    timed = rows[warmup:]
    tokens, seconds = sum(r["tokens"] for r in timed), sum(r["step_s"] for r in timed)
    return {
        "tok_s": tokens / seconds,
        "step_s": seconds / len(timed),
        "completion_tokens_per_step": tokens / len(timed),
    }


def run_trl(launch: Launch, warmup: int, steps: int) -> dict:
    if importlib.util.find_spec("trl") is None:
        return {"skipped": "trl is not installed"}
    mode, work = launch.mode, launch.work
    out = work / f"trl-{mode}"
    cmd = trl_worker_command(__file__, mode, work, launch.gpu, warmup, steps, out)
    return run_trl_worker(cmd + ["--mode", mode], launch.cfg, out)


def trl_worker(args) -> None:
    """Runs inside `accelerate launch`: trl's GRPOTrainer on the same inputs, timed per step."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    cfg, work, gpu = worker_setting(), Path(args.trl_worker), torch.cuda.is_available()
    rows = [json.loads(line) for line in (work / "data.jsonl").read_text().splitlines()]
    times: list[float] = []

    def format_reward(completions, **kw):
        return [1.0 if c.strip().isdigit() else 0.0 for c in completions]

    conf = GRPOConfig(
        output_dir=str(work / f"trl-out-{args.mode}"),
        per_device_train_batch_size=cfg["micro"],
        gradient_accumulation_steps=cfg["accum"],
        num_generations=cfg["gens"],
        max_completion_length=cfg["completion"],
        learning_rate=1e-6,
        beta=0.0,
        temperature=1.0,
        max_steps=args.warmup + args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=gpu,
        use_cpu=not gpu,
        seed=0,
        ddp_backend=gloo_if_cpu_ddp(),
    )
    trainer = GRPOTrainer(
        model=str(work / "model"),
        reward_funcs=[format_reward],
        args=conf,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(work / "model"),
        callbacks=[step_timer(times)],
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    per_step = cfg["micro"] * cfg["accum"] * trainer.accelerator.num_processes
    timed, lengths = (
        times[args.warmup :],
        [h["completions/mean_length"] for h in logs][args.warmup :],
    )
    tokens = sum(lengths) * per_step
    if trainer.accelerator.is_main_process:
        Path(args.out).write_text(
            json.dumps(
                {
                    "tok_s": tokens / sum(timed),
                    "step_s": sum(timed) / len(timed),
                    "completion_tokens_per_step": tokens / len(timed),
                }
            )
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--modes",
        nargs="+",
        default=None,
        help="plain, zero2, zero3 (default: plain on CPU, all on GPU)",
    )
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed steps first (compilation, caches)"
    )
    p.add_argument("--steps", type=int, default=2, help="timed optimizer steps")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--no-trl", action="store_true", help="measure only our recipe")
    p.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="plain", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.trl_worker:
        trl_worker(args)
        return 0
    import torch

    gpu = torch.cuda.is_available()
    cfg, modes = setting(gpu), args.modes or (["plain", "zero2", "zero3"] if gpu else ["plain"])
    result = {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "setting": cfg,
        "warmup": args.warmup,
        "timed_steps": args.steps,
        "results": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_inputs(work, cfg, gpu)
        for mode in modes:
            launch = Launch(mode, work, cfg, gpu)
            ours = run_ours(launch, args.warmup, args.steps)
            trl = (
                {"skipped": "--no-trl"}
                if args.no_trl
                else run_trl(launch, args.warmup, args.steps)
            )
            entry = {"ours": ours, "trl": trl}
            if "tok_s" in ours and "tok_s" in trl:
                entry["speedup"] = round(ours["tok_s"] / trl["tok_s"], 2)
            result["results"][mode] = entry
            print(
                f"{mode}: ours {ours.get('tok_s', 'n/a')} tok/s, "
                f"trl {trl.get('tok_s', 'n/a')} tok/s",
                file=sys.stderr,
            )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
