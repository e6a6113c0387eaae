"""`zerofit estimate` / `zerofit plan` through zerofit.cli.main: JSON keys and types, clean errors.

Run: .venv/bin/python -m pytest tests/cli/test_cli_estimate.py -q   (~3 s)
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import calibration_points

from zerofit.cli.main import main

FULL = [
    "estimate",
    "--model",
    "qwen2.5-0.5b",
    "--gpu",
    "H100-SXM",
    "--gpus-per-node",
    "1",
    "--nodes",
    "1",
    "--stage",
    "2",
    "--offload-optimizer",
    "none",
    "--offload-param",
    "none",
    "--seq-len",
    "1024",
    "--micro-batch",
    "2",
    "--no-gradient-checkpointing",
    "--precision",
    "bf16",
    "--workload",
    "sft",
    # equal-length rows, as the spelled-out case in test_memory (padding has its own test)
    "--no-padding",
    "--json",
]


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_json_keys_and_types(capsys):
    out = _json(capsys, FULL)
    assert (
        isinstance(out["peak_gib"], float)
        and isinstance(out["fits"], bool)
        and isinstance(out["cpu_gib"], float)
    )
    assert out["fits"] is True and out["cpu_gib"] == 0.0
    assert {"params", "master_fp32", "optimizer_states", "activations", "logits"} <= set(
        out["breakdown"]
    )
    assert all(isinstance(v, float) for v in out["breakdown"].values())
    # same case as the spelled-out breakdown in test_memory (built-in shape of Qwen2.5-0.5B),
    # whose H100 holds 66 MiB of cuBLAS workspaces in its peak
    assert out["breakdown"]["cublas_workspace"] == 0.064
    assert out["peak_gib"] == pytest.approx(12.625, abs=0.02)


def test_estimate_offload_raises_cpu_and_lowers_gpu(capsys):
    base = _json(capsys, FULL)
    argv = [a if a != "none" else "cpu" for a in FULL]
    argv[argv.index("--stage") + 1] = "3"
    off = _json(capsys, argv)
    assert off["peak_gib"] < base["peak_gib"] and off["cpu_gib"] > 0


def test_estimate_defaults_and_human_output(capsys):
    out = _json(capsys, ["estimate", "--model", "qwen2.5-0.5b", "--json"])
    assert (out["stage"], out["micro_batch"], out["gradient_checkpointing"]) == (2, 1, False)
    assert main(["estimate", "--model", "qwen2.5-0.5b", "--gpu", "A10"]) == 0
    assert "peak" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "--stage", "5"],
        ["estimate", "--offload-optimizer", "disk"],
        ["estimate", "--seq-len", "abc"],
        ["estimate", "--micro-batch", "0"],
        ["estimate", "--gpu", "TPUv9"],
        ["estimate", "--stage", "2", "--offload-param", "cpu"],
        ["estimate", "--stage", "0", "--offload-optimizer", "cpu"],
        ["plan", "--gpus-per-node", "8", "--global-batch", "12"],
        ["estimate", "--bogus"],
    ],
)
def test_bad_input_exits_2_without_traceback(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip()


def test_plan_json_and_table(capsys):
    out = _json(
        capsys,
        ["plan", "--model", "qwen2.5-0.5b", "--seq-len", "1024", "--global-batch", "16", "--json"],
    )
    assert out["global_batch"] == out["micro_batch"] * out["grad_accum"] * out["world_size"] == 16
    assert out["fits"] is True and out["decisions"] and len(out["alternatives"]) == 16
    budget = out["gpu_need_gib"] + out["spare_gib"]
    assert budget == pytest.approx(79.11, abs=0.01)  # the default GPU, H100-SXM, at headroom 1
    assert main(["plan", "--model", "qwen2.5-0.5b", "--gpu", "A10"]) == 0
    assert "alternatives" in capsys.readouterr().out


def test_calibration_points_through_the_users_ds_config(capsys, tmp_path):
    """Every H100 point estimated from a JSON holding exactly what the run used (DeepSpeed's
    default buckets), the torch AdamW client optimizer = the accelerate stack: within 0.3 %, as
    tests/memory/test_estimate.py checks the same points (the H100's cuBLAS workspaces
    counted)."""
    import pathlib

    base = json.loads(
        (
            pathlib.Path(__file__).resolve().parents[1] / "data" / "ds_calibration_h100.json"
        ).read_text()
    )
    points = calibration_points()
    assert points  # the copy in tests/data is always there
    rows = []
    for i, pt in enumerate(points):
        ds = json.loads(json.dumps(base))
        ds["train_micro_batch_size_per_gpu"] = pt["mbs"]
        ds["zero_optimization"]["stage"] = pt["stage"]
        if pt["offload"] != "none":
            ds["zero_optimization"]["offload_optimizer"] = {
                "device": pt["offload"],
                "pin_memory": True,
            }
        path = tmp_path / f"ds{i}.json"
        path.write_text(json.dumps(ds))
        out = _json(
            capsys,
            [
                "estimate",
                "--model",
                "qwen2.5-0.5b",
                "--gpu",
                "H100-SXM",
                "--stack",
                "accelerate",
                "--optimizer",
                "adamw_torch",
                "--seq-len",
                str(pt["seq"]),
                "--ds-config",
                str(path),
                "--gradient-checkpointing" if pt["gc"] else "--no-gradient-checkpointing",
                # the runs fed equal-length random ids without an attention mask
                "--no-padding",
                "--json",
            ],
        )
        assert (out["stage"], out["micro_batch"], out["offload_optimizer"]) == (
            pt["stage"],
            pt["mbs"],
            pt["offload"],
        )
        err = out["peak_gib"] / pt["peak_alloc_gib"] - 1
        rows.append(err)
        assert -0.003 <= err <= 0.003, (pt, out["peak_gib"])
    assert len(rows) == 9


def test_ds_config_values_and_flag_override(capsys, tmp_path):
    ds = {
        "bf16": {"enabled": True},
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 8,
        "zero_optimization": {
            "stage": 3,
            "stage3_prefetch_bucket_size": "auto",
            "reduce_bucket_size": 2e8,
        },
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
    }
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    out = _json(capsys, ["estimate", "--model", "qwen2.5-0.5b", "--ds-config", str(path), "--json"])
    assert (out["stage"], out["micro_batch"], out["grad_accum"]) == (3, 4, 8)
    assert out["optimizer"] == "ds_fused_adam"  # DeepSpeed builds FusedAdam from the block
    assert out["breakdown"]["comm_buckets"] == pytest.approx(2e8 * 2 / 2**30, abs=1e-3)
    flagged = _json(
        capsys,
        [
            "estimate",
            "--model",
            "qwen2.5-0.5b",
            "--ds-config",
            str(path),
            "--stage",
            "2",
            "--micro-batch",
            "1",
            "--json",
        ],
    )
    assert (flagged["stage"], flagged["micro_batch"]) == (2, 1)


def test_ds_config_offload_pinning_and_stage2_param_block(capsys, tmp_path):
    """A user's offload blocks: ``pin_memory: false`` takes the power-of-two rounding of pinned
    buffers out of the host RAM (memory/pinned.py), and under ZeRO-2 an ``offload_param`` block
    is ignored, as DeepSpeed ignores it (DeepSpeed-Chat style configs write one at every stage)."""

    def host_gib(pin: bool) -> float:
        zero = {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": pin},
            "offload_param": {"device": "cpu"},
        }
        path = tmp_path / f"ds-{pin}.json"
        path.write_text(json.dumps({"bf16": {"enabled": True}, "zero_optimization": zero}))
        argv = ["estimate", "--model", "qwen2.5-7b", "--gpus-per-node", "8"]
        out = _json(capsys, argv + ["--ds-config", str(path), "--json"])
        assert out["offload_param"] == "none"
        return out["cpu_gib"]

    # per rank: the shard's fp32 master (3.81 GB) and fp32 grads pin 4 GiB each, its bf16 buffer
    # (1.90 GB) 2 GiB, and the staging buffer of the largest weight (the 1.09 GB LM head) 2 GiB
    shard, head = 951_952_064, 152_064 * 3_584 * 2
    rounding = (4 + 2 + 4) * 2**30 - 10 * shard + 2 * 2**30 - head
    assert host_gib(True) - host_gib(False) == pytest.approx(8 * rounding / 2**30, abs=0.01)


def test_accelerate_config_reads_its_json_and_processes(capsys, tmp_path):
    (tmp_path / "ds.json").write_text(
        json.dumps({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}})
    )
    (tmp_path / "acc.yaml").write_text(
        "distributed_type: DEEPSPEED\nnum_machines: 2\nnum_processes: 16\n"
        "mixed_precision: bf16\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n"
    )
    out = _json(
        capsys,
        [
            "estimate",
            "--model",
            "qwen2.5-0.5b",
            "--accelerate-config",
            str(tmp_path / "acc.yaml"),
            "--json",
        ],
    )
    assert (out["stage"], out["world_size"]) == (1, 16)
    assert out["outside_peak_gib"]["nccl_buffers"] > 0  # 2 nodes: network ring + tree buffers


@pytest.mark.parametrize(
    "content, field",
    [("{not json", "--ds-config"), ('{"zero_optimization": {"stage": 7}}', "stage")],
)
def test_bad_ds_config_is_one_line(capsys, tmp_path, content, field):
    path = tmp_path / "ds.json"
    path.write_text(content)
    assert main(["estimate", "--ds-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "name, flag, content",
    [
        ("ds.json", "--ds-config", "[" * 100_000),
        ("accelerate.yaml", "--accelerate-config", "a: " + "[" * 100_000),
    ],
)
def test_deeply_nested_config_files_are_one_line(capsys, tmp_path, name, flag, content):
    # Nesting deep enough to exhaust Python's recursion limit in the parser was a RecursionError
    # traceback for the YAML.
    path = tmp_path / name
    path.write_text(content)
    assert main(["estimate", flag, str(path)]) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_target_len_flag_reaches_a_t5_estimate_and_is_refused_for_a_decoder(capsys, tmp_path):
    """``--target-len``: T5's decoder and loss over its targets, fewer bytes and FLOPs than
    targets as long as the inputs; it round-trips through answers.yaml (``config --out``'s
    file read back with ``--answers``); a decoder-only model refuses it in one line."""
    from transformers import T5Config

    from zerofit.planning.answers import Answers, load_answers, render_answers

    T5Config(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12).save_pretrained(tmp_path)
    base = ["estimate", "--model", str(tmp_path / "config.json"), "--seq-len", "512"]
    base += ["--micro-batch", "16", "--json"]
    same = _json(capsys, base)
    short = _json(capsys, base + ["--target-len", "128"])
    assert short["peak_gib"] < same["peak_gib"] - 1
    assert short["time_breakdown"]["compute_s"] < 0.8 * same["time_breakdown"]["compute_s"]
    # targets as long as the inputs: today's estimate, byte for byte
    assert _json(capsys, base + ["--target-len", "512"]) == same
    answers_file = tmp_path / "answers.yaml"
    answers_file.write_text(render_answers(Answers(model=base[2], seq_len=512, target_len=128)))
    assert load_answers(answers_file.read_text()).target_len == 128
    from_file = _json(capsys, ["estimate", "--answers", str(answers_file)] + base[5:])
    assert from_file["peak_gib"] == short["peak_gib"]
    assert main(["estimate", "--model", "qwen2.5-0.5b", "--target-len", "128"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zerofit: error: target_len: applies to encoder-decoder models only")
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_new_stack_flags_reach_the_estimate(capsys):
    base = [
        "estimate",
        "--model",
        "qwen2.5-0.5b",
        "--seq-len",
        "2048",
        "--micro-batch",
        "4",
        "--json",
    ]
    hf = _json(capsys, base)
    assert (hf["stack"], hf["optimizer"], hf["loss_path"]) == ("hf", "adamw_torch_fused", "hf")
    liger = _json(capsys, base + ["--loss-kernel", "liger"])
    assert (
        hf["peak_phase"] == "forward"
        and liger["peak_gib"] < hf["peak_gib"] - 0.8 * hf["breakdown"]["logits"]
    )
    dpo = _json(capsys, base + ["--workload", "dpo"])
    pre = _json(capsys, base + ["--workload", "dpo", "--precompute-ref"])
    assert dpo["loss_path"] == "hf" and "reference_model" in dpo["breakdown"]
    fused = _json(capsys, base + ["--workload", "dpo", "--loss-kernel", "trl_fused"])
    assert fused["loss_path"] == "trl_fused" and fused["peak_gib"] < dpo["peak_gib"]
    assert main(["estimate", "--loss-kernel", "trl_logps"]) == 2  # TRL's DPO/GRPO code, no SFT loss
    assert "loss_kernel" in capsys.readouterr().err
    sft_fused = _json(capsys, base + ["--loss-kernel", "trl_fused"])  # TRL 1.16's SFTTrainer
    assert sft_fused["loss_path"] == "trl_fused" and sft_fused["peak_gib"] < hf["peak_gib"]
    assert "reference_model" not in pre["breakdown"]
    vllm = _json(
        capsys,
        [
            "estimate",
            "--model",
            "qwen2.5-0.5b",
            "--workload",
            "grpo",
            "--seq-len",
            "512",
            "--vllm-gpu-memory-utilization",
            "0.3",
            "--json",
        ],
    )
    assert vllm["outside_peak_gib"]["vllm_reserved"] == pytest.approx(0.3 * 79.11, abs=0.01)
    assert main(["estimate", "--gpu", "V100", "--precision", "bf16"]) == 2
    assert "fp16" in capsys.readouterr().err


def test_estimate_names_the_failing_budget(capsys):
    """Issue 13 item 5: the GPU fits, the node's RAM does not; the text says which, with both
    numbers."""
    argv = [
        "estimate",
        "--model",
        "qwen2.5-7b",
        "--gpu",
        "L40S",
        "--stage",
        "2",
        "--offload-optimizer",
        "cpu",
        "--gradient-checkpointing",
        "--host-ram-gib",
        "64",
    ]
    out = _json(capsys, argv + ["--json"])
    assert out["fits"] is False and out["fits_gpu"] is True and out["fits_host"] is False
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "fits on the GPU" in text and "GiB of host RAM per node, you gave 64.0" in text
    for term in ("allocator_fragmentation", "cuda_context", "safety margin", "the GPU must hold"):
        assert term in text


def test_where_the_activations_come_from_is_said(capsys):
    """Baichuan's layer is remote code that zerofit never runs: the estimate says its layer is
    Llama-shaped. BLOOM's is traced from transformers' code, and since transformers has only
    eager attention for it, the estimate says its seq x seq scores are kept. A formula family
    says nothing."""
    from conftest import REPO

    models = REPO / "tests" / "data" / "public_report_models"
    baichuan, bloom = str(models / "baichuan-13b.json"), str(models / "bloomz-7b1.json")
    out = _json(capsys, ["estimate", "--model", baichuan, "--json"])
    assert out["activations_traced"] is False and out["activations_basis"] == "llama_shaped"
    assert main(["estimate", "--model", baichuan]) == 0
    assert "was not traced" in " ".join(capsys.readouterr().out.split())  # rich wraps lines
    out = _json(capsys, ["estimate", "--model", bloom, "--json"])
    assert out["activations_traced"] is True and out["activations_basis"] == "traced_eager_only"
    assert main(["estimate", "--model", bloom]) == 0
    assert "keeps seq x seq scores" in " ".join(capsys.readouterr().out.split())
    out = _json(capsys, ["estimate", "--model", "qwen2.5-0.5b", "--json"])
    assert out["activations_traced"] is True and out["activations_basis"] == "formula"
    assert main(["estimate", "--model", "qwen2.5-0.5b"]) == 0
    assert "note:" not in capsys.readouterr().out


def test_pin_memory_flag_and_the_unpinned_host_ram_in_the_verdict(capsys, tmp_path):
    """``--no-pin-memory`` overrides the file's offload blocks; when pinned buffers are what the
    node's RAM cannot hold, the verdict names the unpinned need and the flag."""
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"bf16": {"enabled": True}, "zero_optimization": zero}))
    argv = ["estimate", "--model", "qwen2.5-32b", "--gpu", "H100-NVL", "--ds-config", str(path)]
    argv += ["--gradient-checkpointing", "--host-ram-gib", "600"]
    pinned = _json(capsys, argv + ["--json"])
    assert pinned["pin_memory"] and not pinned["fits_host"] and pinned["fits_gpu"]
    assert pinned["cpu_gib_unpinned"] < 600.0 < pinned["cpu_gib"]
    main(argv)  # the table and the verdict line (the exit status is estimate's, not the verdict)
    line = " ".join(capsys.readouterr().out.split())
    assert "--no-pin-memory" in line and f"{pinned['cpu_gib_unpinned']:.1f} GiB" in line
    unpinned = _json(capsys, argv + ["--no-pin-memory", "--json"])
    assert not unpinned["pin_memory"] and unpinned["fits"]
    assert unpinned["cpu_gib"] == pytest.approx(pinned["cpu_gib_unpinned"], abs=0.01)
    assert unpinned["cpu_gib_unpinned"] is None


