"""build/render_accelerate_config: ClusterConfig keys, loadable by accelerate's own loader.

.venv/bin/python -m pytest tests/configs/test_accelerate_yaml.py -q
"""

from __future__ import annotations

import pytest
from conftest import build_plan

from zerofit.configs.accelerate_yaml import build_accelerate_config, render_accelerate_config


def load_with_accelerate(tmp_path, text: str):
    from accelerate.commands.config.config_args import load_config_from_file

    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    return load_config_from_file(str(path))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_single_node_deepspeed_loads(tmp_path, stage):
    plan = build_plan(stage=stage, gpus_per_node=8)
    cfg = load_with_accelerate(tmp_path, render_accelerate_config(plan))
    assert cfg.distributed_type.value == "DEEPSPEED"
    assert cfg.num_processes == 8 and cfg.num_machines == 1 and cfg.machine_rank == 0
    assert cfg.deepspeed_config == {
        "deepspeed_config_file": "ds_config.json",
        "zero3_init_flag": stage == 3,
    }
    assert cfg.mixed_precision is None  # accelerate launch refuses it next to deepspeed_config_file


def test_multi_node_counts_total_processes_and_uses_standard_launcher(tmp_path):
    plan = build_plan(
        stage=3, gpus_per_node=4, num_nodes=2, main_process_ip="10.0.0.1", main_process_port=29512
    )
    for rank in (0, 1):
        cfg = load_with_accelerate(tmp_path, render_accelerate_config(plan, machine_rank=rank))
        assert cfg.num_processes == 8 and cfg.num_machines == 2 and cfg.machine_rank == rank
        assert cfg.main_process_ip == "10.0.0.1" and cfg.main_process_port == 29512
        assert cfg.rdzv_backend == "static"
        assert cfg.deepspeed_config["deepspeed_multinode_launcher"] == "standard"


def test_stage0_is_multi_gpu_or_no_with_mixed_precision(tmp_path):
    multi = load_with_accelerate(
        tmp_path, render_accelerate_config(build_plan(stage=0, gpus_per_node=4))
    )
    assert multi.distributed_type.value == "MULTI_GPU" and multi.mixed_precision == "bf16"
    assert multi.num_processes == 4 and multi.deepspeed_config == {}
    single = build_accelerate_config(build_plan(stage=0, gpus_per_node=1, precision="fp32"))
    assert single["distributed_type"] == "NO" and single["mixed_precision"] == "no"
    assert (
        load_with_accelerate(
            tmp_path,
            render_accelerate_config(build_plan(stage=0, gpus_per_node=1, precision="fp32")),
        ).num_processes
        == 1
    )


def test_ds_config_path_is_written_verbatim():
    cfg = build_accelerate_config(build_plan(stage=2), ds_config_file="out/ds_config.json")
    assert cfg["deepspeed_config"]["deepspeed_config_file"] == "out/ds_config.json"
    assert "main_process_ip" not in cfg  # single node: accelerate picks localhost


def test_render_is_deterministic_and_commented():
    plan = build_plan(stage=2, gpus_per_node=2, num_nodes=2)
    text = render_accelerate_config(plan, machine_rank=1)
    assert text == render_accelerate_config(plan, machine_rank=1)
    assert text.startswith(
        "# accelerate config written by zerofit: 4 processes in total (2 per node x 2 nodes)."
    )
    assert "machine_rank: 1\n" in text


def accelerate_launch_args(path, *argv: str):
    """`accelerate launch --config_file PATH ARGV train.py` as accelerate resolves it
    (commands/launch.py, _validate_launch_command: a flag wins over the file)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(path), *argv, "train.py"])
    return _validate_launch_command(args)[0]


def test_multi_node_header_matches_the_one_file_written(tmp_path):
    """`zerofit config` writes one accelerate.yaml for all nodes: its header says how node N
    uses it (--machine_rank N), and accelerate takes that flag over the file's machine_rank 0."""
    from zerofit.configs.outputs import render_files

    plan = build_plan(stage=2, gpus_per_node=2, num_nodes=3, main_process_ip="10.0.0.1")
    files = render_files(plan)
    assert [n for n in files if n.endswith(".yaml")] == ["accelerate.yaml", "answers.yaml"]
    text = files["accelerate.yaml"]
    assert "that node's file" not in text
    assert "--machine_rank N" in text and "zerofit launch --config" in text
    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    args = accelerate_launch_args(path, "--machine_rank", "2")
    assert (args.machine_rank, args.num_machines, args.num_processes) == (2, 3, 6)


def test_header_counts_are_singular_for_one():
    text = render_accelerate_config(build_plan(stage=0, gpus_per_node=1, precision="fp32"))
    assert text.startswith(
        "# accelerate config written by zerofit: 1 process in total (1 per node x 1 node)."
    )


def test_stage0_writes_no_deepspeed_json_and_names_none(tmp_path):
    """Plain DDP: nothing would read a ds_config.json, so none is written or referenced."""
    from zerofit.configs.outputs import render_files

    files = render_files(build_plan(stage=0, gpus_per_node=4), ds_config_file="ds_config.json")
    assert sorted(files) == ["accelerate.yaml", "answers.yaml"]
    assert "ds_config" not in files["accelerate.yaml"]
    path = tmp_path / "accelerate.yaml"
    path.write_text(files["accelerate.yaml"])
    args = accelerate_launch_args(path)
    assert args.multi_gpu and not args.use_deepspeed and args.num_processes == 4
    assert sorted(render_files(build_plan(stage=1))) == [
        "accelerate.yaml",
        "answers.yaml",
        "ds_config.json",
    ]


def test_qlora_under_zero3_names_the_quant_storage_in_both_files(tmp_path):
    """QLoRA + ZeRO-3: the YAML header and the JSON's _comment name bnb_4bit_quant_storage equal
    to the compute dtype; the files still load (accelerate) and parse (json)."""
    import json

    from zerofit.configs.outputs import render_files

    plan = build_plan(stage=3, gpus_per_node=2, finetuning="qlora", precision="fp16")
    files = render_files(plan)
    assert "bnb_4bit_quant_storage=torch.float16" in files["accelerate.yaml"]
    assert "bnb_4bit_quant_storage=float16" in json.loads(files["ds_config.json"])["_comment"]
    load_with_accelerate(tmp_path, files["accelerate.yaml"])
    lora = render_files(build_plan(stage=3, gpus_per_node=2, finetuning="lora"))
    assert "LoRA under ZeRO-3" in lora["accelerate.yaml"]
    assert "quant_storage" not in lora["accelerate.yaml"] + lora["ds_config.json"]
    for stage, finetuning in ((2, "qlora"), (3, "full")):
        quiet = render_files(build_plan(stage=stage, gpus_per_node=2, finetuning=finetuning))
        assert "LoRA" not in quiet["accelerate.yaml"] and "QLoRA" not in quiet["ds_config.json"]
