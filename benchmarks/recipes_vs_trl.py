"""Tokens/s of an optimizer step: recipes/sft.py vs trl's SFTTrainer and recipes/dpo.py vs trl's
DPOTrainer, side by side in one invocation (and GRPO through benchmarks/grpo_throughput.py).

Both sides run through `accelerate launch` on the same random-init model, the same rows, batch,
accumulation and sequence lengths. Every row has exactly the same token length (character-level
tokenizer, fixed-width digits), so tokens per step are equal on both sides and tokens/s is a
plain ratio of step times. Timed: the median optimizer step after `--warmup` untimed ones, of the
fastest of `--repeats` runs per side (ours and trl alternate, so a busy neighbour hits both).

    .venv/bin/python benchmarks/recipes_vs_trl.py                   # CPU: small shape, 1 process
    python benchmarks/recipes_vs_trl.py --modes plain zero2 zero3   # GPU: Qwen2.5-0.5B shape, bf16
    .venv/bin/python benchmarks/recipes_vs_trl.py --recipes sft dpo grpo --out bench.json

CPU setting: hidden 256, 4 layers, prompt 32 + completion 32 tokens, micro-batch 8 x accumulation 2.
GPU setting: the Qwen2.5-0.5B shape, prompt 256 + completion 256, micro-batch 8 x accumulation 4.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from launch_setup import (
    REPO,
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
    if gpu:
        return {
            "shape": "qwen2.5-0.5b",
            "prompt": 256,
            "completion": 256,
            "micro": 8,
            "accum": 4,
            "rows": 256,
        }
    return {"shape": "small", "prompt": 32, "completion": 32, "micro": 8, "accum": 2, "rows": 128}


def digits(generator, count: int) -> str:
    import torch

    return "".join(str(int(d)) for d in torch.randint(0, 10, (count,), generator=generator))


def write_inputs(work: Path, cfg: dict, gpu: bool) -> None:
    """Model dir, SFT rows and DPO pairs of fixed length, and DeepSpeed/accelerate configs."""
    import torch

    save_random_model(work, cfg["shape"], max_positions=2048)
    gen = torch.Generator().manual_seed(0)
    prompt_len, answer_len = cfg["prompt"], cfg["completion"] - 1  # + EOS on both sides
    with open(work / "sft.jsonl", "w") as sft, open(work / "dpo.jsonl", "w") as dpo:
        for _ in range(cfg["rows"]):
            prompt = digits(gen, prompt_len - 1) + "="
            sft.write(json.dumps({"prompt": prompt, "completion": digits(gen, answer_len)}) + "\n")
            dpo.write(
                json.dumps(
                    {
                        "prompt": prompt,
                        "chosen": digits(gen, answer_len),
                        "rejected": digits(gen, answer_len),
                    }
                )
                + "\n"
            )
    write_zero_configs(work, cfg, gpu)


def tokens_per_step(recipe: str, cfg: dict) -> int:
    sequences = cfg["micro"] * cfg["accum"]
    if recipe == "dpo":
        sequences *= 2  # chosen + rejected
    return sequences * (cfg["prompt"] + cfg["completion"])


def run_ours(recipe: str, launch: Launch, warmup: int, steps: int, attempt: int) -> dict:
    cfg = launch.cfg
    if recipe == "sft":
        flags = ["--max-seq-len", str(cfg["prompt"] + cfg["completion"])]
    else:
        flags = [
            "--max-prompt-len",
            str(cfg["prompt"]),
            "--max-completion-len",
            str(cfg["completion"]),
        ]
    out = launch.work / f"ours-{recipe}-{launch.mode}-{attempt}"
    rows = run_recipe(recipe, launch, warmup + steps, flags, out)
    if isinstance(rows, dict):
        return rows
    timed = rows[warmup:]
    expected = tokens_per_step(recipe, cfg)
    assert all(r["tokens"] == expected for r in timed), "rows are not of the fixed length"
    step_s = statistics.median(r["step_s"] for r in timed)
    return {"tok_s": expected / step_s, "step_s": step_s}


def run_trl(recipe: str, launch: Launch, warmup: int, steps: int, attempt: int) -> dict:
    if importlib.util.find_spec("trl") is None:
        return {"skipped": "trl is not installed"}
    mode, work = launch.mode, launch.work
    out = work / f"trl-{recipe}-{mode}-{attempt}.json"
    command = trl_worker_command(__file__, mode, work, launch.gpu, warmup, steps, out)
    return run_trl_worker(command + ["--recipe", recipe], launch.cfg, out)


def trl_worker(args) -> None:
    """Inside `accelerate launch`: trl's SFTTrainer or DPOTrainer on the same rows, timed."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    cfg, work = worker_setting(), Path(args.trl_worker)
    gpu = torch.cuda.is_available()
    rows = [json.loads(line) for line in (work / f"{args.recipe}.jsonl").read_text().splitlines()]
    times: list[float] = []

    common = {
        "output_dir": str(work / f"trl-out-{args.recipe}"),
        "per_device_train_batch_size": cfg["micro"],
        "gradient_accumulation_steps": cfg["accum"],
        "learning_rate": 1e-6,
        "max_steps": args.warmup + args.steps,
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "bf16": gpu,
        "use_cpu": not gpu,
        "seed": 0,
        "max_length": cfg["prompt"] + cfg["completion"],
        "ddp_backend": gloo_if_cpu_ddp(),
    }
    tok = AutoTokenizer.from_pretrained(work / "model")
    if args.recipe == "sft":
        from trl import SFTConfig, SFTTrainer

        conf = SFTConfig(**common, packing=False, completion_only_loss=True)
        trainer = SFTTrainer(
            model=str(work / "model"),
            args=conf,
            processing_class=tok,
            train_dataset=Dataset.from_list(rows),
            callbacks=[step_timer(times)],
        )
    else:
        from trl import DPOConfig, DPOTrainer

        conf = DPOConfig(**common, beta=0.1)
        trainer = DPOTrainer(
            model=str(work / "model"),
            args=conf,
            processing_class=tok,
            train_dataset=Dataset.from_list(rows),
            callbacks=[step_timer(times)],
        )
    trainer.train()
    step_s = statistics.median(times[args.warmup :])
    if trainer.accelerator.is_main_process:
        tokens = tokens_per_step(args.recipe, cfg)
        Path(args.out).write_text(json.dumps({"tok_s": tokens / step_s, "step_s": step_s}))