def test_estimate_says_what_a_fit_leaves_and_cautions_a_tight_one(capsys):
    """``spare_gib`` is the budget minus what the GPU must hold; a fit with less to spare than the
    median fragmentation of public OOM messages gets the caution (memory/overheads.py)."""
    roomy = _json(capsys, ["estimate", "--model", "qwen2.5-0.5b", "--gpu", "H100", "--json"])
    assert roomy["spare_gib"] == pytest.approx(roomy["budget_gib"] - roomy["gpu_need_gib"], 0.01)
    assert main(["estimate", "--model", "qwen2.5-0.5b", "--gpu", "H100"]) == 0
    text = capsys.readouterr().out
    assert (
        f"({roomy['spare_gib']:.1f} GiB to spare)" in text and "lost to fragmentation" not in text
    )
    # the same model on a card it barely fits: a few GiB under roomy's need
    tight = ["estimate", "--model", "qwen2.5-0.5b", "--gpu", "H100", "--safety-margin-gib"]
    tight.append(str(round(1.0 + roomy["spare_gib"] - 0.5, 2)))
    out = _json(capsys, [*tight, "--json"])
    assert out["fits"] and 0.4 < out["spare_gib"] < 0.6
    assert main(tight) == 0
    assert "lost to fragmentation after many steps" in capsys.readouterr().out


