"""recipes/arguments.py: flags and `--config` YAML through transformers' HfArgumentParser, every
bad value one line, `--help` with each field's help text, relative YAML paths.

Run: .venv/bin/python -m pytest tests/recipes/test_arguments.py -q   (~10 s)
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from recipe_runs import RECIPES, load_recipe, one_line_error

grpo = load_recipe("grpo")


# ----------------------------------------------------------------------------- flags
BAD_FLAGS = [
    (["--num-generations", "1"], "grpo.py: num_generations: 1 leaves a group nothing to compare"),
    (["--per-device-batch-size", "0"], "grpo.py: per_device_batch_size: 0 is too small"),
    (["--max-steps", "-3"], "grpo.py: max_steps: -3 is too small"),
    (
        ["--gradient-accumulation-steps", "0"],
        "grpo.py: gradient_accumulation_steps: 0 is too small",
    ),
    (["--max-completion-len", "0"], "grpo.py: max_completion_len: 0 is too small"),
    (["--save-every", "-1"], "grpo.py: save_every: -1 is too small (fix: use 0 or more for save"),
    (["--temperature", "0"], "grpo.py: temperature: 0.0 cannot sample"),
    (["--learning-rate=-1e-3"], "grpo.py: learning_rate: -0.001 must be > 0"),
    (["--max-step", "3"], "grpo.py: arguments: unrecognized arguments: --max-step 3"),
    (["--reward-weights", "1,x"], "grpo.py: reward_weights: '1,x' is not a list of numbers"),
    (["--reward-weights", "1"], "grpo.py: reward_weights: 1 weight(s) '1' for 2 reward(s)"),
    (["--rewards", "accuracy,lenght"], "grpo.py: rewards: unknown reward 'lenght'"),
    (
        ["--gradient-checkpointing", "maybe"],
        "grpo.py: gradient_checkpointing: 'maybe' from the command line is not a boolean",
    ),
    (
        ["--max-steps", "2.5"],
        "grpo.py: max_steps: '2.5' from the command line is not a whole number",
    ),
    (["--learning-rate", "fast"], "grpo.py: learning_rate: 'fast' from the command line is not"),
    (["--learning-rate", "nan"], "grpo.py: learning_rate: 'nan' from the command line is not fin"),
    (["--max-steps"], "grpo.py: arguments: argument --max_steps/--max-steps: expected one arg"),
    (["--config"], "grpo.py: arguments: argument --config: expected one argument"),
    (["--loss-type", "bnpo"], "grpo.py: loss_type: 'bnpo' is not one of grpo, dapo"),
    (["--config", "missing.yaml"], "grpo.py: config: no such file missing.yaml"),
    (["--resume-from", "latest", "--overwrite", "true"], "grpo.py: overwrite: --overwrite and"),
]


@pytest.mark.parametrize("flags,start", BAD_FLAGS)
def test_bad_flags_are_one_line_errors(flags, start, capsys):
    assert one_line_error(capsys, lambda: grpo.parse_args(flags)).startswith(start)


@pytest.mark.parametrize("value", ["on", "true", "1", "yes"])
def test_boolean_words_are_true(value):
    assert grpo.parse_args(["--gradient-checkpointing", value]).gradient_checkpointing is True
    assert grpo.parse_args(["--gradient-checkpointing", "off"]).gradient_checkpointing is False


def test_flag_forms_from_hf_argument_parser():
    """A bare boolean flag means true, `--no-X` turns a default-true one off, and dashes and
    underscores both work (transformers' HfArgumentParser builds these from the fields)."""
    args = grpo.parse_args(["--gradient-checkpointing", "--no-scale-rewards", "--max_steps", "4"])
    assert (args.gradient_checkpointing, args.scale_rewards, args.max_steps) == (True, False, 4)
    assert isinstance(args.learning_rate, float) and isinstance(args.max_steps, int)


def test_help_shows_each_fields_help_and_default(capsys):
    with pytest.raises(SystemExit) as e:
        grpo.parse_args(["--help"])
    assert e.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--max_steps INT, --max-steps INT optimizer steps to train (default: 150)" in shown
    assert "--beta FLOAT KL weight to the frozen reference; 0: no reference model loaded" in shown
    assert "--config YAML YAML file of `field: value` lines" in shown
    assert "--no_scale_rewards, --no-scale-rewards the same as --scale_rewards false" in shown


def test_help_needs_no_torch():
    """`--help` and the argument checks run before torch, transformers' models or accelerate
    are imported (a refused command costs a second, not a distributed start-up)."""
    code = (
        "import sys, builtins\nreal = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    assert name.split('.')[0] not in ('torch', 'accelerate', 'deepspeed'), name\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        f"sys.path.insert(0, {str(RECIPES)!r})\n"
        "import sft, dpo, grpo\n"
        "for recipe in (sft, dpo, grpo):\n"
        "    recipe.parse_args(['--max-steps', '3'])\n"
        "sft.parse_args(['--help'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "optimizer steps to train" in out.stdout


# ----------------------------------------------------------------------------- YAML
YAML_VALUES = [
    ("max_steps: 2.5\n", "grpo.py: max_steps: 2.5 from "),
    ("max_steps: null\n", "grpo.py: max_steps: "),
    ("max_steps: [1, 2]\n", "grpo.py: max_steps: "),
    ("reward_weights: [1, 0.2]\n", "grpo.py: reward_weights: "),
    ("scale_rewards: maybe\n", "grpo.py: scale_rewards: 'maybe' from "),
    ("- max_steps\n", "grpo.py: config: "),
    ("1: 2\nmax_stepz: 3\n", "grpo.py: config: unknown keys [1, 'max_stepz'] in "),
    ("max_steps: [\n", "grpo.py: config: "),
]


@pytest.mark.parametrize("text,start", YAML_VALUES)
def test_bad_yaml_values_are_one_line_errors(text, start, tmp_path, capsys):
    cfg = tmp_path / "r.yaml"
    cfg.write_text(text)
    assert one_line_error(capsys, lambda: grpo.parse_args(["--config", str(cfg)])).startswith(start)


def test_unreadable_config_files_are_one_line_errors(tmp_path, capsys):
    cfg = tmp_path / "r.yaml"
    cfg.write_bytes(b"\xff\xfe max_steps: 3")  # not UTF-8
    err = one_line_error(capsys, lambda: grpo.parse_args(["--config", str(cfg)]))
    assert err.startswith(f"grpo.py: config: {cfg} is not valid YAML ('utf-8' codec")
    err = one_line_error(capsys, lambda: grpo.parse_args(["--config", str(tmp_path)]))
    assert err == (
        f"grpo.py: config: {tmp_path} is a directory (fix: pass the YAML file of --config)"
    )


def test_yaml_integer_float_is_accepted(tmp_path):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("max_steps: 3.0\nlearning_rate: 1\ngradient_checkpointing: on\n")
    args = grpo.parse_args(["--config", str(cfg)])
    assert (args.max_steps, args.learning_rate, args.gradient_checkpointing) == (3, 1.0, True)


def test_parse_args_config_then_flags(tmp_path):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("max_steps: 7\nbeta: 0.05\nloss_type: dapo\nscale_rewards: false\n")
    args = grpo.parse_args(["--config", str(cfg), "--max-steps", "9", "--resume_from", "latest"])
    assert (args.max_steps, args.beta, args.loss_type, args.scale_rewards, args.resume_from) == (
        9,
        0.05,
        "dapo",
        False,
        "latest",
    )
    assert grpo.parse_args([]).num_generations == 8


def test_parse_args_unknown_config_key(tmp_path, capsys):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("max_step: 7\n")
    assert one_line_error(capsys, lambda: grpo.parse_args(["--config", str(cfg)])) == (
        f"grpo.py: config: unknown keys ['max_step'] in {cfg} (fix: use the names in `--help`)"
    )


def test_yaml_dataset_path_is_read_from_the_yamls_directory(tmp_path, monkeypatch):
    """A YAML naming `rows.jsonl` means the file beside it, whatever the working directory
    (it used to be read from the working directory)."""
    recipe_dir = tmp_path / "experiment"
    recipe_dir.mkdir()
    (recipe_dir / "rows.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (recipe_dir / "r.yaml").write_text("dataset: rows.jsonl\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    args = grpo.parse_args(["--config", str(recipe_dir / "r.yaml")])
    assert args.dataset == str(recipe_dir / "rows.jsonl")
    assert grpo.load_rows(args) == [{"prompt": "1+1=", "answer": "2"}]
    # a flag is the user's own path (relative to where they are); a hub name is left alone
    assert grpo.parse_args(["--dataset", "rows.jsonl"]).dataset == "rows.jsonl"
    (recipe_dir / "hub.yaml").write_text("dataset: openai/gsm8k\n")
    assert grpo.parse_args(["--config", str(recipe_dir / "hub.yaml")]).dataset == "openai/gsm8k"


@pytest.mark.parametrize("name", ["sft", "dpo", "grpo"])
def test_shipped_yaml_loads_from_any_directory(name, tmp_path, monkeypatch):
    recipe = load_recipe(name)
    monkeypatch.chdir(tmp_path)  # not the repository root: the YAML's data path still resolves
    args = recipe.parse_args(["--config", str(RECIPES / f"{name}.yaml")])
    assert len(recipe.load_rows(args)) == 200  # recipes/data/*.jsonl, every row valid


def test_output_dir_that_is_a_file(tmp_path, capsys):
    path = tmp_path / "out"
    path.write_text("x")
    err = one_line_error(capsys, lambda: grpo.parse_args(["--output-dir", str(path)]))
    assert err == (
        f"grpo.py: output_dir: {path} is a file, not a directory (fix: pass a directory path)"
    )


# ----------------------------------------------------------------------------- errors
def test_other_ranks_stay_quiet(monkeypatch, capsys):
    """Every rank of a launch meets the same bad input; only LOCAL_RANK 0 prints it. The others
    wait before exiting (the launcher stops them once rank 0 exits): exiting first, they could
    make the launcher stop rank 0 before its line was printed."""
    arguments = sys.modules["arguments"]  # as the recipes import it
    waited = []
    monkeypatch.setattr(arguments.time, "sleep", waited.append)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(SystemExit) as e:
        grpo.parse_args(["--max-steps", "0"])
    assert e.value.code == 2 and capsys.readouterr().err == ""
    assert waited == [arguments.SILENT_RANK_WAIT_S]
    monkeypatch.setenv("LOCAL_RANK", "0")
    one_line_error(capsys, lambda: grpo.parse_args(["--max-steps", "0"]))
    assert waited == [arguments.SILENT_RANK_WAIT_S]  # rank 0 prints and exits at once
