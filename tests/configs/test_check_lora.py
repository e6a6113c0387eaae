"""`zerofit check ... --training`: LoRA / QLoRA / pre-quantized models under ZeRO-3
(src/zerofit/configs/check/training.py), from TRL and LLaMA-Factory YAMLs and command lines."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from zerofit.cli.main import main
from zerofit.configs.check import check_files
from zerofit.configs.check.training import (
    read_training,
    setup_from_command,
    setup_from_mapping,
)


def zero_config(stage: int, gather=True) -> dict:
    zero = {"stage": stage}
    if gather is not None:
        zero["stage3_gather_16bit_weights_on_model_save"] = gather
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
    }


def problems_for(values: dict, stage: int = 3, gather=True, client=None) -> dict[str, object]:
    """{path: Problem} of a ZeRO config checked with the training setup `values`."""
    texts = {"ds.json": json.dumps(zero_config(stage, gather))}
    setup = setup_from_mapping("train.yaml", values)
    found = check_files(texts, client=client, training=setup)
    return {p.path: p for p in found}


QLORA_TRL = {"model_name_or_path": "org/model", "load_in_4bit": True, "use_peft": True}


def test_qlora_under_zero3_needs_quant_storage_equal_to_the_compute_dtype():
    found = problems_for({**QLORA_TRL, "dtype": "bfloat16"})
    problem = found["train.yaml:bnb_4bit_quant_storage"]
    assert "uint8 (the default)" in problem.message and "peft issue 1844" in problem.message
    assert problem.fix.startswith("set bnb_4bit_quant_storage: bfloat16")
    mismatched = problems_for({**QLORA_TRL, "dtype": "bf16", "bnb_4bit_quant_storage": "float16"})
    assert "as float16, not the compute dtype bfloat16" in (
        mismatched["train.yaml:bnb_4bit_quant_storage"].message
    )
    matched = {**QLORA_TRL, "dtype": "bfloat16", "bnb_4bit_quant_storage": "torch.bfloat16"}
    assert "train.yaml:bnb_4bit_quant_storage" not in problems_for(matched)
    assert problems_for(QLORA_TRL, stage=2) == {}  # ZeRO-2 replicates the base anyway


def test_llamafactory_and_recipes_set_the_storage_themselves_but_8bit_is_refused():
    llamafactory = {"model_name_or_path": "m", "finetuning_type": "lora", "quantization_bit": 4}
    assert problems_for(llamafactory) == {}
    eight = problems_for({**llamafactory, "quantization_bit": 8})
    assert "cannot partition" in eight["train.yaml:load_in_8bit"].message
    assert problems_for({"finetuning": "qlora"}, gather=False) == {}  # the recipes gather too


def test_prequantized_checkpoint_under_zero3(tmp_path):
    model = tmp_path / "awq-model"
    model.mkdir()
    quant = {"quant_method": "awq", "bits": 4}
    (model / "config.json").write_text(json.dumps({"quantization_config": quant}))
    found = problems_for({"model_name_or_path": str(model), "finetuning_type": "lora"})
    problem = found[f"{model}/config.json:quantization_config.quant_method"]
    assert "awq is a pre-quantized checkpoint" in problem.message
    assert "LLaMA-Factory issue 6898" in problem.message and "ZeRO-2" in problem.fix
    assert problems_for({"model_name_or_path": str(model), "finetuning_type": "lora"}, 2) == {}


def test_device_map_is_an_error_and_low_cpu_mem_usage_a_warning():
    found = problems_for({"model_name_or_path": "m", "device_map": "auto", "low_cpu_mem_usage": 1})
    assert found["train.yaml:device_map"].severity == "error"
    assert "not compatible with passing a `device_map`" in found["train.yaml:device_map"].message
    assert found["train.yaml:low_cpu_mem_usage"].severity == "warning"


@pytest.mark.parametrize(
    ("gather", "client", "severity"),
    [(False, None, "error"), (None, "accelerate", "error"), ("auto", "trainer", "warning")],
)
def test_lora_under_zero3_without_16bit_gathering(gather, client, severity):
    found = problems_for({"use_peft": True}, gather=gather, client=client)
    problem = found["ds.json:zero_optimization.stage3_gather_16bit_weights_on_model_save"]
    assert problem.severity == severity and "empty adapters" in problem.message
    assert "trl issue 4416" in problem.message
    assert problems_for({"use_peft": True}, gather=True) == {}
    assert problems_for({"use_peft": False}, gather=False) == {}  # a full fine-tune saves fine


def read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_command_lines_read_like_yamls(tmp_path):
    trl = setup_from_command(
        "accelerate launch --config_file acc.yaml sft.py --model_name_or_path m --load-in-4bit "
        "--use_peft --dtype=bf16 --bnb_4bit_quant_storage bfloat16",
        lambda path: "",
    )
    assert (trl.stack, trl.quant_bits, trl.peft) == ("trl", 4, True)
    assert trl.quant_storage == trl.compute_dtype == "bfloat16"
    recipe = setup_from_command("accelerate launch recipes/dpo.py --finetuning lora", str)
    assert (recipe.stack, recipe.peft) == ("recipes", True)
    factory_yaml = tmp_path / "qwen_lora.yaml"
    factory_yaml.write_text("model_name_or_path: m\nfinetuning_type: lora\nquantization_bit: 8\n")
    factory = setup_from_command(f"llamafactory-cli train {factory_yaml}", read_text)
    assert (factory.stack, factory.quant_bits) == ("llamafactory", 8)


def test_cli_training_flag_reads_the_deepspeed_json_the_yaml_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text(json.dumps(zero_config(3, gather=False)))
    (tmp_path / "other.json").write_text(json.dumps(zero_config(2)))
    (tmp_path / "trl.yaml").write_text(
        "model_name_or_path: m\nuse_peft: true\nload_in_4bit: true\ndeepspeed: ds.json\n"
    )
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["check", "other.json", "--training", "trl.yaml", "--json"])
    report = json.loads(out.getvalue())
    paths = {p["path"] for p in report["problems"]}
    assert code == 1 and "ds.json" in report["files"]
    assert "trl.yaml:bnb_4bit_quant_storage" in paths
    assert "ds.json:zero_optimization.stage3_gather_16bit_weights_on_model_save" in paths


LAUNCH_YAML = """compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  deepspeed_config_file: ds.json
  zero3_init_flag: true
