"""build_zero_config: every stage x offload x precision, both flavours; DeepSpeed's own config
class accepts them.

.venv/bin/python -m pytest tests/configs/test_deepspeed_json.py -q
"""

from __future__ import annotations

import itertools

import pytest
from conftest import build_plan

from zerofit.configs.deepspeed_json import build_zero_config
from zerofit.errors import ZerofitError

COMBOS = [
    (s, o, p, prec)
    for s, o, p, prec in itertools.product(
        (0, 1, 2, 3), ("none", "cpu", "nvme"), ("none", "cpu", "nvme"), ("bf16", "fp16", "fp32")
    )
    if (p == "none" or s == 3) and (o == "none" or s > 0)
]


def _plan(stage, opt="none", par="none", precision="bf16", flavour="explicit", **kw):
    nvme = "/local_nvme" if "nvme" in (opt, par) else None
    return build_plan(
        hidden_size=kw.pop("hidden_size", 4096),
        gpus_per_node=kw.pop("gpus", 8),
        stage=stage,
        offload_optimizer=opt,
        offload_param=par,
        precision=precision,
        flavour=flavour,
        nvme_path=nvme,
        micro_batch=kw.pop("micro", 4),
        grad_accum=kw.pop("accum", 3),
        **kw,
    )


def substitute_auto(
    ds: dict, hidden: int, micro: int, accum: int, world: int, precision: str = "bf16"
) -> dict:
    """Fill "auto" the way accelerate/HF Trainer do (``--bf16``/``--fp16`` from ``precision``)."""
    import copy

    ds = copy.deepcopy(ds)
    for dtype in ("bf16", "fp16"):
        if isinstance(ds.get(dtype), dict) and ds[dtype].get("enabled") == "auto":
            ds[dtype]["enabled"] = precision == dtype
    fills = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": micro * accum * world,
        "gradient_clipping": 1.0,
    }
    for k, v in fills.items():
        if ds.get(k) == "auto":
            ds[k] = v
    z = ds["zero_optimization"]
    for k, v in {
        "reduce_bucket_size": hidden * hidden,
        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "stage3_param_persistence_threshold": 10 * hidden,
    }.items():
        if z.get(k) == "auto":
            z[k] = v
    return ds


def deepspeed_accepts(ds: dict, world: int):
    """Parse ``ds`` with deepspeed.runtime.config.DeepSpeedConfig at ``world`` processes; return
    it."""
    from unittest import mock

    from deepspeed.runtime.config import DeepSpeedConfig

    with (
        mock.patch("deepspeed.comm.get_rank", return_value=0),
        mock.patch("deepspeed.comm.get_world_size", return_value=world),
    ):
        return DeepSpeedConfig(ds)


@pytest.mark.parametrize("stage,opt,par,precision", COMBOS)
@pytest.mark.parametrize("flavour", ["explicit", "auto"])
def test_every_combination_is_valid_for_deepspeed(stage, opt, par, precision, flavour):
    ds = build_zero_config(_plan(stage, opt, par, precision, flavour))
    cfg = deepspeed_accepts(substitute_auto(ds, 4096, 4, 3, 8, precision), world=8)
    assert cfg.zero_optimization_stage == stage
    assert cfg.train_batch_size == 4 * 3 * 8
    assert cfg.bfloat16_config.enabled == (precision == "bf16")
    assert cfg.float16_config.enabled == (precision == "fp16")
    z = cfg.zero_config
    assert (z.offload_optimizer.device if z.offload_optimizer else "none") == opt
    assert (z.offload_param.device if z.offload_param else "none") == par
    assert "optimizer" not in ds and "scheduler" not in ds  # the script's own optimizer is used


def test_explicit_batch_arithmetic_and_clipping():
    ds = build_zero_config(_plan(2, micro=4, accum=3, gpus=8))
    assert (
        ds["train_batch_size"],
        ds["train_micro_batch_size_per_gpu"],
        ds["gradient_accumulation_steps"],
    ) == (96, 4, 3)
    assert ds["gradient_clipping"] == 1.0
    z = ds["zero_optimization"]
    assert z["overlap_comm"] is True and z["contiguous_gradients"] is True
    assert z["reduce_bucket_size"] == 500_000_000 and z["allgather_bucket_size"] == 500_000_000


def test_auto_flavour_fills_auto_only_where_it_resolves_to_ds_defaults():
    ds2 = build_zero_config(_plan(2, flavour="auto"))
    assert ds2["train_batch_size"] == ds2["train_micro_batch_size_per_gpu"] == "auto"
    assert ds2["gradient_accumulation_steps"] == ds2["gradient_clipping"] == "auto"
    # stage 2: "auto" would become hidden² (16.7M), not the 5e8 the memory model counts -> stays
    # numeric
    assert ds2["zero_optimization"]["reduce_bucket_size"] == 500_000_000
    z3 = build_zero_config(_plan(3, flavour="auto"))["zero_optimization"]
    assert z3["reduce_bucket_size"] == z3["stage3_prefetch_bucket_size"] == "auto"
    assert z3["stage3_param_persistence_threshold"] == "auto"
    assert z3["stage3_max_live_parameters"] == 1_000_000_000


