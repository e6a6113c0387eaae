"""The commands the documents show (README.md, docs/launch.md, recipes/README.md,
deepspeed_configs/README.md) run as written, in order, from a directory laid out like the
repository root: a reader who types them one after another must not hit an error.

Each document's ```bash blocks run in one directory, top to bottom, so a command that writes over
an earlier command's output without `--force` fails here as it would for the reader. The blocks
of recipes/README.md are alternatives (each writes its own cfg/): each gets a fresh directory.

What runs:
- every `zerofit` command except `doctor` (it checks the real cluster: this machine has none of
  the GPUs the configs name) and `wizard` (interactive: tests/wizard/test_wizard_e2e.py): each
  must exit 0;
- every recipe command (`test_every_readme_recipe_command_runs`), with what is added below.

What is added to recipe commands, and why (everything else is the document's text):
- The hub models the YAMLs name (Qwen2.5-0.5B, -Instruct) cannot be downloaded here: a tiny
  stand-in is put in a private Hugging Face cache under the same id (HF_HUB_OFFLINE=1), so
  `--model Qwen/...` resolves exactly as it would from a user's cache.
- Time: `--max-steps 1 --save-every 1 --output-dir <fresh dir>` is appended to each training
  command (GRPO also `--max-completion-len 8`); a `--resume-from latest` line reuses the previous
  run's directory with `--max-steps 2`. `accelerate launch` gets `--num_processes 2` in place of
  the document's count (the examples say 8 GPUs; this machine has 2 cores) and a free
  `--main_process_port`; so a `zerofit config` line plans `--gpus-per-node 2`, since DeepSpeed
  refuses an explicit batch planned for 8 processes under 2 (train_batch_size != micro x
  accumulation x world size).
- Multi-node lines (`--machine_rank`) need other machines: their accelerate arguments are parsed
  by accelerate's own launch parser and their recipe arguments by the recipe, not run.

Run: .venv/bin/python -m pytest tests/recipes/test_readme_commands.py -q   (serial; ~8 launches)
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from recipe_runs import BIN, REPO, free_port, load_recipe, save_tiny_model

DOCUMENTS = ["README.md", "docs/launch.md", "recipes/README.md", "deepspeed_configs/README.md"]
BLOCKS_ARE_ALTERNATIVES = {"recipes/README.md"}  # each block in a fresh directory
RECIPE_PATH = re.compile(r"^recipes/(\w+)\.py$")
NOT_RUN = {"doctor", "wizard"}  # zerofit subcommands this machine cannot run (module docstring)
LIMIT = 300  # s per command: generous for a ~15 s run on a busy 2-core machine


@dataclass(frozen=True)
class Command:
    """One shell command of a document: its words and the number of its ```bash block."""

    words: list[str]
    block: int


def document_commands(text: str) -> list[Command]:
    """Every command of a document's ```bash blocks, in order (comments dropped, `\\` joined)."""
    commands = []
    for number, body in enumerate(re.findall(r"```bash\n(.*?)```", text, flags=re.S)):
        for line in body.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # not one shell command (a heredoc line, say)
                assert "recipes/" not in line, f"cannot read document line: {line}"
                continue
            if words:
                commands.append(Command(words, number))
    return commands


def recipe_of(command: list[str]) -> tuple[str, int] | None:
    """(recipe name, index of its script in the command) when the command runs a recipe."""
    for i, word in enumerate(command):
        match = RECIPE_PATH.match(word)
        if match:
            return match.group(1), i
    return None


def fresh_root(parent: Path, name: str) -> Path:
    """A directory laid out like the repository root (recipes/ and deepspeed_configs/)."""
    root = parent / name
    root.mkdir()
    for folder in ("recipes", "deepspeed_configs"):
        (root / folder).symlink_to(REPO / folder)
    return root


def roots_by_block(document: str, commands: list[Command], parent: Path) -> dict[int, Path]:
    """The directory each block of ``document`` runs in: one for all, or one per block."""
    slug = document.replace("/", "_")
    blocks = sorted({c.block for c in commands})
    if document in BLOCKS_ARE_ALTERNATIVES:
        return {block: fresh_root(parent, f"{slug}-{block}") for block in blocks}
    root = fresh_root(parent, slug)
    return {block: root for block in blocks}


def run_zerofit(command: Command, root: Path, env: dict, document: str) -> None:
    """Run one `zerofit` line as written: it must succeed, with no traceback. It runs through
    the CLI's own entry function in this process, in ``root`` with ``env`` (a new interpreter
    per line spent 1-3 s importing what this one has loaded); an exception fails the test as a
    traceback would."""
    from zerofit.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(root)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(command.words[1:])
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    out, err = stdout.getvalue(), stderr.getvalue()
    shown = f"{document}: {shlex.join(command.words)}\n{out[-1500:]}\n{err[-2000:]}"
    assert code == 0, shown
    assert "Traceback" not in err, shown


def is_runnable_zerofit(words: list[str]) -> bool:
    return words[0] == "zerofit" and len(words) > 1 and words[1] not in NOT_RUN


def test_readme_zerofit_commands_run_in_order(tmp_path):
    """Every `zerofit` command of the documents, typed in order, succeeds. Before the
    README gave each example its own `--out`, four of five `zerofit launch ... --out run/` lines
    failed on the files the first one wrote."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    ran = []
    for document in DOCUMENTS:
        commands = document_commands((REPO / document).read_text())
        roots = roots_by_block(document, commands, tmp_path)
        for command in commands:
            if is_runnable_zerofit(command.words):
                run_zerofit(command, roots[command.block], env, document)
                ran.append(shlex.join(command.words))
    for sub in ("config", "check", "launch"):  # the README shows each of these
        assert any(c.startswith(f"zerofit {sub} ") for c in ran), sub


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