machine_rank: 0
main_training_function: main
num_machines: 1
num_processes: 2
"""


def test_cli_training_command_reads_the_accelerate_config_it_launches_with(
    tmp_path, monkeypatch, capsys
):
    """`accelerate launch --config_file X script.py ...`: X is accelerate's file, not the script's
    arguments, whatever its name; check reads it, and the DeepSpeed JSON it names judges the
    setup."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text(json.dumps(zero_config(3, gather=False)))
    (tmp_path / "launch.yaml").write_text(LAUNCH_YAML)
    command = (
        "accelerate launch --config_file launch.yaml sft.py --model_name_or_path m --use_peft "
        "--load_in_4bit"
    )
    setup = read_training(command, read_text)
    assert (setup.accelerate_config, setup.model, setup.quant_bits) == ("launch.yaml", "m", 4)
    assert main(["check", "--training", command, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    paths = {p["path"] for p in report["problems"]}
    assert report["files"] == ["launch.yaml", "ds.json"]
    assert "command:bnb_4bit_quant_storage" in paths
    assert "ds.json:zero_optimization.stage3_gather_16bit_weights_on_model_save" in paths


def test_cli_training_yaml_that_is_not_a_mapping_is_one_line(tmp_path, capsys):
    (tmp_path / "ds.json").write_text(json.dumps(zero_config(3)))
    (tmp_path / "bad.yaml").write_text("- a list\n")
    code = main(["check", str(tmp_path / "ds.json"), "--training", str(tmp_path / "bad.yaml")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "bad.yaml" in err and "fix:" in err


def test_cli_training_alone_checks_the_deepspeed_json_it_names(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text(json.dumps(zero_config(3, gather=False)))
    (tmp_path / "trl.yaml").write_text(
        "model_name_or_path: m\nuse_peft: true\nload_in_4bit: true\ndeepspeed: ds.json\n"
    )
    assert main(["check", "--training", "trl.yaml", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    paths = {p["path"] for p in report["problems"]}
    assert report["files"] == ["ds.json"] and "trl.yaml:bnb_4bit_quant_storage" in paths
    assert "ds.json:zero_optimization.stage3_gather_16bit_weights_on_model_save" in paths
    (tmp_path / "ds.json").write_text(json.dumps(zero_config(3)))
    command = "accelerate launch sft.py --model_name_or_path m --use_peft --deepspeed ds.json"
    assert main(["check", "--training", command]) == 0
    assert capsys.readouterr().out.startswith("ok: 1 file, no problems")


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        ([], "check: no file to check"),
        (["--training", "python train.py --use_peft"], "--training: the command names no "),
        (["--training", "lora.yaml"], "--training: lora.yaml names no DeepSpeed config"),
        (["--training", "missing.yaml"], "missing.json: does not exist"),
    ],
)
def test_cli_check_with_nothing_to_judge_is_one_line(tmp_path, monkeypatch, capsys, argv, start):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lora.yaml").write_text("model_name_or_path: m\nuse_peft: true\n")
    (tmp_path / "missing.yaml").write_text("use_peft: true\ndeepspeed: missing.json\n")
    assert main(["check", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"zerofit: error: {start}") and len(err.splitlines()) == 1
    assert "fix:" in err and ("--training" in err or "existing file" in err)


def test_a_training_value_that_is_no_file_is_a_command():
    setup = read_training("python train.py --use_peft --device_map auto", read_text)
    assert (setup.source, setup.peft, setup.device_map) == ("command", True, "auto")
