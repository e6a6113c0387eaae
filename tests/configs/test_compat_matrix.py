"""Compatibility matrix: every shipped preset and generated config under every client users feed
it to.

    .venv/bin/python tests/warm_ops.py   # once: shm comm + cpu_adam ops
    .venv/bin/python -m pytest tests/configs/test_compat_matrix.py -q

One real 2-process job (torchrun, gloo, CPU) runs all cells one after another
(tests/scripts/compat_matrix.py): transformers Trainer with bf16 / fp32 arguments, TRL SFT / DPO /
GRPO, a plain accelerate loop under the environment `accelerate launch` derives from the YAML, and
deepspeed.initialize (client optimizer, or the JSON's own optimizer block). 2 optimizer steps each,
on a 2-layer, 64-wide random Qwen2. Where this CPU cannot run fp16 in DeepSpeed, the fp16 cells run
the Trainer's config processing + finalisation (what it does before building the engine on a GPU)
and DeepSpeed's config class instead. Cells that are not meant to work (e.g. "auto" under plain
DeepSpeed, explicit bf16 under a Trainer run without --bf16) must fail for real AND be reported by
`zerofit check` for that client, with the fix. Each cell is its own test below: none is skipped.

The accelerate cells with a DeepSpeed config also hold what the engine got: world 2, the batch
arithmetic (explicit numbers unchanged, a preset's "auto" filled from the DataLoader), bf16 or
fp32 weights as configured, and DeepSpeedCPUAdam where the optimizer is offloaded. They run in
this one job with the environment `accelerate launch` derives from the YAML (accelerate's own
launcher functions); the `accelerate launch` command itself runs the recipes on generated configs
and the shipped presets (tests/recipes/test_*_run.py, test_readme_commands.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, build_plan, find_free_port, write_tiny_model_dir

from zerofit.configs.check import check_files
from zerofit.configs.outputs import render_files
from zerofit.files import write_files

pytestmark = pytest.mark.distributed
WORKER = REPO / "tests" / "scripts" / "compat_matrix.py"
PRESETS = REPO / "deepspeed_configs"
WORLD = 2


def _generated(root: Path, name: str, **answers) -> Path:
    """zerofit config output for 2 GPUs, micro 2 x accumulation 2 (absolute
    deepspeed_config_file)."""
    out = root / name
    plan = build_plan(hidden_size=64, gpus_per_node=WORLD, micro_batch=2, grad_accum=2, **answers)
    write_files(out, render_files(plan, ds_config_file=str(out / "ds_config.json")))
    return out


# what a cell runs with unless it says otherwise
CELL_DEFAULTS = dict(expect="ok", stage=None, precision="bf16", micro=2, accum=1, check=None)


def _cell(cid: str, client: str, **settings) -> dict:
    """A cell: what runs, and what must come out (facts of the engine, or a failure check
    names); ``settings`` override CELL_DEFAULTS and add the client's own keys."""
    return dict(id=cid, client=client, **{**CELL_DEFAULTS, **settings})