def test_padding_is_reported_and_can_be_turned_off(capsys):
    """FULL's micro batch of 2 is padded by default (planner.pads_batches): --json says so and
    what it costs; --no-padding estimates equal-length rows."""
    unpadded = _json(capsys, FULL)
    padded = _json(capsys, [arg for arg in FULL if arg != "--no-padding"])
    assert (padded["padded"], unpadded["padded"]) == (True, False)
    assert unpadded["padding_gib"] == 0.0
    assert padded["padding_gib"] > 0
    assert padded["peak_gib"] == pytest.approx(
        unpadded["peak_gib"] + padded["padding_gib"], abs=2e-3
    )
    text_args = [arg for arg in FULL if arg not in ("--no-padding", "--json")]
    assert main(text_args) == 0
    assert "--no-padding" in capsys.readouterr().out


def test_plan_says_when_it_estimated_padded_batches(capsys):
    """DPO pairs are padded by the collators: plan --json says so and the text names the flag;
    a user who says --no-padding gets neither."""
    base = ["plan", "--model", "qwen2.5-0.5b", "--gpu", "A100-80GB", "--workload", "dpo"]
    assert _json(capsys, base + ["--json"])["padded"] is True
    assert _json(capsys, base + ["--no-padding", "--json"])["padded"] is False
    assert main(base) == 0
    assert "--no-padding" in capsys.readouterr().out
    assert main(base + ["--no-padding"]) == 0
    assert "--no-padding" not in capsys.readouterr().out


