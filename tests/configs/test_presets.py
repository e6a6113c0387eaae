"""deepspeed_configs/ equals the builder's output, passes `check`, and DeepSpeed/accelerate accept
it.

.venv/bin/python -m pytest tests/configs/test_presets.py -q
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO
from test_deepspeed_json import deepspeed_accepts, substitute_auto

from zerofit.configs.check import check_files
from zerofit.configs.presets import PRESETS, render_presets

PRESET_DIR = REPO / "deepspeed_configs"
FILES = render_presets()


@pytest.mark.parametrize("name", sorted(FILES))
def test_file_equals_builder_output(name):
    assert (PRESET_DIR / name).read_text() == FILES[
        name
    ], "regenerate: zerofit presets --write --force"


def test_no_stray_files():
    shipped = {str(p.relative_to(PRESET_DIR)) for p in PRESET_DIR.rglob("*") if p.is_file()}
    assert shipped == set(FILES)


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("world", [1, 8, 64])
def test_presets_valid_in_deepspeed_after_auto_substitution(name, world):
    ds = json.loads((PRESET_DIR / f"{name}.json").read_text())
    cfg = deepspeed_accepts(
        substitute_auto(ds, hidden=4096, micro=2, accum=4, world=world), world=world
    )
    assert (
        cfg.bfloat16_config.enabled and not cfg.float16_config.enabled
    )  # "auto" filled from --bf16
    assert cfg.zero_optimization_stage == PRESETS[name][0]
    assert cfg.train_batch_size == 2 * 4 * world


def test_presets_pass_check_for_trainers(monkeypatch):
    monkeypatch.chdir(REPO)  # the YAMLs name their JSON relative to the repository root
    texts = {
        str(p.relative_to(REPO)): p.read_text()
        for p in PRESET_DIR.rglob("*")
        if p.suffix in (".json", ".yaml")
    }
    assert (
        check_files(texts, trainer=True, gpu_bf16=True, exists=lambda p: (REPO / p).is_file()) == []
    )


def accelerate_launch_args(*argv: str):
    """The arguments `accelerate launch ARGV train.py` runs with, resolved by accelerate itself
    (commands/launch.py, _validate_launch_command: config values fill what the flags leave)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args, _, _ = _validate_launch_command(launch_command_parser().parse_args([*argv, "train.py"]))
    return args


@pytest.mark.parametrize("name", ["multi_gpu", "zero1", "zero2", "zero3"])
def test_accelerate_yamls_load(name):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(PRESET_DIR / "accelerate" / f"{name}.yaml"))
    assert cfg.num_processes == -1  # ClusterConfig's "not set": the node decides
    if name != "multi_gpu":
        assert (REPO / cfg.deepspeed_config["deepspeed_config_file"]).is_file()


@pytest.mark.parametrize("name", ["multi_gpu", "zero1", "zero2", "zero3"])
def test_presets_start_as_many_processes_as_the_node_has_gpus(name):
    """A preset on a 4-GPU node starts 4 processes (it used to say 8 whatever the node had),
    and a forgotten --num_processes is accelerate's one-line error, not a wrong count."""
    config = str(PRESET_DIR / "accelerate" / f"{name}.yaml")
    for gpus in (2, 4, 8):
        args = accelerate_launch_args("--config_file", config, "--num_processes", str(gpus))
        assert args.num_processes == gpus
    with pytest.raises(ValueError, match="manually pass in `--num_processes`"):
        accelerate_launch_args("--config_file", config)
    readme = (PRESET_DIR / "README.md").read_text()
    assert "--num_processes" in readme and "_validate_launch_command" in readme


def test_cli_check_exits_0_on_every_shipped_file(monkeypatch, capsys):
    from zerofit.cli.main import main

    monkeypatch.chdir(REPO)
    files = sorted(
        str(p.relative_to(REPO)) for p in PRESET_DIR.rglob("*") if p.suffix in (".json", ".yaml")
    )
    assert main(["check", *files]) == 0  # "auto" warnings (client unknown) do not fail the check
    assert main(["check", "--client", "trainer", "--strict", *files]) == 0
    out = capsys.readouterr().out
    assert "ok: 9 files, no problems" in out