def build_cells(root: Path) -> list[dict]:
    cells = []
    preset_stage = {"zero1": 1, "zero2": 2, "zero2_offload": 2, "zero3": 3, "zero3_offload": 3}
    for name, stage in preset_stage.items():
        ds = str(PRESETS / f"{name}.json")
        cells.append(_cell(f"preset {name} | Trainer --bf16", "trainer", stage=stage, ds=ds))
        cells.append(
            _cell(
                f"preset {name} | Trainer --fp16 (finalise)",
                "finalize",
                stage=stage,
                ds=ds,
                precision="fp16",
            )
        )
    ds2, ds3 = str(PRESETS / "zero2.json"), str(PRESETS / "zero3.json")
    cells.append(_cell("preset zero2 | Trainer fp32", "trainer", stage=2, ds=ds2, precision="fp32"))
    # fp16 for real: trains on a GPU; on a CPU DeepSpeed refuses fp16, which is why the finalise
    # cells exist
    cells.append(
        _cell(
            "preset zero2 | Trainer --fp16 (real)",
            "trainer",
            expect="ok-on-gpu",
            stage=2,
            ds=ds2,
            precision="fp16",
        )
    )
    for client in ("sft", "dpo", "grpo"):
        cells.append(_cell(f"preset zero2 | TRL {client}", client, stage=2, ds=ds2))
        cells.append(_cell(f"preset zero3 | TRL {client}", client, stage=3, ds=ds3))
    cells.append(
        _cell(
            "preset zero3_offload | TRL sft", "sft", stage=3, ds=str(PRESETS / "zero3_offload.json")
        )
    )
    for name, stage in (("multi_gpu", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3)):
        cells.append(
            _cell(
                f"preset accelerate/{name}.yaml | accelerate loop --mixed_precision bf16",
                "accelerate",
                stage=stage,
                yaml=str(PRESETS / "accelerate" / f"{name}.yaml"),
                mixed_precision="bf16",
                cwd=str(REPO),
            )
        )
    cells.append(
        _cell(
            "preset zero2 | deepspeed.initialize",
            "deepspeed",
            expect="fail",
            ds=ds2,
            optimizer="client",
            accum=2,
            check=("deepspeed", "train_batch_size", "--flavour explicit"),
        )
    )

    # generated, explicit flavour, bf16 GPU (H100): plain DeepSpeed and accelerate loops
    variants = {
        "s1": dict(stage=1),
        "s2": dict(stage=2),
        "s2_cpu": dict(stage=2, offload_optimizer="cpu"),
        "s3": dict(stage=3),
        "s3_cpu": dict(stage=3, offload_optimizer="cpu", offload_param="cpu"),
    }
    for name, answers in variants.items():
        out = _generated(root, f"explicit_{name}", flavour="explicit", **answers)
        ds, yaml_path = str(out / "ds_config.json"), str(out / "accelerate.yaml")
        stage = answers["stage"]
        cells.append(
            _cell(
                f"explicit {name} bf16 | deepspeed.initialize + client optimizer",
                "deepspeed",
                stage=stage,
                ds=ds,
                optimizer="client",
                accum=2,
            )
        )
        cells.append(
            _cell(
                f"explicit {name} bf16 | accelerate loop (yaml)",
                "accelerate",
                stage=stage,
                yaml=yaml_path,
                accum=2,
                cwd=str(root),
            )
        )
    # fp32 (no bf16 block): the engine trains fp32 weights; run from the repository root, away
    # from the files (the YAML names its JSON absolutely)
    fp32 = _generated(root, "explicit_s2_fp32", flavour="explicit", stage=2, precision="fp32")
    cells.append(
        _cell(
            "explicit s2 fp32 | accelerate loop (yaml)",
            "accelerate",
            stage=2,
            yaml=str(fp32 / "accelerate.yaml"),
            precision="fp32",
            accum=2,
            cwd=str(REPO),
        )
    )
    for name in ("s2", "s2_cpu", "s3"):
        out = _generated(
            root,
            f"explicit_{name}_optblock",
            flavour="explicit",
            optimizer_block=True,
            **variants[name],
        )
        cells.append(
            _cell(
                f"explicit {name} bf16 --optimizer-block | deepspeed.initialize",
                "deepspeed",
                stage=variants[name]["stage"],
                ds=str(out / "ds_config.json"),
                optimizer="block",
                accum=2,
            )
        )
    ex2 = str(root / "explicit_s2" / "ds_config.json")
    cells.append(
        _cell("explicit s2 bf16 | Trainer --bf16, same batch", "trainer", stage=2, ds=ex2, accum=2)
    )
    cells.append(
        _cell(
            "explicit s2 bf16 | Trainer fp32",
            "trainer",
            expect="fail",
            ds=ex2,
            precision="fp32",
            accum=2,
            check=("trainer", "explicit", "bf16.enabled=true needs --bf16"),
        )
    )

    # generated, explicit flavour, V100-class fp16 GPU
    for stage in (1, 2, 3):
        out = _generated(root, f"explicit_v100_s{stage}", gpu="V100", precision="fp16", stage=stage)
        cells.append(
            _cell(
                f"explicit V100 s{stage} fp16 | Trainer --fp16 (finalise)",
                "finalize",
                stage=stage,
                ds=str(out / "ds_config.json"),
                precision="fp16",
                accum=2,
            )
        )

    # generated, auto flavour: bf16 GPU and V100
    for stage in (1, 2, 3):
        out = _generated(root, f"auto_s{stage}", flavour="auto", stage=stage)
        cells.append(
            _cell(
                f"auto s{stage} (H100) | Trainer --bf16",
                "trainer",
                stage=stage,
                ds=str(out / "ds_config.json"),
                accum=2,
            )
        )
        v100 = _generated(
            root, f"auto_v100_s{stage}", flavour="auto", gpu="V100", precision="fp16", stage=stage
        )
        cells.append(
            _cell(
                f"auto s{stage} (V100) | Trainer --fp16 (finalise)",
                "finalize",
                stage=stage,
                ds=str(v100 / "ds_config.json"),
                precision="fp16",
                accum=2,
            )
        )
    cells.append(
        _cell(
            "auto s3 (H100) | accelerate loop --mixed_precision bf16",
            "accelerate",
            stage=3,
            yaml=str(root / "auto_s3" / "accelerate.yaml"),
            mixed_precision="bf16",
            cwd=str(root),
        )
    )
    cells.append(
        _cell(
            "auto s3 (H100) | deepspeed.initialize",
            "deepspeed",
            expect="fail",
            ds=str(root / "auto_s3" / "ds_config.json"),
            optimizer="client",
            check=("deepspeed", "train_micro_batch_size_per_gpu", "--flavour explicit"),
        )
    )
    return cells


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """Run every cell in one 2-process job; {cell id: (cell, result)} plus the wall time."""
    root = tmp_path_factory.mktemp("matrix")
    model_dir = write_tiny_model_dir(root / "tiny-qwen2")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)).save_pretrained(
        model_dir
    )
    cells = build_cells(root)
    spec = root / "cells.json"
    spec.write_text(
        json.dumps({"model_dir": str(model_dir), "timeout_s": 120, "cells": cells}, indent=1)
    )
    results = root / "results.jsonl"
    env = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(root / "hf"),
        WANDB_DISABLED="true",
    )
    # the YAMLs are used from another directory than the repository's (cwd = the tmp root) on
    # purpose: generated YAMLs name their JSON absolutely; the presets need the repo root (cwd
    # cells).
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(WORLD),
        "--master_port",
        str(find_free_port()),
        str(WORKER),
        str(spec),
        str(results),
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    log = proc.stdout + proc.stderr
    (root / "matrix.log").write_text(log)
    got = {}
    if results.exists():
        for line in results.read_text().splitlines():
            record = json.loads(line)
            got[record["id"]] = record
    print(f"\ncompat matrix: {len(got)}/{len(cells)} cells in {wall:.0f} s (one 2-process job)")
    assert proc.returncode == 0, log[-6000:]
    return {c["id"]: (c, got.get(c["id"])) for c in cells}, log