def test_auto_flavour_precision_is_auto_with_the_hf_docs_loss_scaling():
    # transformers trainer_config_process fill_match("fp16.enabled"/"bf16.enabled") from
    # --fp16/--bf16, accelerate set_mixed_precision from --mixed_precision: any precision flag
    # works with one file.
    for precision in ("bf16", "fp16", "fp32"):
        ds = build_zero_config(_plan(2, precision=precision, flavour="auto"))
        assert ds["bf16"] == {"enabled": "auto"}
        assert ds["fp16"] == {
            "enabled": "auto",
            "loss_scale": 0,
            "loss_scale_window": 1000,
            "initial_scale_power": 16,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    assert "--bf16" in build_zero_config(_plan(2, flavour="auto"))["_comment"]
    explicit = build_zero_config(_plan(2, precision="bf16"))
    assert explicit["bf16"] == {"enabled": True} and "fp16" not in explicit


@pytest.mark.parametrize("flavour", ["explicit", "auto"])
@pytest.mark.parametrize("opt", ["none", "cpu"])
def test_optimizer_block_on_request(flavour, opt):
    ds = build_zero_config(_plan(2, opt, flavour=flavour, optimizer_block=True))
    params = ds["optimizer"]["params"]
    assert ds["optimizer"]["type"] == "AdamW"
    if flavour == "auto":
        assert {k: params[k] for k in ("lr", "betas", "eps", "weight_decay")} == dict.fromkeys(
            ("lr", "betas", "eps", "weight_decay"), "auto"
        )
    else:
        assert params["lr"] == 1e-3 and params["betas"] == [
            0.9,
            0.999,
        ]  # torch.optim.AdamW defaults
    # torch AdamW instead of JIT fused_adam; with offload DeepSpeedCPUAdam must be built instead
    assert params.get("torch_adam") is (True if opt == "none" else None)
    filled = substitute_auto(ds, 4096, 4, 3, 8)
    if flavour == "auto":
        filled["optimizer"]["params"].update(
            lr=1e-5, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.0
        )
    assert deepspeed_accepts(filled, world=8).optimizer_name == "adamw"


def test_stage3_explicit_buckets_follow_hidden_size():
    z = build_zero_config(_plan(3, hidden_size=1024))["zero_optimization"]
    assert z["reduce_bucket_size"] == 1024 * 1024
    assert z["stage3_prefetch_bucket_size"] == int(0.9 * 1024 * 1024)
    assert z["stage3_param_persistence_threshold"] == 10240
    assert z["stage3_gather_16bit_weights_on_model_save"] is True


def test_offload_blocks_pin_memory_and_nvme_path():
    z = build_zero_config(_plan(3, "nvme", "cpu"))["zero_optimization"]
    assert z["offload_optimizer"] == {
        "device": "nvme",
        "pin_memory": True,
        "nvme_path": "/local_nvme",
    }
    assert z["offload_param"] == {"device": "cpu", "pin_memory": True}
    z2 = build_zero_config(_plan(2, "cpu"))["zero_optimization"]
    assert "offload_param" not in z2 and "stage3_gather_16bit_weights_on_model_save" not in z2


def test_fp16_has_dynamic_loss_scaling_and_fp32_has_no_precision_block():
    assert build_zero_config(_plan(1, precision="fp16"))["fp16"]["loss_scale"] == 0
    ds = build_zero_config(_plan(1, precision="fp32"))
    assert "bf16" not in ds and "fp16" not in ds


def test_nvme_without_path_is_a_user_error():
    from dataclasses import replace

    plan = _plan(2, "cpu")
    plan = replace(plan, offload_optimizer="nvme")  # a plan whose answers carry no nvme_path
    with pytest.raises(ZerofitError, match="nvme_path"):
        build_zero_config(plan)


def test_comment_key_is_accepted_by_deepspeed_top_level_only():
    ds = build_zero_config(_plan(2))
    assert ds["_comment"].startswith("zerofit: ZeRO stage 2")
    deepspeed_accepts(ds, world=8)  # unknown top-level keys are ignored
    ds["zero_optimization"]["_comment"] = "x"
    with pytest.raises(Exception, match="xtra|_comment"):
        deepspeed_accepts(ds, world=8)  # zero_optimization is a pydantic model with extra="forbid"


# --- ZeRO++ (plan.zero_plus: stage 3 across nodes) ---------------------------------------------
def _two_node_plan(zero_plus: str, flavour: str = "explicit"):
    from dataclasses import replace

    return replace(_plan(3, flavour=flavour, num_nodes=2), zero_plus=zero_plus)


def test_zero_plus_writes_the_keys_deepspeed_reads_with_a_node_sized_hpz_group():
    assert "zero_hpz_partition_size" not in build_zero_config(_plan(3))["zero_optimization"]
    hpz = build_zero_config(_two_node_plan("hpz"))
    assert hpz["zero_optimization"]["zero_hpz_partition_size"] == 8
    assert "zero_quantized_weights" not in hpz["zero_optimization"]
    assert "hpZ" in hpz["_comment"] and "8 GPUs" in hpz["_comment"]
    ds = build_zero_config(_two_node_plan("hpz+qwz+qgz"))
    zero = deepspeed_accepts(ds, world=16).zero_config  # DeepSpeedZeroConfig
    assert (zero.zero_hpz_partition_size, zero.zero_quantized_weights) == (8, True)
    assert zero.zero_quantized_gradients is True
    assert "quantizer CUDA op" in ds["_comment"]


@pytest.mark.parametrize("flavour", ["explicit", "auto"])
def test_zerofit_config_files_of_a_zero_plus_plan_pass_check(flavour):
    """`zerofit config`'s files (outputs.render_files) for 2-node hpZ and hpZ/qwZ/qgZ plans pass
    check (DeepSpeed's own config classes, then zerofit's rules) without a finding."""
    from zerofit.configs.check import check_files
    from zerofit.configs.outputs import render_files

    def checked_files(zero_plus: str) -> dict[str, str]:
        texts = render_files(_two_node_plan(zero_plus, flavour), ds_config_file="ds_config.json")
        return {name: texts[name] for name in ("ds_config.json", "accelerate.yaml")}

    client = "trainer" if flavour == "auto" else None  # who fills the "auto" values
    for zero_plus in ("hpz", "hpz+qwz+qgz"):
        files = checked_files(zero_plus)
        assert '"zero_hpz_partition_size": 8' in files["ds_config.json"]
        assert check_files(files, exists=lambda path: True, client=client) == []


def test_check_warns_where_zero_plus_cannot_work():
    """ZeRO++ below stage 3 is ignored, an hpZ group must divide the world (DeepSpeed asserts)
    and is useless when it spans it; MiCS is refused as DeepSpeed 0.19 refuses it."""
    from zerofit.configs.check import check_deepspeed

    def findings(zero: dict, world: int) -> list[tuple[str, str]]:
        cfg = {"train_batch_size": world, "train_micro_batch_size_per_gpu": 1}
        cfg["gradient_accumulation_steps"] = 1
        problems = check_deepspeed({**cfg, "zero_optimization": zero}, "ds.json", world=world)
        return [(p.path.split(".")[-1], p.severity) for p in problems]

    assert findings({"stage": 2, "zero_hpz_partition_size": 8}, 16) == [
        ("zero_hpz_partition_size", "warning")
    ]
    assert findings({"stage": 3, "zero_hpz_partition_size": 3}, 16) == [
        ("zero_hpz_partition_size", "error")
    ]
    assert findings({"stage": 3, "zero_hpz_partition_size": 8}, 8) == [
        ("zero_hpz_partition_size", "warning")
    ]
    assert findings({"stage": 3, "zero_hpz_partition_size": 8}, 16) == []
    assert ("mics_shard_size", "error") in findings({"stage": 3, "mics_shard_size": 8}, 16)


def test_zerofit_config_across_slow_nodes_writes_zero_plus_that_check_accepts(tmp_path, capsys):
    """The CLI end to end: on 2 nodes of 8 H100s joined by 100 Gbit/s, `zerofit config` plans
    ZeRO-3 with hpZ/qwZ/qgZ (backward's gathers stay in the node, the rest is quantized), writes
    its keys, and `zerofit check --client trainer` finds nothing."""
    import json

    from zerofit.cli.main import main

    argv = ["config", "--model", "qwen2.5-7b", "--gpu", "H100-SXM", "--gpus-per-node", "8"]
    argv += ["--num-nodes", "2", "--inter-node-gbps", "100", "--main-process-ip", "10.0.0.1"]
    assert main(argv + ["--out", str(tmp_path)]) == 0
    zero = json.loads((tmp_path / "ds_config.json").read_text())["zero_optimization"]
    assert (zero["stage"], zero["zero_hpz_partition_size"]) == (3, 8)
    assert zero["zero_quantized_weights"] and zero["zero_quantized_gradients"]
    files = [str(tmp_path / "ds_config.json"), str(tmp_path / "accelerate.yaml")]
    capsys.readouterr()
    assert main(["check", "--client", "trainer", *files]) == 0
    assert "no problems" in capsys.readouterr().out