def best_run(runs: list[dict]) -> dict:
    """The fastest of the repeated runs (a shared machine only ever slows a run down), with
    every run's tokens/s kept for the record."""
    timed = [r for r in runs if "tok_s" in r]
    if not timed:
        return runs[-1]
    best = max(timed, key=lambda r: r["tok_s"])
    return {**best, "all_tok_s": [round(r["tok_s"]) for r in timed]}


def run_grpo(work: Path, modes: list[str], warmup: int, steps: int, no_trl: bool) -> dict:
    """benchmarks/grpo_throughput.py in this same invocation (its own GRPO-shaped setting)."""
    out = work / "grpo.json"  # not stdout: libraries print warnings there
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "grpo_throughput.py"),
        "--modes",
        *modes,
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--out",
        str(out),
    ]
    if no_trl:
        cmd.append("--no-trl")
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return {"error": res.stderr[-1500:]}
    return json.loads(out.read_text())["results"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=["sft", "dpo", "grpo"])
    parser.add_argument(
        "--modes",
        nargs="+",
        default=None,
        help="plain, zero2, zero3 (default: plain on CPU, all on GPU)",
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=5, help="timed optimizer steps")
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs of each side, alternated; the fastest counts"
    )
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--no-trl", action="store_true", help="measure only our recipes")
    parser.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--recipe", default="sft", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        trl_worker(args)
        return 0
    import torch

    gpu = torch.cuda.is_available()
    cfg = setting(gpu)
    modes = args.modes or (["plain", "zero2", "zero3"] if gpu else ["plain"])
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
        for recipe in [r for r in args.recipes if r != "grpo"]:
            for mode in modes:
                launch = Launch(mode, work, cfg, gpu)
                ours_runs, trl_runs = [], []
                for attempt in range(args.repeats):  # alternated: a busy neighbour hits both
                    ours_runs.append(run_ours(recipe, launch, args.warmup, args.steps, attempt))
                    if not args.no_trl:
                        trl_runs.append(run_trl(recipe, launch, args.warmup, args.steps, attempt))
                ours = best_run(ours_runs)
                trl = best_run(trl_runs) if trl_runs else {"skipped": "--no-trl"}
                entry = {"ours": ours, "trl": trl}
                if "tok_s" in ours and "tok_s" in trl:
                    entry["ours_over_trl"] = round(ours["tok_s"] / trl["tok_s"], 2)
                result["results"][f"{recipe}/{mode}"] = entry
                print(
                    f"{recipe}/{mode}: ours {ours.get('tok_s', ours)} tok/s, "
                    f"trl {trl.get('tok_s', trl)} tok/s",
                    file=sys.stderr,
                )
        if "grpo" in args.recipes:
            grpo = run_grpo(work, modes, args.warmup, args.steps, args.no_trl)
        else:
            grpo = {}
        for mode, entry in grpo.items():
            if isinstance(entry, dict) and "speedup" in entry:
                entry["ours_over_trl"] = entry.pop("speedup")
            result["results"][f"grpo/{mode}"] = entry
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
