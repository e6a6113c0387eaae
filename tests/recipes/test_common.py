"""recipes/common.py: argument checking, run directories, checkpoints and metrics (no training).

Run: .venv/bin/python -m pytest tests/recipes/test_common.py -q   (~10 s)
"""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys

import pytest

from recipe_runs import RECIPES, load_recipe

grpo = load_recipe("grpo")
common = grpo.common  # the instance grpo uses: its errors say "grpo.py: ..."


def one_line_error(capsys, call) -> str:
    """Run `call`, expect exit 2 with exactly one line on stderr; return that line."""
    with pytest.raises(SystemExit) as e:
        call()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ----------------------------------------------------------------------------- flags (issue 13.8)
BAD_FLAGS = [
    (["--num-generations", "1"], "grpo.py: num_generations: 1 leaves a group nothing to compare"),
    (["--per-device-batch-size", "0"], "grpo.py: per_device_batch_size: 0 is too small"),
    (["--max-steps", "-3"], "grpo.py: max_steps: -3 is too small"),
    (
        ["--gradient-accumulation-steps", "0"],
        "grpo.py: gradient_accumulation_steps: 0 is too small",
    ),
    (["--max-completion-len", "0"], "grpo.py: max_completion_len: 0 is too small"),
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


YAML_VALUES = [
    ("max_steps: 2.5\n", "grpo.py: max_steps: 2.5 from "),
    ("max_steps: null\n", "grpo.py: max_steps: "),
    ("max_steps: [1, 2]\n", "grpo.py: max_steps: "),
    ("reward_weights: [1, 0.2]\n", "grpo.py: reward_weights: "),
    ("- max_steps\n", "grpo.py: config: "),
    ("max_steps: [\n", "grpo.py: config: "),
]


@pytest.mark.parametrize("text,start", YAML_VALUES)
def test_bad_yaml_values_are_one_line_errors(text, start, tmp_path, capsys):
    cfg = tmp_path / "r.yaml"
    cfg.write_text(text)
    assert one_line_error(capsys, lambda: grpo.parse_args(["--config", str(cfg)])).startswith(start)


def test_yaml_integer_float_is_accepted(tmp_path):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("max_steps: 3.0\nlearning_rate: 1\ngradient_checkpointing: on\n")
    args = grpo.parse_args(["--config", str(cfg)])
    assert (args.max_steps, args.learning_rate, args.gradient_checkpointing) == (3, 1.0, True)


def test_output_dir_that_is_a_file(tmp_path, capsys):
    path = tmp_path / "out"
    path.write_text("x")
    err = one_line_error(capsys, lambda: grpo.parse_args(["--output-dir", str(path)]))
    assert err == (
        f"grpo.py: output_dir: {path} is a file, not a directory " "(fix: pass a directory path)"
    )


@pytest.mark.parametrize(
    "model,start",
    [
        ("./no/such/model", "grpo.py: model: no such directory ./no/such/model"),
        ("not-an-org/not-a-model-zz", "grpo.py: model: cannot load a tokenizer from 'not-an-org/"),
    ],
)
def test_missing_or_garbage_model(model, start, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = grpo.parse_args(["--model", model])
    assert one_line_error(capsys, lambda: common.load_tokenizer(args)).startswith(start)


def test_model_dir_without_config(tmp_path, capsys):
    (tmp_path / "weights.bin").write_text("garbage")
    args = grpo.parse_args(["--model", str(tmp_path)])
    err = one_line_error(capsys, lambda: common.load_tokenizer(args))
    assert err == (
        f"grpo.py: model: {tmp_path} has no config.json " "(fix: pass a saved model directory)"
    )
    args = grpo.parse_args(["--model", str(tmp_path / "weights.bin")])
    err = one_line_error(capsys, lambda: common.load_tokenizer(args))
    assert "is a file, not a model directory" in err


def test_deepspeed_integer_wins_and_is_stated(capsys):
    args = grpo.parse_args(["--per-device-batch-size", "16", "--max-grad-norm", "0.5"])
    cfg = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }
    common.reconcile_with_deepspeed(args, cfg, None)
    assert args.per_device_batch_size == 8  # the JSON's number wins ...
    assert cfg == {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.5,
    }  # ... and "auto" takes the flag
    err = capsys.readouterr().err
    assert (
        "note: per_device_batch_size 16 -> 8: the DeepSpeed config's "
        "`train_micro_batch_size_per_gpu` wins" in err
    )


# ----------------------------------------------------------------------------- data files (13.1)
def test_dataset_path_that_does_not_exist(capsys):
    err = one_line_error(capsys, lambda: common.read_rows("data/math.jsonl", "train"))
    assert err.startswith("grpo.py: dataset: no such file data/math.jsonl")


def test_jsonl_line_that_is_not_json(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": \n')
    err = one_line_error(capsys, lambda: common.read_rows(str(data), "train"))
    assert err.startswith(f"grpo.py: dataset: {data} line 2 is not JSON")


def test_row_missing_a_field_names_it(capsys):
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b"}]
    err = one_line_error(capsys, lambda: common.check_rows(rows, ("prompt", "answer"), "d.jsonl"))
    assert err.startswith("grpo.py: answer: d.jsonl row 2 has no `answer`")
    err = one_line_error(
        capsys,
        lambda: common.check_rows([{"prompt": 3, "answer": "1"}], ("prompt", "answer"), "d.jsonl"),
    )
    assert err.startswith("grpo.py: prompt: d.jsonl row 1: `prompt` is a int, not a string")


@pytest.mark.parametrize("name", ["sft", "dpo", "grpo"])
def test_shipped_yaml_loads_and_its_data_file_exists(name, monkeypatch):
    recipe = load_recipe(name)
    monkeypatch.chdir(RECIPES.parent)  # the READMEs run recipes from the repository root
    args = recipe.parse_args(["--config", str(RECIPES / f"{name}.yaml")])
    assert len(recipe.load_rows(args)) == 200  # recipes/data/*.jsonl, every row valid


# ----------------------------------------------------------------------------- run directory (13.7)
def args_for(out, *flags):
    return grpo.parse_args(["--output-dir", str(out), *flags])


def fake_checkpoint(out, step: int, payload: bytes = b"weights" * 100) -> str:
    """A checkpoint directory written the way save_checkpoint writes its manifest."""
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.bin").write_bytes(payload)
    state = {"step": step, "files": common.list_files(str(path))}
    (path / "trainer_state.json").write_text(json.dumps(state))
    (out / "latest").write_text(path.name)
    return str(path)


def test_non_empty_output_dir_is_refused(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    err = one_line_error(capsys, lambda: common.decide_start(args_for(tmp_path)))
    assert err.startswith(f"grpo.py: output_dir: {tmp_path} is not empty")
    assert "--resume-from latest" in err and "--overwrite" in err
    assert common.decide_start(args_for(tmp_path, "--overwrite", "true")) == ""


def test_overwrite_removes_only_recipe_artifacts(tmp_path):
    fake_checkpoint(tmp_path, 3)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("mine")
    common.start_fresh_directory(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_resume_auto_starts_fresh_or_resumes(tmp_path, capsys):
    assert common.decide_start(args_for(tmp_path / "new", "--resume-from", "auto")) == ""
    path = fake_checkpoint(tmp_path, 4)
    assert common.decide_start(args_for(tmp_path, "--resume-from", "auto")) == path
    assert common.decide_start(args_for(tmp_path, "--resume-from", "latest")) == path
    err = one_line_error(
        capsys, lambda: common.decide_start(args_for(tmp_path / "new", "--resume-from", "latest"))
    )
    assert err.startswith("grpo.py: resume_from: no complete checkpoint in")


def test_truncated_latest_falls_back_to_previous(tmp_path, capsys):
    older = fake_checkpoint(tmp_path, 3)
    newest = fake_checkpoint(tmp_path, 6)
    with open(os.path.join(newest, "model.bin"), "r+b") as f:
        f.truncate(100)  # a save cut off by the crash
    assert common.decide_start(args_for(tmp_path, "--resume-from", "latest")) == older
    err = capsys.readouterr().err
    assert f"note: skipping {newest}: model.bin has 100 of 700 bytes" in err
    os.remove(os.path.join(older, "trainer_state.json"))  # no complete checkpoint left
    with pytest.raises(SystemExit):
        common.decide_start(args_for(tmp_path, "--resume-from", "latest"))


def test_truncated_checkpoint_is_named(tmp_path):
    newest = fake_checkpoint(tmp_path, 6)
    with open(os.path.join(newest, "model.bin"), "r+b") as f:
        f.truncate(100)
    assert common.checkpoint_problem(newest) == "model.bin has 100 of 700 bytes"
    (tmp_path / "checkpoint-6" / "trainer_state.json").write_text('{"step": 6, "fil')
    assert common.checkpoint_problem(newest) == "trainer_state.json is unreadable"


def test_rotation_keeps_newest(tmp_path):
    for step in (2, 4, 6, 8):
        fake_checkpoint(tmp_path, step)
    common.rotate_checkpoints(str(tmp_path), keep=2)
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("checkpoint")) == [
        "checkpoint-6",
        "checkpoint-8",
    ]


def test_torn_metrics_line_is_dropped(tmp_path):
    lines = [json.dumps({"step": s, "loss": 0.5}) for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 4, "lo')

    class Main:
        is_main_process = True

    common.MetricsLog(Main(), str(tmp_path), start_step=2)
    assert [r["step"] for r in common.read_metrics(str(tmp_path / "metrics.jsonl"))] == [1, 2]


def test_write_atomic_leaves_no_temp(tmp_path):
    common.write_atomic(str(tmp_path / "latest"), "checkpoint-2")
    assert os.listdir(tmp_path) == ["latest"]
    assert (tmp_path / "latest").read_text() == "checkpoint-2"


def test_common_doctests():
    assert doctest.testmod(common).failed == 0


def test_recipes_import_without_zerofit(tmp_path):
    """A recipe needs torch + accelerate + transformers, not the zerofit package."""
    code = (
        "import sys, builtins\nreal = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    assert not name.startswith('zerofit'), name\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        f"sys.path.insert(0, {str(RECIPES)!r})\n"
        "import sft, dpo, grpo\nprint('ok')"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