def test_estimate_json_carries_the_step_time(capsys):
    """The speed model's fields (zerofit.speed.step_time): the terms add up to the step, and
    offloading the optimizer to the CPU makes the same step slower, its time in CPUAdam."""
    out = _json(capsys, FULL)
    assert out["step_time_s"] > 0 and out["tokens_per_s_per_gpu"] > 0 and 0 < out["mfu"] < 1
    assert sum(out["time_breakdown"].values()) == pytest.approx(out["step_time_s"], abs=0.01)
    tokens = 2 * 1024  # micro 2 x seq 1024, one micro step
    assert out["tokens_per_s_per_gpu"] == pytest.approx(tokens / out["step_time_s"], rel=0.01)
    argv = list(FULL)
    argv[argv.index("--offload-optimizer") + 1] = "cpu"
    offloaded = _json(capsys, argv)
    assert offloaded["step_time_s"] > out["step_time_s"]
    assert offloaded["time_breakdown"]["cpu_optimizer_s"] > 0


def test_estimate_human_output_has_the_speed_line(capsys):
    assert main(["estimate", "--model", "qwen2.5-0.5b", "--gpu", "H100-SXM"]) == 0
    out = capsys.readouterr().out
    assert "s per optimizer step" in out and "tokens/s per GPU" in out
    # GRPO's step includes its rollout (speed/generation.py), named in the line and the JSON
    assert main(["estimate", "--model", "qwen2.5-0.5b", "--workload", "grpo"]) == 0
    speed_line = " ".join(capsys.readouterr().out.split())  # the line may wrap
    assert re.search(r"fixed costs [0-9.]+ s, generation [0-9.]+ s\)", speed_line)
    grpo = _json(capsys, ["estimate", "--model", "qwen2.5-0.5b", "--workload", "grpo", "--json"])
    assert 0 < grpo["time_breakdown"]["generation_s"] < grpo["step_time_s"]
    assert sum(grpo["time_breakdown"].values()) == pytest.approx(grpo["step_time_s"], abs=0.01)


