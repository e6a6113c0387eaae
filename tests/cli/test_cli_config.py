"""`zerofit config` / `presets` / `check` through zerofit.cli.main; --help stays light.

.venv/bin/python -m pytest tests/cli/test_cli_config.py -q
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import sys
import time

import pytest
from conftest import REPO

from zerofit.cli.main import main

# a plain accelerate loop (our recipes): explicit numbers by default
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
    "--stack",
    "accelerate",
]
# the HF Trainer / TRL on one GPU (TrainingArguments' world size in this process is 1)
HF_ARGS = [
    "--model",
    "qwen2.5-0.5b",
    "--gpu",
    "A100-80GB",
    "--stage",
    "2",
    "--micro-batch",
    "2",
    "--global-batch",
    "8",
    "--gradient-checkpointing",
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
    # accelerate opens deepspeed_config_file relative to each worker's cwd: a relative --out must
    # not leak in.
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
    # default precision: fp16 (a DeepSpeed stage, explicit numbers, to read it in the JSON)
    explicit_v100 = ["--gpu", "V100", "--stage", "2", "--stack", "accelerate"]
    assert main(["config", *explicit_v100, "--out", str(out)]) == 0
    ds = json.loads((out / "ds_config.json").read_text())
    assert ds["fp16"]["enabled"] is True and "bf16" not in ds
    assert main(["check", "--gpu", "V100", str(out / "accelerate.yaml")]) == 0


def test_save_default_writes_where_accelerate_launch_looks(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import os

    from accelerate.commands.config import config_args

    from zerofit.configs.accelerate_yaml import default_config_path

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
    def strip(path):  # the YAML names its own directory
        return path.read_text().replace(str(path.parent), "OUT")

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


def test_check_takes_config_s_directory_with_its_answers_file(tmp_path, capsys):
    # `config --out DIR` writes answers.yaml beside the two configs; check DIR must read it as
    # zerofit's answers (what `config --answers` reads), not report its keys as accelerate's.
    out = tmp_path / "out"
    assert main(["config", *ARGS, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["check", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    answers = out / "answers.yaml"
    assert lines[0] == (
        f"note: {answers} is zerofit's answers file: checked as `zerofit config --answers` "
        "reads it, not as an accelerate config"
    )
    assert lines[1].startswith("ok: 3 files, no problems (checked with DeepSpeed ")
    assert len(lines) == 2
    assert main(["check", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["problems"] == [] and report["answers_files"] == [str(answers)]
    assert sorted(report["files"]) == sorted(str(out / name) for name in os.listdir(out))


def test_check_reads_an_answers_file_given_alone_as_answers(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["config", *ARGS, "--out", str(out)]) == 0
    answers = out / "answers.yaml"
    mine = tmp_path / "mine.yaml"  # recognised by its keys, whatever its name
    mine.write_text(answers.read_text())
    capsys.readouterr()
    for given in (answers, mine):
        assert main(["check", str(given)]) == 0
        text = capsys.readouterr().out
        assert f"note: {given} is zerofit's answers file" in text
        assert "ok: 1 file, no problems" in text
    # broken: one line in the Answers loader's words, as `config --answers` would say it
    mine.write_text(answers.read_text().replace("gpus_per_node: 4", "gpus_per_node: 0"))
    assert main(["check", str(mine)]) == 1
    text = capsys.readouterr().out
    assert f"{mine}:gpus_per_node: 0 must be a positive integer (fix: " in text
    assert "accelerate knows" not in text and "distributed_type" not in text


def test_check_refuses_a_directory_with_nothing_to_check(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a config")
    assert main(["check", str(tmp_path)]) == 2
    assert "is a directory with no .json, .yaml or .yml file" in capsys.readouterr().err


def test_presets_lists_and_write_refuses_overwrite(tmp_path, capsys):
    assert main(["presets"]) == 0
    assert "zero2_offload.json" in capsys.readouterr().out
    assert main(["presets", "--write", "--dir", str(tmp_path)]) == 0
    assert (tmp_path / "accelerate" / "zero3.yaml").is_file()
    assert main(["presets", "--write", "--dir", str(tmp_path)]) == 2


def test_help_imports_no_heavy_modules():
    code = (
        "import sys; from zerofit.cli.main import build_parser; build_parser();"
        "heavy = [m for m in ('torch', 'deepspeed', 'transformers', 'accelerate')"
        " if m in sys.modules];"
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


def _ds(out) -> dict:
    return json.loads((out / "ds_config.json").read_text())


def test_default_flavour_follows_the_stack(tmp_path, capsys):
    # an HF Trainer script stops on explicit DeepSpeed values that differ from its arguments:
    # the hf stack (the default) gets "auto", the accelerate and deepspeed stacks numbers
    assert main(["config", *HF_ARGS, "--out", str(tmp_path / "hf")]) == 0
    assert _ds(tmp_path / "hf")["train_micro_batch_size_per_gpu"] == "auto"
    assert main(["config", *HF_ARGS, "--stack", "accelerate", "--out", str(tmp_path / "a")]) == 0
    assert _ds(tmp_path / "a")["train_micro_batch_size_per_gpu"] == 2
    assert main(["config", *HF_ARGS, "--stack", "deepspeed", "--out", str(tmp_path / "d")]) == 0
    assert _ds(tmp_path / "d")["gradient_accumulation_steps"] == 4
    # --flavor is the documented spelling; --flavour and the answers file's flavour still work
    assert main(["config", *HF_ARGS, "--flavor", "explicit", "--out", str(tmp_path / "e")]) == 0
    assert main(["config", *HF_ARGS, "--flavour", "explicit", "--out", str(tmp_path / "f")]) == 0
    assert _ds(tmp_path / "e") == _ds(tmp_path / "f")
    assert _ds(tmp_path / "e")["train_batch_size"] == 8
    assert "flavor: explicit" in (tmp_path / "e" / "answers.yaml").read_text()
    old = tmp_path / "old.yaml"
    old.write_text((tmp_path / "e" / "answers.yaml").read_text().replace("flavor:", "flavour:"))
    assert main(["config", "--answers", str(old), "--out", str(tmp_path / "g")]) == 0
    assert _ds(tmp_path / "g") == _ds(tmp_path / "e")


def _trainer_flags(text: str, heading: str) -> list[str]:
    lines = text.splitlines()
    return shlex.split(lines[lines.index(heading) + 1])


def _check_with_transformers(ds: dict, flags: list[str], run_dir) -> None:
    """What HF Trainer does with a DeepSpeed config and these arguments: transformers'
    HfTrainerDeepSpeedConfig.trainer_config_process / trainer_config_finalize
    (integrations/deepspeed.py) raise ValueError on any mismatch."""
    from transformers import HfArgumentParser, TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    # --use_cpu: this machine has no GPU for --bf16; the DeepSpeed matching does not read it
    argv = [*flags, "--output_dir", str(run_dir), "--use_cpu", "--report_to", "none"]
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(argv)
    assert args.world_size == 1
    hf_ds = HfTrainerDeepSpeedConfig(copy.deepcopy(ds))
    hf_ds.trainer_config_process(args)
    hf_ds.trainer_config_finalize(args, model=None, num_training_steps=10)


def test_explicit_hf_config_prints_the_trainer_arguments_it_requires(tmp_path, capsys):
    out = tmp_path / "explicit"
    argv = ["config", *HF_ARGS, "--flavor", "explicit", "--optimizer-block", "--out", str(out)]
    assert main(argv) == 0
    heading = (
        "HF Trainer / TRL arguments these explicit values require (transformers stops on any "
        "DeepSpeed value that differs from TrainingArguments):"
    )
    flags = _trainer_flags(capsys.readouterr().out, heading)
    assert flags[:4] == [
        "--per_device_train_batch_size",
        "2",
        "--gradient_accumulation_steps",
        "4",
    ]
    assert {"--max_grad_norm", "--learning_rate", "--bf16", "--gradient_checkpointing"} <= {*flags}
    _check_with_transformers(_ds(out), flags, tmp_path / "run")
    with pytest.raises(ValueError, match="mismatch TrainingArguments"):
        _check_with_transformers(_ds(out), [], tmp_path / "run")  # the Trainer's defaults
    # --json carries the same flags; the auto flavour names the plan's numbers, nothing to match
    assert main([*argv[:-1], str(tmp_path / "j"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trainer_arguments"] == flags
    assert main(["config", *HF_ARGS, "--out", str(tmp_path / "auto")]) == 0
    heading = "HF Trainer / TRL arguments the plan was sized for:"
    auto = _trainer_flags(capsys.readouterr().out, heading)
    assert auto == flags[:4] + ["--bf16", "--gradient_checkpointing"]
    _check_with_transformers(_ds(tmp_path / "auto"), auto, tmp_path / "run")


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--gpus-per-node", "100000000"], "gpus_per_node: 100000000 is above the limit of 64"),
        (["--nodes", "99999999999999999999"], "num_nodes: 99999999999999999999 is above the limit"),
        (["--host-ram-gib", "inf"], "host_ram_gib: inf is not a finite number"),
        (["--main-process-ip", "not an ip"], "main_process_ip: 'not an ip' is not an IP address"),
        (["--main-addr", "10.0.0.1;reboot"], "main_process_ip: '10.0.0.1;reboot' is not an IP"),
        (["--main-process-ip", "10.0.0.1\n"], "main_process_ip: '10.0.0.1\\n' is not an IP"),
    ],
)
def test_bad_input_is_refused_at_once_and_writes_nothing(tmp_path, capsys, flags, message):
    # 100000000 GPUs per node used to plan for 10 minutes and grow past 3.9 GB
    out = tmp_path / "c1"
    start = time.perf_counter()
    argv = ["config", "--model", "qwen2.5-7b", "--gpu", "H100", *flags, "--out", str(out)]
    assert main(argv) == 2
    assert time.perf_counter() - start < 5
    err = capsys.readouterr().err
    assert message in err and "(fix: " in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    "out,message", [("", "--out: is empty"), ("a\nb", "--out: 'a\\nb' contains a control")]
)
def test_out_must_be_a_directory_name_on_one_line(tmp_path, monkeypatch, capsys, out, message):
    # a newline in --out used to end a comment line of accelerate.yaml early: invalid YAML
    monkeypatch.chdir(tmp_path)
    assert main(["config", *ARGS, "--out", out]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_main_addr_is_config_s_name_too(tmp_path, capsys):
    import yaml

    argv = ["config", *ARGS, "--nodes", "2", "--main-addr", "node001", "--main-port", "29600"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    cfg = yaml.safe_load((tmp_path / "a" / "accelerate.yaml").read_text())
    assert cfg["main_process_ip"] == "node001"
    assert cfg["main_process_port"] == 29600


def test_a_plan_that_fits_nowhere_writes_nothing_unless_forced(tmp_path, capsys):
    # qwen2.5-7b's Adam states need ~90 GiB of host RAM with everything offloaded: 8 GiB is short
    unfit = ["--model", "qwen2.5-7b", "--gpu", "T4", "--host-ram-gib", "8", "--seq-len", "512"]
    out = tmp_path / "unfit"
    assert main(["config", *unfit, "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert "zerofit: error: plan: does not fit in host RAM" in captured.err
    assert "GiB of host RAM per node of 8.0; nothing written" in captured.err
    assert "nothing written" in captured.err and "Traceback" not in captured.err
    assert "suggestion: " in captured.out and "wrote" not in captured.out
    assert not out.exists()
    assert main(["config", *unfit, "--micro-batch", "1", "--out", str(out)]) == 1
    assert not out.exists()  # a micro batch alone does not ask for this configuration
    capsys.readouterr()
    # a configuration the user set is written, with the warning and exit 1
    forced = ["--stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu"]
    assert main(["config", *unfit, *forced, "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert "files written anyway, as you set --stage, --offload-optimizer" in captured.err
    assert (out / "ds_config.json").is_file()


def test_launch_hint_is_shell_quoted(tmp_path, capsys):
    out = tmp_path / "my configs"
    argv = ["config", *ARGS, "--nodes", "2", "--main-addr", "10.0.0.1", "--out", str(out)]
    assert main(argv) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("launch: "))
    command = line.removeprefix("launch: ").split("  # ")[0]
    assert shlex.split(command) == [
        "accelerate",
        "launch",
        "--config_file",
        str(out / "accelerate.yaml"),
        "--machine_rank",
        "NODE_RANK",
        "your_script.py",
    ]
