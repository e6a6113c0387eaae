"""check on a corpus of real public configs: every valid one passes, every real or planted error
is found.

    .venv/bin/python -m pytest tests/configs/test_check_corpus.py -q

The corpus (tests/data/configs_corpus/, sources and expectations in SOURCES.json) holds DeepSpeed
JSONs and accelerate YAMLs copied verbatim from the HF docs and tests, accelerate's templates,
DeepSpeed's ZeRO++ tutorial, TRL and open-r1 accelerate YAMLs, axolotl and LLaMA-Factory. Planted
errors are single edits of those valid files, each with the field `check` must name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from zerofit.configs.check import check_files

CORPUS = REPO / "tests" / "data" / "configs_corpus"
SOURCES = {
    k: v
    for k, v in json.loads((CORPUS / "SOURCES.json").read_text()).items()
    if not k.startswith("_")
}


def test_every_corpus_file_is_indexed_with_its_source():
    files = {p.name for p in CORPUS.iterdir() if p.name != "SOURCES.json"}
    assert files == set(SOURCES)
    assert all(entry["source"] for entry in SOURCES.values())


def _errors(name: str, text: str, client) -> list[str]:
    problems = check_files({name: text}, client=client)
    return sorted(
        p.path.split(":", 1)[1] if ":" in p.path else ""
        for p in problems
        if p.severity != "warning"
    )


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_corpus_file_gets_exactly_the_expected_errors(name):
    entry = SOURCES[name]
    assert _errors(name, (CORPUS / name).read_text(), entry["client"]) == sorted(
        entry["expect"]
    ), entry.get("note")


def _edit_json(name: str, edit) -> str:
    data = json.loads((CORPUS / name).read_text())
    edit(data)
    return json.dumps(data, indent=2)


def _edit_yaml(name: str, edit) -> str:
    data = yaml.safe_load((CORPUS / name).read_text())
    edit(data)
    return yaml.safe_dump(data)


def _set(path: str, value):
    def edit(data):
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    return edit


def _rename(path: str, new: str):
    def edit(data):
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[new] = node.pop(last)

    return edit


Z3, Z2 = "llamafactory_ds_z3_config.json", "axolotl_zero2.json"
TRL3, FSDP = "trl_deepspeed_zero3.yaml", "trl_fsdp2.yaml"
# (id, file, text after the edit, client, the field check must name)
PLANTED = [
    (
        "stage 9",
        Z3,
        lambda: _edit_json(Z3, _set("zero_optimization.stage", 9)),
        "trainer",
        "zero_optimization.stage",
    ),
    (
        "offload device gpu",
        Z2,
        lambda: _edit_json(Z2, _set("zero_optimization.offload_optimizer.device", "gpu")),
        "trainer",
        "zero_optimization.offload_optimizer.device",
    ),
    (
        "typo overlap_com",
        Z2,
        lambda: _edit_json(Z2, _rename("zero_optimization.overlap_comm", "overlap_com")),
        "trainer",
        "zero_optimization.overlap_com",
    ),
    (
        "duplicate key",
        Z3,
        lambda: (CORPUS / Z3).read_text().replace('"stage": 3,', '"stage": 3, "stage": 2,'),
        "trainer",
        "stage",
    ),
    (
        "removed amp block",
        Z3,
        lambda: _edit_json(Z3, _set("amp", {"enabled": True})),
        "trainer",
        "amp",
    ),
    (
        "removed mics_shard_size",
        Z3,
        lambda: _edit_json(Z3, _set("zero_optimization.mics_shard_size", 8)),
        "trainer",
        "zero_optimization.mics_shard_size",
    ),
    (
        "param offload at stage 2",
        Z2,
        lambda: _edit_json(Z2, _set("zero_optimization.offload_param", {"device": "cpu"})),
        "trainer",
        "zero_optimization.offload_param",
    ),
    (
        "nvme without path",
        Z2,
        lambda: _edit_json(Z2, _set("zero_optimization.offload_optimizer.device", "nvme")),
        "trainer",
        "zero_optimization.offload_optimizer.nvme_path",
    ),
    (
        "bf16 and fp16",
        "llamafactory_ds_z3_e9_quant_grads.json",
        lambda: _edit_json("llamafactory_ds_z3_e9_quant_grads.json", _set("fp16.enabled", True)),
        "trainer",
        "fp16.enabled",
    ),
    (
        "batch arithmetic",
        Z3,
        lambda: _edit_json(
            Z3,
            lambda d: d.update(
                train_batch_size=10, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=1
            ),
        ),
        "trainer",
        "train_batch_size",
    ),
    (
        "auto under plain DeepSpeed",
        Z3,
        lambda: (CORPUS / Z3).read_text(),
        "deepspeed",
        "train_batch_size",
    ),
    (
        "yaml zero_stage 9",
        TRL3,
        lambda: _edit_yaml(TRL3, _set("deepspeed_config.zero_stage", 9)),
        None,
        "deepspeed_config.zero_stage",
    ),
    (
        "yaml offload gpu",
        TRL3,
        lambda: _edit_yaml(TRL3, _set("deepspeed_config.offload_optimizer_device", "gpu")),
        None,
        "deepspeed_config.offload_optimizer_device",
    ),
    (
        "yaml zero3_init_flag maybe",
        TRL3,
        lambda: _edit_yaml(TRL3, _set("deepspeed_config.zero3_init_flag", "maybe")),
        None,
        "deepspeed_config.zero3_init_flag",
    ),
    (
        "yaml launcher typo",
        TRL3,
        lambda: _edit_yaml(TRL3, _set("deepspeed_config.deepspeed_multinode_launcher", "standrad")),
        None,
        "deepspeed_config.deepspeed_multinode_launcher",
    ),
    (
        "yaml unknown key",
        TRL3,
        lambda: _edit_yaml(TRL3, _rename("num_processes", "num_proceses")),
        None,
        "num_proceses",
    ),
    (
        "yaml distributed_type",
        TRL3,
        lambda: _edit_yaml(TRL3, _set("distributed_type", "DEEP_SPEED")),
        None,
        "distributed_type",
    ),
    (
        "fsdp key typo",
        FSDP,
        lambda: _edit_yaml(
            FSDP, _rename("fsdp_config.fsdp_state_dict_type", "fsdp_state_dict_typ")
        ),
        None,
        "fsdp_config.fsdp_state_dict_typ",
    ),
]


@pytest.mark.parametrize("case", PLANTED, ids=[c[0] for c in PLANTED])
def test_planted_error_is_found(case):
    _, name, make, client, field = case
    errors = _errors(name, make(), client)
    assert field in errors, errors


def test_missing_hostfile_and_pdsh_with_an_existing_one(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=8\nnode1 slots=8\n")
    base = yaml.safe_load((CORPUS / "openr1_zero3_4nodes.yaml").read_text())
    base["deepspeed_config"].update(
        deepspeed_multinode_launcher="pdsh", deepspeed_hostfile=str(hostfile)
    )

    def exists(path: str) -> bool:
        return Path(path).is_file()

    problems = check_files({"pdsh.yaml": yaml.safe_dump(base)}, exists=exists)
    # valid: pdsh and ssh are the user's to provide
    assert [p.severity for p in problems] == ["warning"]
    hostfile.unlink()
    problems = check_files({"pdsh.yaml": yaml.safe_dump(base)}, exists=exists)
    assert [p.path for p in problems if p.severity == "error"] == [
        "pdsh.yaml:deepspeed_config.deepspeed_hostfile"
    ]