def test_cluster_facts_fill_the_network_and_flags_win(capsys, tmp_path):
    """``--cluster-facts`` (what `zerofit doctor` measured) sets the network of plan and estimate;
    a flag given beside it wins; a bad file is one line naming the field."""
    from zerofit.cluster_facts import ClusterFacts, write_cluster_facts

    facts = write_cluster_facts(
        tmp_path / "facts.json", ClusterFacts(inter_node_gbps=10.0, intra_node_gbps=20.0)
    )
    base = ["--model", "qwen2.5-7b", "--gpu", "A100-80GB", "--gpus-per-node", "8"]
    base += ["--nodes", "2", "--stage", "3", "--json"]
    for command in ("estimate", "plan"):
        plain = _json(capsys, [command, *base])
        measured = _json(capsys, [command, *base, "--cluster-facts", str(facts)])
        assert (plain["inter_node_gbps"], plain["intra_node_gbps"]) == (100.0, 300)
        assert (measured["inter_node_gbps"], measured["intra_node_gbps"]) == (10.0, 20.0)
        assert measured["step_time_s"] > plain["step_time_s"]
        flagged = _json(
            capsys, [command, *base, "--cluster-facts", str(facts), "--inter-node-gbps", "400"]
        )
        assert flagged["inter_node_gbps"] == 400.0 and flagged["intra_node_gbps"] == 20.0
        # --interconnect names the link inside the node: the measured one gives way
        with_facts = [command, *base, "--cluster-facts", str(facts)]
        pcie = _json(capsys, [*with_facts, "--interconnect", "pcie"])
        assert (pcie["interconnect"], pcie["intra_node_gbps"]) == ("pcie", 32)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "zerofit-cluster-facts", "version": 1, "inter_node_gbps": -1}')
    assert main(["plan", *base, "--cluster-facts", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "cluster-facts inter_node_gbps" in err and "Traceback" not in err


def test_estimate_reports_the_runs_time_from_the_dataset_size(capsys):
    argv = ["estimate", "--model", "qwen2.5-0.5b", "--gpu", "H100-SXM", "--global-batch", "8"]
    assert _json(capsys, [*argv, "--json"])["run_time_h"] is None
    out = _json(capsys, [*argv, "--dataset-tokens", str(2048 * 8 * 100), "--epochs", "2", "--json"])
    assert out["optimizer_steps"] == 200
    assert out["run_time_h"] == pytest.approx(200 * out["step_time_s"] / 3600, rel=0.01)
    assert main([*argv, "--dataset-samples", "800", "--avg-seq-len", "300"]) == 0
    assert "the run: 100 optimizer steps" in capsys.readouterr().out


def test_estimate_says_why_a_qlora_peak_is_in_loading(capsys):
    """A 4-bit 70B under ZeRO-3 with checkpointing peaks while transformers loads it whole onto
    each GPU; the estimate names that phase and explains it under the verdict."""
    argv = ["estimate", "--model", "llama-3.1-70b", "--gpu", "RTX4090", "--gpus-per-node", "2"]
    argv += ["--finetuning", "qlora", "--stage", "3", "--gradient-checkpointing"]
    main(argv)
    out = capsys.readouterr().out
    assert "peak in load" in out
    assert "note: the peak is in loading: transformers loads a 4-bit model whole" in out


def test_a_zero3_lora_estimate_reads_memory_efficient_linear_from_the_json(capsys, tmp_path):
    """With DeepSpeed's memory-efficient linear on (its default) ZeRO-3 saves every frozen base
    layer's input under LoRA (memory/lora.py ``frozen_linears_save_inputs``); a JSON that turns
    it off keeps torch's linear, and the estimate holds less."""
    peaks = {}
    for efficient in (True, False):
        path = tmp_path / f"ds_{efficient}.json"
        zero = {"stage": 3, "memory_efficient_linear": efficient}
        path.write_text(json.dumps({"zero_optimization": zero, "bf16": {"enabled": True}}))
        argv = ["estimate", "--model", "qwen2.5-0.5b", "--gpu", "H100-SXM", "--seq-len", "2048"]
        main(argv + ["--finetuning", "lora", "--ds-config", str(path), "--json"])
        peaks[efficient] = json.loads(capsys.readouterr().out)["peak_gib"]
    assert peaks[False] < peaks[True]


def _tiny_qwen2_dir(tmp_path, vocab_size: int = 1000):
    """A 2-layer Qwen2 config.json, as ``save_pretrained`` writes it."""
    from transformers import Qwen2Config

    Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size,
    ).save_pretrained(tmp_path)
    return str(tmp_path / "config.json")


def test_replay_allocator_counts_the_replayed_reserved_memory(capsys, tmp_path):
    """``--replay-allocator``: the run replayed through the caching allocator
    (memory/allocation_trace.py) gives the reserved memory the verdict counts (peak plus the
    allocator term equals the replay's max_memory_reserved); a setup it cannot replay keeps
    the estimate and says why."""
    base = ["estimate", "--model", _tiny_qwen2_dir(tmp_path), "--gpu", "H100-SXM"]
    base += ["--stage", "0", "--finetuning", "lora", "--micro-batch", "2", "--seq-len", "256"]
    base += ["--no-padding", "--json"]
    plain = _json(capsys, base)
    replayed = _json(capsys, base + ["--replay-allocator"])
    replay = replayed["allocator_replay"]
    assert plain["allocator_replay"] is None and replay["ran"] and replay["steps"] == 3
    assert replay["max_reserved_gib"] >= replay["max_allocated_gib"] > 0
    assert replay["max_allocated_gib"] == pytest.approx(replayed["peak_gib"], rel=0.03)
    reserved = replayed["peak_gib"] + replayed["outside_peak_gib"]["allocator_fragmentation"]
    assert reserved == pytest.approx(replay["max_reserved_gib"], abs=0.002)
    assert main(base[:-1] + ["--replay-allocator"]) == 0
    assert "allocator replay: max_memory_reserved" in capsys.readouterr().out
    stage2 = _json(capsys, [*base, "--replay-allocator", "--stage", "2"])
    assert stage2["allocator_replay"]["ran"] is False and "DeepSpeed" in (
        stage2["allocator_replay"]["reason"]
    )
    assert stage2["peak_gib"] == _json(capsys, [*base, "--stage", "2"])["peak_gib"]


def test_a_replay_that_runs_out_of_memory_does_not_fit(capsys, tmp_path):
    """The replay runs on the GPU's memory: a run whose segments the allocator cannot get
    there is judged not to fit (32k-entry logits of 16 x 4096 tokens on a 24 GB card)."""
    argv = ["estimate", "--model", _tiny_qwen2_dir(tmp_path, vocab_size=32000)]
    argv += ["--gpu", "RTX4090", "--stage", "0", "--micro-batch", "16", "--seq-len", "4096"]
    argv += ["--no-padding", "--replay-allocator", "--json"]
    report = _json(capsys, argv)
    assert report["allocator_replay"]["out_of_memory"] is True
    assert report["fits_gpu"] is False
