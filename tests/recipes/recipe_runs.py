"""Helpers shared by the recipe tests: load a recipe file as a module, launch it for real under
`accelerate launch`, SIGKILL it after a checkpoint, reload its final model."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
BIN = Path(sys.executable).parent
RUN_LIMIT = 300  # s: generous bound for a ~15 s warm run on a busy 2-core machine


def load_recipe(name: str):
    """recipes/<name>.py as a module (registered in sys.modules: dataclasses look it up there)."""
    path = RECIPES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_recipe_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def one_line_error(capsys, call) -> str:
    """Run `call`, expect exit 2 with exactly one line on stderr; return that line."""
    with pytest.raises(SystemExit) as e:
        call()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_configs(model: Path, root: Path, workload: str, global_batch: int, micro: int) -> dict:
    """ZeRO-2, ZeRO-3 and DDP (stage 0) configs from `zerofit config`, for 2 processes."""
    from zerofit.cli.main import main

    configs = {}
    for name, stage in (("zero2", 2), ("zero3", 3), ("ddp", 0)):
        out = root / f"{workload}-{name}"
        code = main(
            [
                "config",
                "--model",
                str(model),
                "--gpu",
                "L4",
                "--gpus-per-node",
                "2",
                "--workload",
                workload,
                "--stage",
                str(stage),
                "--global-batch",
                str(global_batch),
                "--micro-batch",
                str(micro),
                "--seq-len",
                "16",
                "--precision",
                "bf16",
                "--flavour",
                "explicit",
                "--out",
                str(out),
            ]
        )
        assert code == 0
        configs[name] = out / "accelerate.yaml"
    return configs


def recipes_common():
    """recipes/common.py, imported as the recipes import it (their folder on sys.path)."""
    if str(RECIPES) not in sys.path:
        sys.path.insert(0, str(RECIPES))
    import common

    return common


def save_tiny_model(path: Path) -> Path:
    """The recipes' tiny model (seed 0) and tokenizer saved to ``path``. Built in this process,
    where torch and transformers are loaded already (a new interpreter spends seconds importing
    them); the global RNG is left as it was."""
    import torch

    common = recipes_common()
    with torch.random.fork_rng():
        tokenizer = common.build_tiny_tokenizer()
        model = common.build_tiny_model(tokenizer, seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def launch(config: Path, recipe: str, out: Path, *flags: str, popen: bool = False, env=None):
    """`accelerate launch --config_file CONFIG recipes/RECIPE.py --output-dir OUT FLAGS`, with
    `env` added to the environment."""
    cmd = [
        str(BIN / "accelerate"),
        "launch",
        "--config_file",
        str(config),
        "--main_process_port",
        str(free_port()),
        str(RECIPES / f"{recipe}.py"),
        "--output-dir",
        str(out),
        *flags,
    ]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    if popen:  # output to a file: an unread pipe fills up (tqdm) and blocks the run
        log = open(out.parent / f"{out.name}-killed.log", "w")
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )  # own group: SIGKILL reaches every rank
    return subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_LIMIT, env=env)


def kill_after_checkpoint(proc, out: Path) -> int:
    """SIGKILL the whole run once a checkpoint exists and a later step was logged; returns the
    checkpoint step it will resume from."""
    deadline = time.time() + RUN_LIMIT
    try:
        while time.time() < deadline and proc.poll() is None:
            latest = out / "latest"
            rows = read_metrics(out)
            if latest.exists() and rows:
                done = int(latest.read_text().strip().split("-")[1])
                if rows[-1]["step"] > done:
                    break
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (out / "final").exists()
    return int((out / "latest").read_text().strip().split("-")[1])


def reload_final_model(final: Path, initial: Path) -> float:
    """Load final/ with from_pretrained (model + tokenizer), as a user would after the run; return
    the largest weight change vs ``initial``. In this process: the run's ranks have exited."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trained = AutoModelForCausalLM.from_pretrained(final)
    reference = AutoModelForCausalLM.from_pretrained(initial).state_dict()
    AutoTokenizer.from_pretrained(final)
    assert all(p.isfinite().all() for p in trained.parameters())
    return max(
        (weights.float() - reference[name].float()).abs().max().item()
        for name, weights in trained.state_dict().items()
    )


def processes_with(marker: str) -> list[int]:
    """Pids of the live processes whose environment holds MARKER=1 (a launch's ranks, which
    torch elastic starts in sessions of their own, outside the launcher's process group)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or another user's
            continue
        if f"{marker}=1".encode() in environ and state != "Z":
            found.append(int(entry.name))
    return found


def failure_text(res) -> str:
    return res.stdout[-3000:] + res.stderr[-3000:]
