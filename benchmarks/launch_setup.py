"""What the recipe-vs-TRL benchmarks share: the random-init model they both train, the
accelerate/DeepSpeed configs of each mode, the `accelerate launch` command line, and the TRL
side's worker plumbing (a step timer, a JSON result file).

Used by benchmarks/grpo_throughput.py and benchmarks/recipes_vs_trl.py, which import it from
their own folder (a script's folder is first on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
BIN = Path(sys.executable).parent
# (hidden, intermediate, layers, heads, kv heads, vocab or None = the tiny tokenizer's)
SHAPES = {
    "tiny": (64, 128, 2, 4, 2, None),
    "small": (256, 512, 4, 4, 2, None),
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 151936),
}


def free_port() -> int:
    """A TCP port nobody listens on, for the launch's rendezvous on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_random_model(work: Path, shape: str, max_positions: int):
    """A random-init Qwen2 model of ``shape`` and the recipes' tiny tokenizer, saved to
    ``work/model`` (both sides load it from there). Returns the tokenizer."""
    sys.path.insert(0, str(RECIPES))
    import common
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    tok = common.build_tiny_tokenizer()
    hidden, inter, layers, heads, kv, vocab = SHAPES[shape]
    model_cfg = Qwen2Config(
        vocab_size=vocab or len(tok),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(model_cfg).save_pretrained(work / "model")
    tok.save_pretrained(work / "model")
    return tok


def write_zero_configs(work: Path, cfg: dict, gpu: bool) -> None:
    """``zero2``/``zero3`` modes: a DeepSpeed JSON (bf16 on a GPU) and the accelerate YAML that
    points at it, one process. ZeRO-3 gathers the 16-bit weights at save, as TRL's trainers need
    for their final ``save_model``."""
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
    """``accelerate launch`` for ``mode``: plain (one process, bf16 on a GPU, ``--cpu`` without
    one) or a ZeRO config written by ``write_zero_configs``."""
    cmd = [str(BIN / "accelerate"), "launch", "--main_process_port", str(free_port())]
    if mode != "plain":
        return cmd + ["--config_file", str(work / f"{mode}.yaml")]
    cmd += ["--num_processes", "1", "--mixed_precision", "bf16" if gpu else "no"]
    return cmd if gpu else cmd + ["--cpu"]


def run_trl_worker(cmd: list[str], cfg: dict, out: Path) -> dict:
    """Run a benchmark's own ``--trl-worker`` under ``cmd`` with the setting in ``BENCH_CFG``;
    its result is the JSON it wrote to ``out`` (stdout carries the libraries' warnings)."""
    env = {**os.environ, "BENCH_CFG": json.dumps(cfg)}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        return {"error": (res.stdout + res.stderr)[-1500:]}
    return json.loads(out.read_text())


def worker_setting() -> dict:
    """Inside a TRL worker: the benchmark setting its parent passed in ``BENCH_CFG``."""
    return json.loads(os.environ["BENCH_CFG"])


def gloo_if_cpu_ddp() -> str | None:
    """The ``ddp_backend`` a TRL config needs: gloo for several CPU processes, else the default."""
    import torch

    multi = int(os.environ.get("WORLD_SIZE", "1")) > 1
    return "gloo" if multi and not torch.cuda.is_available() else None


def step_timer(times: list[float]):
    """A ``TrainerCallback`` that appends each optimizer step's wall time to ``times``."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            self.started = time.time()

        def on_step_end(self, *args, **kwargs):
            times.append(time.time() - self.started)

    return StepTimer()


@dataclass(frozen=True)
class Launch:
    """One benchmark side's launch: the ZeRO ``mode`` (plain, zero2, zero3), the ``work`` folder
    holding the model, rows and configs, the setting ``cfg`` (batch, lengths) and GPU or CPU."""

    mode: str
    work: Path
    cfg: dict
    gpu: bool


def run_recipe(
    recipe: str, launch: Launch, max_steps: int, flags: list[str], out: Path
) -> list[dict] | dict:
    """``accelerate launch recipes/<recipe>.py`` on the benchmark's rows with the setting's batch
    and accumulation plus the recipe's own ``flags``, writing to ``out``. Returns its metrics rows
    (one per optimizer step), or ``{"error": ...}`` when the run failed."""
    work, cfg = launch.work, launch.cfg
    dataset = work / ("data.jsonl" if recipe == "grpo" else f"{recipe}.jsonl")
    common_flags = [
        "--model",
        str(work / "model"),
        "--dataset",
        str(dataset),
        "--output-dir",
        str(out),
        "--max-steps",
        str(max_steps),
        "--save-every",
        "0",
        "--per-device-batch-size",
        str(cfg["micro"]),
        "--gradient-accumulation-steps",
        str(cfg["accum"]),
        "--learning-rate",
        "1e-6",
    ]
    script = str(RECIPES / f"{recipe}.py")
    cmd = launch_prefix(launch.mode, work, launch.gpu) + [script, *common_flags, *flags]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return {"error": (res.stdout + res.stderr)[-1500:]}
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def trl_worker_command(
    script: str, mode: str, work: Path, gpu: bool, warmup: int, steps: int, out: Path
) -> list[str]:
    """The launch of ``script --trl-worker`` (the benchmark itself) for ``mode``."""
    worker = [script, "--trl-worker", str(work), "--warmup", str(warmup), "--steps", str(steps)]
    return launch_prefix(mode, work, gpu) + [*worker, "--out", str(out)]
