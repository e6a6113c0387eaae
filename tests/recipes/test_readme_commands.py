"""Every recipe command the READMEs show (README.md, recipes/README.md, deepspeed_configs/README.md)
runs as written, from a directory laid out like the repository root.

What is added, and why (everything else is the README's text):
- The hub models the YAMLs name (Qwen2.5-0.5B, -Instruct) cannot be downloaded here: a tiny
  stand-in is put in a private Hugging Face cache under the same id (HF_HUB_OFFLINE=1), so
  `--model Qwen/...` resolves exactly as it would from a user's cache.
- Time: `--max-steps 1 --save-every 1 --output-dir <fresh dir>` is appended to each training
  command (GRPO also `--max-completion-len 8`); a `--resume-from latest` line reuses the previous
  run's directory with `--max-steps 2`. `accelerate launch` gets `--num_processes 2` (the presets
  say 8 GPUs; this machine has 2 cores) and a free `--main_process_port`.
- Multi-node lines (`--machine_rank`) need other machines: their accelerate arguments are parsed
  by accelerate's own launch parser and their recipe arguments by the recipe, not run.
`zerofit config` lines in the same block run as written first (they write the `cfg/` the
launches use); `zerofit launch ... -- recipes/x.py` lines run as written (they write scripts).

Run: .venv/bin/python -m pytest tests/recipes/test_readme_commands.py -q   (serial; ~8 launches)
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from recipe_runs import BIN, REPO, free_port, load_recipe, save_tiny_model

pytestmark = pytest.mark.distributed
READMES = ["README.md", "recipes/README.md", "deepspeed_configs/README.md"]
RECIPE_PATH = re.compile(r"^recipes/(\w+)\.py$")
LIMIT = 300  # s per command: generous for a ~15 s run on a busy 2-core machine


def bash_commands(text: str) -> list[list[list[str]]]:
    """Each ```bash block of a README as a list of commands (comments dropped, `\\` joined)."""
    blocks = []
    for body in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = body.replace("\\\n", " ")
        commands = []
        for line in joined.splitlines():
            try:
                commands.append(shlex.split(line, comments=True))
            except ValueError:  # not one shell command (a heredoc line, say)
                assert "recipes/" not in line, f"cannot read README line: {line}"
        blocks.append([c for c in commands if c])
    return blocks


def recipe_of(command: list[str]) -> tuple[str, int] | None:
    """(recipe name, index of its script in the command) when the command runs a recipe."""
    for i, word in enumerate(command):
        match = RECIPE_PATH.match(word)
        if match:
            return match.group(1), i
    return None


def stand_in_hub_cache(root: Path) -> Path:
    """A Hugging Face cache holding the tiny model under every hub id the recipe YAMLs name."""
    import yaml

    model = save_tiny_model(root / "tiny")
    cache = root / "hub"
    ids = {
        yaml.safe_load((REPO / "recipes" / f"{n}.yaml").read_text())["model"]
        for n in ("sft", "dpo", "grpo")
    }
    for hub_id in ids:
        repo = cache / ("models--" + hub_id.replace("/", "--"))
        snapshot = repo / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True)
        for file in model.iterdir():
            (snapshot / file.name).write_bytes(file.read_bytes())
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("0" * 40)
    return cache


def fast_flags(recipe: str, out: Path, resume: bool) -> list[str]:
    flags = ["--output-dir", str(out), "--max-steps", "2" if resume else "1", "--save-every", "1"]
    return flags + (["--max-completion-len", "8"] if recipe == "grpo" else [])


def check_multinode_line(command: list[str], recipe: str, script: int) -> None:
    """Parse (not run) a per-node command: accelerate's parser, then the recipe's."""
    from accelerate.commands.launch import launch_command_parser

    launch_args = launch_command_parser().parse_args(command[2 : script + 1] + ["--"])
    assert launch_args.machine_rank in (0, 1)
    load_recipe(recipe).parse_args(command[script + 1 :])


def test_every_readme_recipe_command_runs(tmp_path):
    cache = stand_in_hub_cache(tmp_path)
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    seen: dict[str, Path] = {}  # command -> its output dir (a README repeats a command: run once)
    ran, parsed = [], []
    for readme in READMES:
        for number, block in enumerate(bash_commands((REPO / readme).read_text())):
            if not any(recipe_of(c) for c in block):
                continue
            root = tmp_path / f"{readme.replace('/', '_')}-{number}"  # a fresh repository root
            root.mkdir()
            for name in ("recipes", "deepspeed_configs"):
                (root / name).symlink_to(REPO / name)
            last_out: dict[tuple[str, str], Path] = {}  # (recipe, launcher) -> its last run
            for command in block:
                found = recipe_of(command)
                if command[:2] == ["zerofit", "config"] and not found:
                    res = subprocess.run(
                        [sys.executable, "-m", "zerofit", *command[1:]],
                        cwd=root,
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=LIMIT,
                    )
                    shown = f"{readme}: {shlex.join(command)}\n{res.stderr[-2000:]}"
                    assert res.returncode == 0, shown
                    continue
                if not found:
                    continue
                recipe, script = found
                if "--machine_rank" in command:
                    check_multinode_line(command, recipe, script)
                    parsed.append(shlex.join(command))
                    continue
                if command[0] == "zerofit":  # `zerofit launch ... -- recipes/x.py`: writes scripts
                    cmd = [sys.executable, "-m", "zerofit", *command[1:]]
                else:
                    key = shlex.join(command)
                    resume = "--resume-from" in command
                    if key in seen and "cfg/" not in key and not resume:
                        last_out[recipe, command[0]] = seen[key]
                        continue
                    out = last_out.get((recipe, command[0])) if resume else root / f"out-{len(ran)}"
                    assert out is not None, f"{readme}: nothing to resume before {key}"
                    seen[key] = out
                    last_out[recipe, command[0]] = out
                    cmd = list(command)
                    if cmd[0] == "python":
                        cmd[0] = sys.executable
                    elif cmd[:2] == ["accelerate", "launch"]:
                        cmd = [
                            str(BIN / "accelerate"),
                            "launch",
                            "--num_processes",
                            "2",
                            "--main_process_port",
                            str(free_port()),
                            *cmd[2:],
                        ]
                    cmd += fast_flags(recipe, out, resume)
                res = subprocess.run(
                    cmd, cwd=root, env=env, capture_output=True, text=True, timeout=LIMIT
                )
                assert res.returncode == 0, (
                    f"{readme}: {shlex.join(command)}\n"
                    f"{res.stdout[-1500:]}\n{res.stderr[-2500:]}"
                )
                ran.append(shlex.join(command))
    runnable = [c for c in ran if "zerofit launch" not in c]
    for name in ("sft", "dpo", "grpo"):  # one GPU, one node, and multi-node, for each recipe
        assert any(f"python recipes/{name}.py" in c for c in runnable), name
        assert any("accelerate launch" in c and f"recipes/{name}.py" in c for c in runnable), name
        assert any(f"recipes/{name}.py" in c for c in parsed), name
