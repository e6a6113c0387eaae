"""`zerofit config` / `zerofit presets` / `zerofit check` through zerofit.cli.main; --help stays light.

.venv/bin/python -m pytest tests/cli/test_cli_config.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO
from zerofit.cli.main import main

ARGS = [
    "--model",
    "qwen2.5-0.5b",
    "--gpu",
    "A100-80GB",
    "--gpus-per-node",
    "4",
    "--stage",
    "3",
    "--micro-batch",
    "2",
    "--global-batch",
    "16",
]


def test_config_writes_three_files_and_prints_launch(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["config", *ARGS, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == [
        "accelerate.yaml",
        "answers.yaml",
        "ds_config.json",
    ]
    ds = json.loads((out / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3
    assert (
        ds["train_batch_size"]
        == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 4
    )
    assert (
        f"deepspeed_config_file: {out / 'ds_config.json'}" in (out / "accelerate.yaml").read_text()
    )
    assert f"accelerate launch --config_file {out / 'accelerate.yaml'} your_script.py" in text


def test_yaml_names_its_json_absolutely_so_any_directory_works(tmp_path, monkeypatch, capsys):
    # accelerate opens deepspeed_config_file relative to each worker's cwd: a relative --out must not leak in.
    monkeypatch.chdir(tmp_path)
    assert main(["config", *ARGS, "--out", "rel"]) == 0
    import yaml

    cfg = yaml.safe_load((tmp_path / "rel" / "accelerate.yaml").read_text())
    path = cfg["deepspeed_config"]["deepspeed_config_file"]
    assert path == str(tmp_path / "rel" / "ds_config.json")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # what a worker launched from another directory does with it
    from accelerate.commands.config.config_args import load_config_from_file

    loaded = load_config_from_file(str(tmp_path / "rel" / "accelerate.yaml"))
    assert (
        json.loads(open(loaded.deepspeed_config["deepspeed_config_file"]).read())[
            "zero_optimization"
        ]["stage"]
        == 3
    )
    assert main(["check", str(tmp_path / "rel" / "accelerate.yaml")]) == 0


def test_config_refuses_bf16_on_a_gpu_without_it(tmp_path, capsys):
    out = tmp_path / "v100"
    assert main(["config", "--gpu", "V100", "--precision", "bf16", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        "bf16 is not supported by NVIDIA V100" in err
        and "--precision fp16" in err
        and "Traceback" not in err
    )
    assert not out.exists()  # nothing written
    assert main(["config", "--gpu", "V100", "--out", str(out)]) == 0  # default precision: fp16
    ds = json.loads((out / "ds_config.json").read_text())
    assert ds["fp16"]["enabled"] is True and "bf16" not in ds
    assert main(["check", "--gpu", "V100", str(out / "accelerate.yaml")]) == 0


def test_save_default_writes_where_accelerate_launch_looks(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    from accelerate.commands.config import config_args
    from zerofit.configs.accelerate_yaml import default_config_path
    import os

    assert default_config_path(os.environ) == str(
        tmp_path / "hf" / "accelerate" / "default_config.yaml"
    )
    # the same rule as accelerate's own module constant, evaluated for the same environment
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    import importlib

    fresh = importlib.reload(config_args)
    assert default_config_path(os.environ) == fresh.default_config_file
    target = tmp_path / "xdg" / "huggingface" / "accelerate" / "default_config.yaml"
    assert main(["config", *ARGS, "--out", str(tmp_path / "a"), "--save-default"]) == 0
    assert target.read_text() == (tmp_path / "a" / "accelerate.yaml").read_text()
    assert str(target) in capsys.readouterr().out
    # never overwritten without --force, and then nothing else is written either
    assert main(["config", *ARGS, "--out", str(tmp_path / "b"), "--save-default"]) == 2
    assert "--force" in capsys.readouterr().err and not (tmp_path / "b").exists()
    assert (
        main(
            [
                "config",
                *ARGS,
                "--stage",
                "2",
                "--out",
                str(tmp_path / "b"),
                "--save-default",
                "--force",
            ]
        )
        == 0
    )
    assert "stage 2" in json.dumps(target.read_text()) or "ZeRO-2" in target.read_text()
    monkeypatch.undo()
    importlib.reload(config_args)


def test_answers_file_reproduces_identical_bytes(tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["config", *ARGS, "--flavour", "auto", "--out", str(first)]) == 0
    # same --out name => same relative ds_config path; compare byte for byte
    assert (
        main(["config", "--answers", str(first / "answers.yaml"), "--out", str(first), "--force"])
        == 0
    )
    assert main(["config", "--answers", str(first / "answers.yaml"), "--out", str(second)]) == 0
    for name in ("ds_config.json", "answers.yaml"):
        assert (first / name).read_bytes() == (second / name).read_bytes()
    strip = lambda p: p.read_text().replace(
        str(p.parent), "OUT"
    )  # noqa: E731 (yaml names its own dir)
    assert strip(first / "accelerate.yaml") == strip(second / "accelerate.yaml")


def test_config_refuses_overwrite_and_missing_answers(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["config", *ARGS, "--out", str(out)]) == 0
    before = (out / "ds_config.json").read_bytes()
    assert main(["config", *ARGS, "--stage", "1", "--out", str(out)]) == 2
    assert "already exist" in capsys.readouterr().err
    assert (out / "ds_config.json").read_bytes() == before
    assert main(["config", "--out", str(tmp_path / "p")]) == 2
    assert "--defaults" in capsys.readouterr().err


def test_config_json_output(tmp_path, capsys):
    assert main(["config", *ARGS, "--out", str(tmp_path / "j"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (
        data["plan"]["stage"] == 3 and data["plan"]["world_size"] == 4 and len(data["files"]) == 3
    )


def test_check_cli_exit_codes(tmp_path, capsys):
    good = tmp_path / "ds.json"
    good.write_text(
        json.dumps(
            {
                "train_batch_size": 4,
                "train_micro_batch_size_per_gpu": 2,
                "gradient_accumulation_steps": 2,
                "zero_optimization": {"stage": 2},
            }
        )
    )
    assert main(["check", str(good)]) == 0
    assert capsys.readouterr().out.startswith("ok: 1 file, no problems (checked with DeepSpeed ")
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})
    )
    assert main(["check", str(bad), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["problems"][0]["path"].endswith(
        "zero_optimization.offload_param"
    )
    assert main(["check", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "x.json").write_text("{oops")
    assert (
        main(["check", str(tmp_path / "x.json")]) == 1
    )  # a broken file is an error; 2 is for usage
    assert main(["check", "--client", "nobody", str(good)]) == 2


def test_check_cli_warnings_exit_0_unless_strict(tmp_path, capsys):
    warned = tmp_path / "auto.json"  # "auto" with no client named: a warning, not an error
    warned.write_text(
        json.dumps(
            {
                "train_batch_size": "auto",
                "train_micro_batch_size_per_gpu": "auto",
                "zero_optimization": {"stage": 2},
            }
        )
    )
    assert main(["check", str(warned)]) == 0
    assert "ok: 1 file, 1 warning" in capsys.readouterr().out
    assert main(["check", "--strict", str(warned)]) == 1
    assert main(["check", "--client", "trainer", "--strict", str(warned)]) == 0
    assert main(["check", "--client", "deepspeed", str(warned)]) == 1
    assert "zerofit config --flavour explicit" in capsys.readouterr().out


def test_check_follows_yaml_reference(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text(
        json.dumps(
            {
                "train_batch_size": 5,
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 1,
                "zero_optimization": {"stage": 1},
            }
        )
    )
    (tmp_path / "a.yaml").write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 4\n"
        "deepspeed_config:\n  deepspeed_config_file: ds.json\n"
    )
    assert main(["check", "a.yaml"]) == 1
    assert (
        "ds.json:train_batch_size: 5 != 1 micro x 1 accumulation x 4 processes"
        in capsys.readouterr().out
    )


def test_presets_lists_and_write_refuses_overwrite(tmp_path, capsys):
    assert main(["presets"]) == 0
    assert "zero2_offload.json" in capsys.readouterr().out
    assert main(["presets", "--write", "--dir", str(tmp_path)]) == 0
    assert (tmp_path / "accelerate" / "zero3.yaml").is_file()
    assert main(["presets", "--write", "--dir", str(tmp_path)]) == 2


def test_help_imports_no_heavy_modules():
    code = (
        "import sys; from zerofit.cli.main import build_parser; build_parser();"
        "heavy = [m for m in ('torch', 'deepspeed', 'transformers', 'accelerate') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == ""
    helped = subprocess.run(
        [sys.executable, "-m", "zerofit", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert helped.returncode == 0 and "config" in helped.stdout


def test_wizard_save_default_writes_the_same_yaml(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    out = tmp_path / "w"
    assert main(["wizard", *ARGS, "--defaults", "--out", str(out), "--save-default"]) == 0
    target = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    assert target.read_text() == (out / "accelerate.yaml").read_text()
    assert (
        main(["wizard", *ARGS, "--defaults", "--out", str(tmp_path / "w2"), "--save-default"]) == 2
    )
    assert not (tmp_path / "w2").exists()
