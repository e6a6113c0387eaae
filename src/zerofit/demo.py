"""`make demo` (`python -m zerofit.demo`): SFT then GRPO on a tiny model, through zerofit's configs.

Offline and CPU-friendly. It saves the recipes' tiny random-init model, lets `zerofit config` plan
it for 2 processes (a GPU from the catalog stands in when there is none), then runs two
`accelerate launch` jobs with 2 processes under the ZeRO-2 configs it wrote:

1. `recipes/sft.py` on the toy task ("3+4=" -> "7"), stopped early on purpose: the model knows
   the format and some of the sums;
2. `recipes/grpo.py` from the SFT model, rewarded for the right sum: it turns the sums the model
   can sometimes sample into sums it answers every time.

Task accuracy (greedy answer == the sum, over all 100 prompts) is printed before SFT, after SFT
and after GRPO. Everything lands in `runs/demo/` (recreated each time).
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
RECIPES = REPO / "recipes"
# Chosen by trying seeds 0-4 on 2 busy CPU cores (table in recipes/README.md): SFT alone ends at
# 22-37 % accuracy, GRPO then raises it to 47-61 % in every seed tried.
SFT_STEPS = 40
GRPO_STEPS = 300
GRPO_LR = 6e-4  # lower than the recipe's default: noisy RL gradients, Adam moves every weight
GRPO_BATCH = 64  # completions per step across both processes: 8 prompts x 8 generations


# DeepSpeed JIT-compiles its C++ ops (torch.utils.cpp_extension.load) into $TORCH_EXTENSIONS_DIR,
# by default ~/.cache/torch_extensions: one directory that every venv and clone of the user shares,
# so each rebuilds the ops for the other. A directory inside the venv keeps one build per venv.
EXTENSIONS_SUBDIR = "torch_extensions"
# torch takes a `lock` file in an op's build directory around every build *and every load*, and
# waits for it without a limit or a word (torch/utils/file_baton.py FileBaton.wait). A build killed
# midway leaves the file behind. A lock is judged stale once it is older than this and no process
# works in (or names) its build directory; where /proc cannot tell, after STALE_LOCK_BLIND_S.
STALE_LOCK_S = 2 * 60
STALE_LOCK_BLIND_S = 30 * 60
# What each op the CPU runs load is, for the line printed before it compiles.
OP_PURPOSE = {
    "ShareMemCommBuilder": "the shared-memory collectives of every CPU run",
    "CPUAdamBuilder": "cpu_adam, the optimizer of offloaded runs",
}


def use_venv_extensions_dir() -> str | None:
    """Point TORCH_EXTENSIONS_DIR at ``<venv>/torch_extensions`` when unset and this Python runs
    from a venv; return the directory torch will build in (None: torch's shared default)."""
    if "TORCH_EXTENSIONS_DIR" not in os.environ and sys.prefix != sys.base_prefix:
        os.environ["TORCH_EXTENSIONS_DIR"] = str(Path(sys.prefix) / EXTENSIONS_SUBDIR)
    return os.environ.get("TORCH_EXTENSIONS_DIR")


def build_is_running(build_dir: Path) -> bool | None:
    """True when a process works in ``build_dir`` (ninja's cwd) or names it (the compiler's
    arguments); None when /proc cannot be read (not Linux)."""
    proc = Path("/proc")
    if not (proc / "self" / "cmdline").exists():
        return None
    target = str(build_dir.resolve())
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:  # gone, or another user's process
            continue
        if cwd == target or cwd.startswith(target + os.sep) or target in cmdline:
            return True
    return False


def clear_stale_build_lock(build_dir: Path, say=print) -> bool:
    """Remove ``build_dir/lock`` when a build interrupted long ago left it (see STALE_LOCK_S), and
    say so; say what is waited for when the lock may still be live. True when one was removed."""
    lock = Path(build_dir) / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    running = build_is_running(Path(build_dir))
    limit = STALE_LOCK_BLIND_S if running is None else STALE_LOCK_S
    if not running and age > limit:
        lock.unlink(missing_ok=True)
        say(f"removed {lock}: left by a build interrupted {age / 60:.0f} min ago")
        return True
    say(
        f"waiting for {lock} ({age / 60:.0f} min old): another build of this op is running; "
        "if none is, delete the file"
    )
    return False


def clear_stale_build_locks(extensions_dir: str | os.PathLike | None, say=print) -> int:
    """clear_stale_build_lock for every op under ``extensions_dir`` (``<dir>/<op>/lock``, or
    ``<dir>/py311_cpu/<op>/lock`` in torch's default layout); returns how many were removed."""
    if not extensions_dir or not Path(extensions_dir).is_dir():
        return 0
    locks = [*Path(extensions_dir).glob("*/lock"), *Path(extensions_dir).glob("*/*/lock")]
    return sum(clear_stale_build_lock(lock.parent, say) for lock in locks)


def load_deepspeed_op(builder_name: str, say=print) -> float | None:
    """Load one of DeepSpeed's JIT ops for the current accelerator, building it first when this
    venv has no build (and saying so, with what it is for: a cold build is silent for a minute
    or more); a stale lock from an interrupted build is removed first. Returns the seconds spent,
    None when the accelerator has no such op."""
    from deepspeed.accelerator import get_accelerator
    from torch.utils.cpp_extension import _get_build_directory

    started = time.perf_counter()
    builder = get_accelerator().create_op_builder(builder_name)
    if builder is None:
        return None
    build_dir = Path(_get_build_directory(builder.name, verbose=False))
    clear_stale_build_lock(build_dir, say)
    if not (build_dir / f"{builder.name}.so").exists():
        purpose = OP_PURPOSE.get(builder_name, builder_name)
        say(
            f"building DeepSpeed's {builder.name} op ({purpose}; ~1 min, once per venv, "
            f"in {build_dir.parent})..."
        )
    builder.load(verbose=False)
    return time.perf_counter() - started


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_tiny_model(model_dir: Path, seed: int) -> None:
    """The recipes' tiny model + tokenizer, saved so the planner can read its config.json."""
    code = (
        f"import sys; sys.path.insert(0, {str(RECIPES)!r}); import common\n"
        f"tok = common.build_tiny_tokenizer(); m = common.build_tiny_model(tok, seed={seed})\n"
        f"m.save_pretrained({str(model_dir)!r}); tok.save_pretrained({str(model_dir)!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def build_config_cmd(model_dir: Path, out: Path, gpu: str, workload: str) -> list[str]:
    """`zerofit config` for 2 processes, ZeRO-2, explicit micro-batch sizes."""
    cmd = [
        sys.executable,
        "-m",
        "zerofit",
        "config",
        "--model",
        str(model_dir),
        "--gpu",
        gpu,
        "--gpus-per-node",
        "2",
        "--workload",
        workload,
        "--stage",
        "2",
        "--precision",
        "bf16",
        "--flavour",
        "explicit",
        "--out",
        str(out),
        "--force",
    ]
    if workload == "grpo":
        return cmd + [
            "--global-batch",
            str(GRPO_BATCH),
            "--micro-batch",
            str(GRPO_BATCH // 2),
            "--num-generations",
            "8",
            "--seq-len",
            "16",
            "--completion-len",
            "8",
        ]
    return cmd + ["--global-batch", "32", "--micro-batch", "16", "--seq-len", "16"]


def build_launch_cmd(config: Path, recipe: str, flags: list[str]) -> list[str]:
    """The accelerate launch command of one demo stage."""
    return [
        str(Path(sys.executable).parent / "accelerate"),
        "launch",
        "--config_file",
        str(config),
        "--main_process_port",
        str(free_port()),
        str(RECIPES / recipe),
        *flags,
    ]


def task_accuracy(model_dir: Path) -> float:
    """Greedy accuracy on all 100 toy prompts: the text before EOS must be exactly the sum."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    pairs = [(a, b) for a in range(10) for b in range(10)]
    enc = tok([f"{a}+{b}=" for a, b in pairs], return_tensors="pt")  # all 4 tokens: no padding
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=False,
            max_new_tokens=4,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1] :])
    answers = [text.split(tok.eos_token)[0].strip() for text in texts]
    right = [answer == str(a + b) for answer, (a, b) in zip(answers, pairs, strict=True)]
    return sum(right) / len(right)


def run_stage(title: str, launch: list[str]) -> float:
    """Run one accelerate launch; returns its wall time in seconds (exits on failure)."""
    print(f"\n== {title}\n$ " + " ".join(["accelerate", *launch[1:]]) + "\n", flush=True)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    start = time.time()
    if subprocess.run(launch, cwd=REPO, env=env).returncode != 0:
        print(f"zerofit demo: the {title} run failed (see the output above)", file=sys.stderr)
        sys.exit(1)
    return time.time() - start


def last_rows(metrics: Path, count: int) -> list[dict]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return rows[-count:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zerofit.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seed", type=int, default=0, help="model init and data order (default 0)")
    parser.add_argument("--sft-steps", type=int, default=SFT_STEPS)
    parser.add_argument("--grpo-steps", type=int, default=GRPO_STEPS)
    parser.add_argument("--out", default="runs/demo", help="working directory (recreated)")
    args = parser.parse_args(argv)
    if not (RECIPES / "grpo.py").exists():
        print(
            f"zerofit demo: {RECIPES} not found (fix: run the demo from a source checkout)",
            file=sys.stderr,
        )
        return 2
    from zerofit.hardware import detect_local_gpus

    use_venv_extensions_dir()
    started = time.time()
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    gpu, count = detect_local_gpus()
    where = f"{count} x {gpu}"
    if not gpu:
        where = "no GPU: planned for 2 x L4, run as 2 CPU processes (gloo)"
    print(
        f"== zerofit demo: SFT then GRPO on a tiny random-init model, 2 processes, ZeRO-2 "
        f"({where})"
    )

    if not gpu:  # the CPU runs' collectives need DeepSpeed's shm op: built here, not in silence
        load_deepspeed_op("ShareMemCommBuilder", say=lambda line: print(line, flush=True))
    save_tiny_model(out / "model", args.seed)
    for workload in ("sft", "grpo"):
        cmd = build_config_cmd(out / "model", out / f"config-{workload}", gpu or "L4", workload)
        print("\n$ zerofit " + " ".join(cmd[3:]), flush=True)
        if subprocess.run(cmd, cwd=REPO).returncode != 0:
            return 1

    before = task_accuracy(out / "model")
    seed = ["--seed", str(args.seed)]
    sft_flags = [
        "--model",
        str(out / "model"),
        "--output-dir",
        str(out / "sft"),
        "--max-steps",
        str(args.sft_steps),
        "--save-every",
        "0",
        *seed,
    ]
    sft_s = run_stage(
        "1/2 SFT", build_launch_cmd(out / "config-sft" / "accelerate.yaml", "sft.py", sft_flags)
    )
    after_sft = task_accuracy(out / "sft" / "final")
    grpo_flags = [
        "--model",
        str(out / "sft" / "final"),
        "--output-dir",
        str(out / "grpo"),
        "--max-steps",
        str(args.grpo_steps),
        "--save-every",
        "0",
        "--rewards",
        "accuracy",
        "--reward-weights",
        "1",
        "--learning-rate",
        str(GRPO_LR),
        *seed,
    ]
    grpo_s = run_stage(
        "2/2 GRPO", build_launch_cmd(out / "config-grpo" / "accelerate.yaml", "grpo.py", grpo_flags)
    )
    after_grpo = task_accuracy(out / "grpo" / "final")
    sampled = sum(r["reward/accuracy"] for r in last_rows(out / "grpo" / "metrics.jsonl", 5)) / 5

    print(f"\n== task accuracy (greedy, 100 sums, seed {args.seed})")
    print(f"  before SFT   {before:6.1%}")
    print(f"  after SFT    {after_sft:6.1%}   ({args.sft_steps} steps, {sft_s:.0f} s)")
    print(
        f"  after GRPO   {after_grpo:6.1%}   ({args.grpo_steps} steps, {grpo_s:.0f} s; "
        f"sampled accuracy of its last 5 steps {sampled:.1%})"
    )
    print(
        f"total {time.time() - started:.0f} s; models in {out / 'sft' / 'final'} and "
        f"{out / 'grpo' / 'final'}"
    )
    print(
        json.dumps(
            {
                "seed": args.seed,
                "before": before,
                "after_sft": after_sft,
                "after_grpo": after_grpo,
                "seconds": round(time.time() - started),
            }
        )
    )
    return 0 if after_grpo > after_sft else 1


if __name__ == "__main__":
    sys.exit(main())