def _ids() -> list[str]:
    # The ids do not depend on the files: build them against a throwaway directory.
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return [c["id"] for c in build_cells(Path(tmp))]


def _optimizer_with_offload(cell_id: str) -> str:
    """The optimizer that steps: DeepSpeedCPUAdam where the config offloads it (the `_cpu`
    variants), torch's AdamW otherwise."""
    return "DeepSpeedCPUAdam" if "_cpu" in cell_id else "AdamW"


def _assert_accelerate_engine(cell: dict, result: dict) -> None:
    """What the DeepSpeed engine got under `accelerate launch`'s environment: the batch
    arithmetic (explicit numbers unchanged; a preset's "auto" filled from the DataLoader's batch,
    accumulation 1), bf16 weights only under bf16, and DeepSpeedCPUAdam in place of the loop's
    torch AdamW where the optimizer is offloaded (accelerate's zero_force_ds_cpu_optimizer)."""
    micro, accum = cell["micro"], cell["accum"]
    assert result["world"] == WORLD, result
    assert (result["train_batch_size"], result["micro"], result["accum"]) == (
        micro * accum * WORLD,
        micro,
        accum,
    ), result
    assert result["dtype"] == ("torch.bfloat16" if result["bf16"] else "torch.float32"), result
    assert result["optimizer"] == _optimizer_with_offload(cell["id"]), result


@pytest.mark.parametrize("cell_id", _ids())
def test_cell(matrix, cell_id):
    cells, log = matrix
    cell, result = cells[cell_id]
    assert result is not None, f"{cell_id}: no result (the job stopped before it)\n{log[-3000:]}"
    if cell["expect"] == "ok":
        assert result["ok"], f"{cell_id}: {result.get('error')}"
        assert result["stage"] == cell["stage"]
        assert result["bf16"] == (
            cell["precision"] == "bf16" or cell.get("mixed_precision") == "bf16"
        )
        assert result["fp16"] == (cell["precision"] == "fp16")
        if cell["client"] == "finalize":
            # the Trainer's fill of the batch triple, then DeepSpeed's own assertion, at world 2
            assert (result["micro"], result["accum"], result["train_batch_size"]) == (
                cell["micro"],
                cell["accum"],
                cell["micro"] * cell["accum"] * WORLD,
            )
        else:
            assert result["global_steps"] == 2, result
        if cell["client"] == "deepspeed" and cell.get("optimizer") == "block":
            assert result["optimizer"] == _optimizer_with_offload(cell_id)
        if cell["client"] == "accelerate" and cell["stage"] > 0:
            _assert_accelerate_engine(cell, result)
        return
    if cell["expect"] == "ok-on-gpu":
        import torch

        if torch.cuda.is_available():
            assert result["ok"] and result["fp16"] and result["global_steps"] == 2, result
        else:
            assert (
                not result["ok"] and "Type fp16 is not supported on your device" in result["error"]
            ), result
        return
    # expected to fail for real, and `zerofit check` for that client names it with the fix
    assert not result["ok"], f"{cell_id} was expected to fail but trained"
    client, key, fix = cell["check"]
    texts = {cell["ds"]: Path(cell["ds"]).read_text()}
    problems = check_files(texts, client=client)
    hits = [
        p for p in problems if p.path.endswith(":" + key) and (fix in p.fix or fix in p.message)
    ]
    assert hits, [p.render() for p in problems]


def test_shipped_and_generated_files_pass_check_for_their_clients(tmp_path):
    cells = build_cells(tmp_path)
    for cell in cells:
        if cell["expect"] != "ok" or not cell.get("ds"):
            continue
        client = {"deepspeed": "deepspeed", "accelerate": "accelerate"}.get(
            cell["client"], "trainer"
        )
        problems = check_files({cell["ds"]: Path(cell["ds"]).read_text()}, client=client)
        assert [p for p in problems if p.severity == "error"] == [], (
            cell["id"],
            [p.render() for p in problems],
        )
