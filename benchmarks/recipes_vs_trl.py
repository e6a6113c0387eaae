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
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
BIN = Path(sys.executable).parent
# (hidden, intermediate, layers, heads, kv heads, vocab or None = the tiny tokenizer's)
SHAPES = {"small": (256, 512, 4, 4, 2, None), "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 151936)}


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def digits(generator, count: int) -> str:
    import torch

    return "".join(str(int(d)) for d in torch.randint(0, 10, (count,), generator=generator))


def write_inputs(work: Path, cfg: dict, gpu: bool) -> None:
    """Model dir, SFT rows and DPO pairs of fixed length, and DeepSpeed/accelerate configs."""
    sys.path.insert(0, str(RECIPES))
    import common
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    tok = common.build_tiny_tokenizer()
    hidden, inter, layers, heads, kv, vocab = SHAPES[cfg["shape"]]
    model_cfg = Qwen2Config(
        vocab_size=vocab or len(tok),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(model_cfg).save_pretrained(work / "model")
    tok.save_pretrained(work / "model")
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
    for stage in (2, 3):
        ds = {
            "train_micro_batch_size_per_gpu": cfg["micro"],
            "gradient_accumulation_steps": cfg["accum"],
            "gradient_clipping": 1.0,
            "bf16": {"enabled": gpu},
            "zero_optimization": {"stage": stage},
        }
        if stage == 3:
            ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
        (work / f"zero{stage}.json").write_text(json.dumps(ds))
        (work / f"zero{stage}.yaml").write_text(
            "distributed_type: DEEPSPEED\nnum_processes: 1\nnum_machines: 1\nmachine_rank: 0\n"
            f"deepspeed_config:\n  deepspeed_config_file: {work / f'zero{stage}.json'}\n"
            "  zero3_init_flag: false\n"
        )


def launch_prefix(mode: str, work: Path, gpu: bool) -> list[str]:
    cmd = [str(BIN / "accelerate"), "launch", "--main_process_port", str(free_port())]
    if mode != "plain":
        return cmd + ["--config_file", str(work / f"{mode}.yaml")]
    cmd += ["--num_processes", "1", "--mixed_precision", "bf16" if gpu else "no"]
    return cmd if gpu else cmd + ["--cpu"]


def tokens_per_step(recipe: str, cfg: dict) -> int:
    sequences = cfg["micro"] * cfg["accum"]
    if recipe == "dpo":
        sequences *= 2  # chosen + rejected
    return sequences * (cfg["prompt"] + cfg["completion"])


def run_ours(
    recipe: str, mode: str, work: Path, cfg: dict, gpu: bool, warmup: int, steps: int, attempt: int
) -> dict:
    out = work / f"ours-{recipe}-{mode}-{attempt}"
    flags = [
        "--model",
        str(work / "model"),
        "--dataset",
        str(work / f"{recipe}.jsonl"),
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
        "--learning-rate",
        "1e-6",
    ]
    if recipe == "sft":
        flags += ["--max-seq-len", str(cfg["prompt"] + cfg["completion"])]
    else:
        flags += [
            "--max-prompt-len",
            str(cfg["prompt"]),
            "--max-completion-len",
            str(cfg["completion"]),
        ]
    cmd = launch_prefix(mode, work, gpu) + [str(RECIPES / f"{recipe}.py"), *flags]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return {"error": (res.stdout + res.stderr)[-1500:]}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = rows[warmup:]
    expected = tokens_per_step(recipe, cfg)
    assert all(r["tokens"] == expected for r in timed), "rows are not of the fixed length"
    step_s = statistics.median(r["step_s"] for r in timed)
    return {"tok_s": expected / step_s, "step_s": step_s}


def run_trl(
    recipe: str, mode: str, work: Path, cfg: dict, gpu: bool, warmup: int, steps: int, attempt: int
) -> dict:
    if importlib.util.find_spec("trl") is None:
        return {"skipped": "trl is not installed"}
    out = work / f"trl-{recipe}-{mode}-{attempt}.json"
    cmd = launch_prefix(mode, work, gpu) + [
        __file__,
        "--trl-worker",
        str(work),
        "--recipe",
        recipe,
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--out",
        str(out),
    ]
    env = {**os.environ, "BENCH_CFG": json.dumps(cfg)}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        return {"error": (res.stdout + res.stderr)[-1500:]}
    return json.loads(out.read_text())


def trl_worker(args) -> None:
    """Inside `accelerate launch`: trl's SFTTrainer or DPOTrainer on the same rows, timed."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback

    cfg, work = json.loads(os.environ["BENCH_CFG"]), Path(args.trl_worker)
    gpu = torch.cuda.is_available()
    multi = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rows = [json.loads(line) for line in (work / f"{args.recipe}.jsonl").read_text().splitlines()]
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.started = time.time()

        def on_step_end(self, *a, **k):
            times.append(time.time() - self.started)

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
        "ddp_backend": "gloo" if multi and not gpu else None,
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
            callbacks=[Timer()],
        )
    else:
        from trl import DPOConfig, DPOTrainer

        conf = DPOConfig(**common, beta=0.1)
        trainer = DPOTrainer(
            model=str(work / "model"),
            args=conf,
            processing_class=tok,
            train_dataset=Dataset.from_list(rows),
            callbacks=[Timer()],
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
                ours_runs, trl_runs = [], []
                for attempt in range(args.repeats):  # alternated: a busy neighbour hits both
                    ours_runs.append(
                        run_ours(recipe, mode, work, cfg, gpu, args.warmup, args.steps, attempt)
                    )
                    if not args.no_trl:
                        trl_runs.append(
                            run_trl(recipe, mode, work, cfg, gpu, args.warmup, args.steps, attempt)
                        )
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
