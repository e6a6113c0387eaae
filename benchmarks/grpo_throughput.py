"""Completion tokens/s of one GRPO optimizer step: recipes/grpo.py vs trl's GRPOTrainer, same shape.

Both run through `accelerate launch` on the same random-init model, data, batch and generation length,
in one invocation, and the result is printed as JSON (and written to --out).

    .venv/bin/python benchmarks/grpo_throughput.py                 # CPU: tiny model, plain
    python benchmarks/grpo_throughput.py --modes plain zero2 zero3 # GPU: Qwen2.5-0.5B shape, bf16

GPU setting (the issue's anchor): Qwen2.5-0.5B-shaped random init, 8 prompts x 8 generations x 256
completion tokens, prompt 64 tokens, micro-batch 16 x accumulation 4, beta 0. Tokens/s counts the
completion tokens actually generated (EOS may end a sequence early), over the timed steps after warm-up.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "grpo.py"
BIN = Path(sys.executable).parent
# (hidden, intermediate, layers, heads, kv heads, vocab) of each benchmark model
SHAPES = {"tiny": (64, 128, 2, 4, 2, None), "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 151936)}


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_inputs(work: Path, cfg: dict, gpu: bool) -> None:
    """Model dir (random init, saved), prompts of exactly `prompt` tokens, and accelerate/DeepSpeed configs."""
    sys.path.insert(0, str(RECIPE.parent))
    import grpo
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    tok = grpo.build_tiny_tokenizer()
    hidden, inter, layers, heads, kv, vocab = SHAPES[cfg["shape"]]
    model_cfg = Qwen2Config(
        vocab_size=vocab or len(tok),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_cfg)
    model.save_pretrained(work / "model")
    tok.save_pretrained(work / "model")
    gen = torch.Generator().manual_seed(0)
    with open(work / "data.jsonl", "w") as f:
        for _ in range(64):
            digits = "".join(
                str(int(d)) for d in torch.randint(0, 10, (cfg["prompt"] - 1,), generator=gen)
            )
            f.write(json.dumps({"prompt": digits + "=", "answer": str(int(digits[-2:]))}) + "\n")
    for stage in (2, 3):
        ds = {
            "train_micro_batch_size_per_gpu": cfg["micro"],
            "gradient_accumulation_steps": cfg["accum"],
            "gradient_clipping": 1.0,
            "bf16": {"enabled": gpu},
            "zero_optimization": {"stage": stage},
        }
        (work / f"zero{stage}.json").write_text(json.dumps(ds))
        (work / f"zero{stage}.yaml").write_text(
            "distributed_type: DEEPSPEED\nnum_processes: 1\nnum_machines: 1\nmachine_rank: 0\n"
            f"deepspeed_config:\n  deepspeed_config_file: {work / f'zero{stage}.json'}\n  zero3_init_flag: false\n"
        )


def launch_prefix(mode: str, work: Path, gpu: bool) -> list[str]:
    cmd = [str(BIN / "accelerate"), "launch", "--main_process_port", str(free_port())]
    if mode == "plain":
        return (
            cmd
            + ["--num_processes", "1", "--mixed_precision", "bf16" if gpu else "no"]
            + ([] if gpu else ["--cpu"])
        )
    return cmd + ["--config_file", str(work / f"{mode}.yaml")]


def run_ours(mode: str, work: Path, cfg: dict, gpu: bool, warmup: int, steps: int) -> dict:
    out = work / f"ours-{mode}"
    cmd = launch_prefix(mode, work, gpu) + [
        str(RECIPE),
        "--model",
        str(work / "model"),
        "--dataset",
        str(work / "data.jsonl"),
        "--output-dir",
        str(out),
        "--max-steps",
        str(warmup + steps),
        "--save-every",
        "0",
        "--per-device-batch-size",
        str(cfg["micro"]),
        "--gradient-accumulation-steps",
        str(cfg["accum"]),
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
        "--learning-rate",
        "1e-6",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return {"error": (res.stdout + res.stderr)[-1500:]}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][warmup:]
    tokens, seconds = sum(r["tokens"] for r in rows), sum(r["step_s"] for r in rows)
    return {
        "tok_s": tokens / seconds,
        "step_s": seconds / len(rows),
        "completion_tokens_per_step": tokens / len(rows),
    }


def run_trl(mode: str, work: Path, cfg: dict, gpu: bool, warmup: int, steps: int) -> dict:
    if importlib.util.find_spec("trl") is None:
        return {"skipped": "trl is not installed"}
    out = work / f"trl-{mode}"
    cmd = launch_prefix(mode, work, gpu) + [
        __file__,
        "--trl-worker",
        str(work),
        "--mode",
        mode,
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--out",
        str(out),
    ]
    res = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "BENCH_CFG": json.dumps(cfg)}
    )
    if res.returncode != 0:
        return {"error": (res.stdout + res.stderr)[-1500:]}
    return json.loads(out.read_text())


def trl_worker(args) -> None:
    """Runs inside `accelerate launch`: trl's GRPOTrainer on the same inputs, timed per optimizer step."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg, work, gpu = (
        json.loads(os.environ["BENCH_CFG"]),
        Path(args.trl_worker),
        torch.cuda.is_available(),
    )
    rows = [json.loads(line) for line in (work / "data.jsonl").read_text().splitlines()]
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.time()

        def on_step_end(self, *a, **k):
            times.append(time.time() - self.t0)

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
        ddp_backend="gloo" if not gpu and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
    )
    trainer = GRPOTrainer(
        model=str(work / "model"),
        reward_funcs=[format_reward],
        args=conf,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(work / "model"),
        callbacks=[Timer()],
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
            ours = run_ours(mode, work, cfg, gpu, args.warmup, args.steps)
            trl = (
                {"skipped": "--no-trl"}
                if args.no_trl
                else run_trl(mode, work, cfg, gpu, args.warmup, args.steps)
            )
            entry = {"ours": ours, "trl": trl}
            if "tok_s" in ours and "tok_s" in trl:
                entry["speedup"] = round(ours["tok_s"] / trl["tok_s"], 2)
            result["results"][mode] = entry
            print(
                f"{mode}: ours {ours.get('tok_s', 'n/a')} tok/s, trl {trl.get('tok_s', 'n/a')} tok/s",
                file=sys.stderr,
            )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
