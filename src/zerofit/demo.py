"""`make demo` (`python -m zerofit.demo`): plan + write a ZeRO-2 config, then GRPO-train the tiny default.

Offline and CPU-friendly: saves the recipe's tiny random-init model, lets `zerofit config` plan
it for 2 processes (a GPU from the catalog stands in when there is none), prints the plan and the
launch command, runs `accelerate launch` with 2 processes on `recipes/grpo.py`, and prints the
mean reward at the start and at the end. Everything lands in `runs/demo/` (recreated each time).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "grpo.py"
WINDOW = 10  # steps averaged for the "first" and "last" reward, since one step is noisy


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_tiny_model(model_dir: Path) -> None:
    """The recipe's embedded model + tokenizer, saved so the planner can read its config.json."""
    code = (f"import sys; sys.path.insert(0, {str(RECIPE.parent)!r}); import grpo\n"
            "tok = grpo.build_tiny_tokenizer(); m = grpo.build_tiny_model(tok, seed=0)\n"
            f"m.save_pretrained({str(model_dir)!r}); tok.save_pretrained({str(model_dir)!r})")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def build_config_cmd(model_dir: Path, out: Path, gpu: str) -> list[str]:
    """`zerofit config` for 2 processes, ZeRO-2, 16 completions per process per step (4 prompts x 8)."""
    return [sys.executable, "-m", "zerofit", "config", "--model", str(model_dir), "--gpu", gpu,
            "--gpus-per-node", "2", "--workload", "grpo", "--stage", "2", "--global-batch", "32",
            "--num-generations", "8", "--seq-len", "16", "--completion-len", "8", "--precision", "bf16",
            "--flavour", "explicit", "--out", str(out), "--force"]


def build_launch_cmd(config: Path, port: int, output_dir: Path, steps: int) -> list[str]:
    """The accelerate launch command the demo runs (the recipe's defaults are the toy task)."""
    return [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", str(config),
            "--main_process_port", str(port), str(RECIPE), "--output-dir", str(output_dir),
            "--model", str(output_dir.parent / "model"), "--max-steps", str(steps), "--save-every", "50"]


def summarize(metrics_path: Path) -> dict:
    """First and last mean reward (over WINDOW steps each) from the recipe's metrics.jsonl."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    mean = lambda part, key="reward": sum(r[key] for r in part) / len(part)  # noqa: E731
    first, last = rows[:WINDOW], rows[-WINDOW:]
    return {"steps": len(rows), "first_reward": mean(first), "last_reward": mean(last),
            "first_accuracy": mean(first, "reward/accuracy"), "last_accuracy": mean(last, "reward/accuracy"),
            "first_format": mean(first, "reward/format"), "last_format": mean(last, "reward/format")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerofit.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="GRPO steps (default 150, about a minute on 2 CPUs)")
    parser.add_argument("--out", default="runs/demo", help="working directory (recreated)")
    args = parser.parse_args(argv)
    if not RECIPE.exists():
        print(f"zerofit demo: {RECIPE} not found (fix: run the demo from a source checkout)", file=sys.stderr)
        return 2
    from zerofit.hardware import detect_local_gpus

    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    gpu, count = detect_local_gpus()
    stand_in = gpu or "L4"
    where = f"{count} x {gpu}" if gpu else "no GPU: planned for 2 x L4, run as 2 CPU processes (gloo)"
    print(f"== zerofit demo: GRPO on a tiny random-init model, 2 processes, ZeRO-2 ({where})\n")

    save_tiny_model(out / "model")
    cmd = build_config_cmd(out / "model", out / "config", stand_in)
    print("$ zerofit " + " ".join(cmd[3:]))
    if subprocess.run(cmd, cwd=REPO).returncode != 0:
        return 1

    launch = build_launch_cmd(out / "config" / "accelerate.yaml", free_port(), out / "run", args.steps)
    print("\n$ " + " ".join(["accelerate", *launch[1:]]) + "\n")
    start = time.time()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    if subprocess.run(launch, cwd=REPO, env=env).returncode != 0:
        print("zerofit demo: the training run failed (see the output above)", file=sys.stderr)
        return 1
    wall = time.time() - start
    s = summarize(out / "run" / "metrics.jsonl")
    print(f"\n== {s['steps']} steps in {wall:.0f} s (including process start-up)")
    print(f"mean reward   first {WINDOW} steps {s['first_reward']:.3f}  ->  last {WINDOW} steps {s['last_reward']:.3f}")
    print(f"  format      {s['first_format']:.3f} -> {s['last_format']:.3f}   (a number, then end of sequence)")
    print(f"  accuracy    {s['first_accuracy']:.3f} -> {s['last_accuracy']:.3f}   (the right sum; this tiny model mostly learns the format)")
    print(f"metrics: {out / 'run' / 'metrics.jsonl'}   final model: {out / 'run' / 'final'}")
    return 0 if s["last_reward"] > s["first_reward"] else 1


if __name__ == "__main__":
    sys.exit(main())