def training_command(command: list[str], recipe: str, out: Path, resume: bool) -> list[str]:
    """A recipe line as this machine runs it: this Python, 2 processes, a free port, fast flags."""
    cmd = list(command)
    if cmd[0] == "python":
        cmd[0] = sys.executable
    elif cmd[:2] == ["accelerate", "launch"]:
        port = str(free_port())
        cmd = [str(BIN / "accelerate"), "launch", "--num_processes", "2"]
        cmd += ["--main_process_port", port, *without_process_count(command[2:])]
    return cmd + fast_flags(recipe, out, resume)


def planned_for_two_processes(words: list[str]) -> list[str]:
    """A `zerofit config` line with `--gpus-per-node 2` in place of the document's count (the
    launches that use its files run 2 processes here); any other line as written."""
    if words[:2] != ["zerofit", "config"]:
        return words
    planned = list(words)
    for i, word in enumerate(planned):
        if word == "--gpus-per-node" and i + 1 < len(planned):
            planned[i + 1] = "2"
        elif word.startswith("--gpus-per-node="):
            planned[i] = "--gpus-per-node=2"
    return planned


def without_process_count(arguments: list[str]) -> list[str]:
    """``accelerate launch`` arguments less the document's ``--num_processes N`` (the last one
    given wins, so the document's 8 would override this machine's 2)."""
    kept, skip = [], False
    for argument in arguments:
        if skip:
            skip = False
        elif argument == "--num_processes":
            skip = True
        elif not argument.startswith("--num_processes="):
            kept.append(argument)
    return kept


@pytest.mark.distributed
@pytest.mark.light
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
    for document in DOCUMENTS:
        commands = document_commands((REPO / document).read_text())
        roots = roots_by_block(document, commands, tmp_path)
        last_out: dict[tuple[str, str], Path] = {}  # (recipe, launcher) -> its last run
        for command in commands:
            words, root = command.words, roots[command.block]
            found = recipe_of(words)
            if is_runnable_zerofit(words):  # configs the launches use, or launch scripts
                here = Command(planned_for_two_processes(words), command.block)
                run_zerofit(here, root, env, document)
                if found:
                    ran.append(shlex.join(words))
                continue
            if not found:
                continue
            recipe, script = found
            if "--machine_rank" in words:
                check_multinode_line(words, recipe, script)
                parsed.append(shlex.join(words))
                continue
            key = shlex.join(words)
            resume = "--resume-from" in words
            if key in seen and "cfg/" not in key and not resume:
                last_out[recipe, words[0]] = seen[key]
                continue
            out = last_out.get((recipe, words[0])) if resume else root / f"out-{len(ran)}"
            assert out is not None, f"{document}: nothing to resume before {key}"
            seen[key] = out
            last_out[recipe, words[0]] = out
            cmd = training_command(words, recipe, out, resume)
            res = subprocess.run(
                cmd, cwd=root, env=env, capture_output=True, text=True, timeout=LIMIT
            )
            assert res.returncode == 0, (
                f"{document}: {key}\n{res.stdout[-1500:]}\n{res.stderr[-2500:]}"
            )
            ran.append(key)
    runnable = [c for c in ran if "zerofit launch" not in c]
    for name in ("sft", "dpo", "grpo"):  # one GPU, one node, and multi-node, for each recipe
        assert any(f"python recipes/{name}.py" in c for c in runnable), name
        assert any("accelerate launch" in c and f"recipes/{name}.py" in c for c in runnable), name
        assert any(f"recipes/{name}.py" in c for c in parsed), name
