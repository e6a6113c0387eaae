"""LoRA and QLoRA in the recipes (`--finetuning lora|qlora`, recipes/lora.py), run for real.

- ZeRO-3, 2 CPU processes, SFT LoRA with gradient checkpointing: checkpoints hold the adapters
  only (DeepSpeed's exclude_frozen_parameters), a resumed run replays the lost step identically,
  and the final adapter is gathered (non-empty, trained) and loads with peft.
- ZeRO-2, 2 CPU processes, DPO LoRA: the reference is the policy with its adapters disabled and
  its log-probs equal the base model's at every step; `--merge-adapter` saves a full model.
- One CPU process, GRPO QLoRA (bitsandbytes NF4 on CPU) with a KL reference: trains, generates,
  checkpoints the adapters only.
Configs: `zerofit config --finetuning lora` at fp32 (exact comparisons), global batch 8,
micro-batch 2.

Run: .venv/bin/python -m pytest tests/recipes/test_lora_run.py -q   (serial; 4 launches)
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from recipe_runs import (
    RECIPES,
    RUN_LIMIT,
    failure_text,
    free_port,
    launch,
    load_recipe,
    one_line_error,
    read_metrics,
    save_tiny_model,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A saved tiny model and fp32 ZeRO-2 / ZeRO-3 configs for 2 processes."""
    from zerofit.cli.main import main

    root = tmp_path_factory.mktemp("lora")
    model = save_tiny_model(root / "model")
    configs = {}
    for stage in (2, 3):
        out = root / f"zero{stage}"
        flags = ["--model", str(model), "--gpu", "L4", "--gpus-per-node", "2"]
        flags += ["--stage", str(stage), "--global-batch", "8", "--micro-batch", "2"]
        flags += ["--seq-len", "16", "--precision", "fp32", "--flavour", "explicit"]
        flags += ["--finetuning", "lora"]  # the files `zerofit config` writes for LoRA
        assert main(["config", *flags, "--out", str(out)]) == 0
        configs[f"zero{stage}"] = out / "accelerate.yaml"
    return {"root": root, "model": model, **configs}


def lora_keys_only(keys) -> bool:
    return bool(keys) and all(".lora_" in key for key in keys)


@pytest.mark.distributed
def test_zero3_sft_lora_adapter_checkpoints_resume_and_gathered_adapter(tiny, tmp_path):
    import torch
    from safetensors.torch import load_file

    out = tmp_path / "run"
    flags = ("--finetuning", "lora", "--model", str(tiny["model"]), "--max-steps", "3")
    flags += ("--save-every", "2", "--gradient-checkpointing")
    res = launch(tiny["zero3"], "sft", out, *flags)
    assert res.returncode == 0, failure_text(res)
    assert "ZeRO stage 3, lora r=16 on all-linear" in res.stdout + res.stderr
    first = read_metrics(out)
    assert [r["step"] for r in first] == [1, 2, 3]
    # the checkpoint holds each rank's adapter partition and optimizer state, no base weights
    states = out / "checkpoint-2" / "pytorch_model" / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    saved = torch.load(states, weights_only=False)
    assert saved["frozen_param_fragments"] is None  # DeepSpeed's exclude_frozen_parameters
    base = {key: t for key, t in saved["module"].items() if ".lora_" not in key}
    assert all(t.numel() == 0 for t in base.values()), sorted(base)  # only the tied head's name

    adapter = load_file(out / "final" / "adapter_model.safetensors")
    assert len(adapter) == 2 * 7 * 2  # A and B on 7 linear layers x 2 blocks
    assert adapter["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (
        16,
        64,
    )  # gathered: a ZeRO-3 partition would be empty
    assert all(t.abs().max() > 0 for k, t in adapter.items() if "lora_B" in k)  # trained

    # resume from checkpoint-2 replays step 3 the same way
    res = launch(tiny["zero3"], "sft", out, *flags, "--resume-from", str(out / "checkpoint-2"))
    assert res.returncode == 0, failure_text(res)
    replayed = read_metrics(out)
    assert replayed[2]["loss"] == pytest.approx(first[2]["loss"], abs=1e-6)

    # the adapter loads on its base (in this process: no distributed state here) and acts
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny["model"])
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        before = base(ids).logits
        tuned = PeftModel.from_pretrained(base, out / "final")(ids).logits
    assert (tuned - before).abs().max() > 1e-5


def base_reference_logprobs(tiny, steps: int) -> list[tuple[float, float]]:
    """Mean (chosen, rejected) log-probs of each step's pairs under the untouched base model,
    with the recipe's own data order, tokenization and scoring."""
    import torch

    dpo = load_recipe("dpo")
    import common  # recipes/common.py, on sys.path once a recipe is loaded

    args = dpo.parse_args(["--model", str(tiny["model"]), "--output-dir", "unused"])
    tok = common.load_tokenizer(args)
    base = common.load_model(args, tok).eval()
    pairs = [dpo.tokenize_pair(tok, row, args) for row in dpo.toy_rows()]
    means = []
    for step in range(1, steps + 1):
        picked = []
        for rank in range(2):  # micro-batch 2 x accumulation 2 pairs per rank
            picked += common.rank_indices(step, len(pairs), 4, 2, rank, args.seed)
        batch = dpo.collate_pairs([pairs[i] for i in picked], tok.pad_token_id, "cpu")
        with torch.no_grad():
            chosen, rejected = dpo.sequence_logprobs(base, batch).chunk(2)
        means.append((float(chosen.mean()), float(rejected.mean())))
    return means


@pytest.mark.distributed
def test_zero2_dpo_lora_reference_is_the_base_and_merged_save(tiny, tmp_path):
    out = tmp_path / "run"
    flags = ("--finetuning", "lora", "--model", str(tiny["model"]), "--max-steps", "3")
    res = launch(tiny["zero2"], "dpo", out, *flags, "--save-every", "0", "--merge-adapter")
    assert res.returncode == 0, failure_text(res)
    output = res.stdout + res.stderr
    assert "reference the base model (adapters disabled)" in output
    assert "final model, adapter merged," in output
    rows = read_metrics(out)
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)  # B starts at 0: policy = ref
    assert rows[-1]["reward_margin"] != 0  # the adapters moved the policy away from the reference
    for row, (chosen, rejected) in zip(rows, base_reference_logprobs(tiny, 3), strict=True):
        assert row["ref_logp_chosen"] == pytest.approx(chosen, rel=1e-4), row["step"]
        assert row["ref_logp_rejected"] == pytest.approx(rejected, rel=1e-4), row["step"]
    assert not (out / "final" / "adapter_config.json").exists()
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out / "final").state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny["model"]).state_dict()
    assert set(merged) == set(base)  # a plain model's weights, no peft names
    assert max((merged[k] - base[k]).abs().max() for k in base) > 1e-5  # the adapter merged in


def test_qlora_grpo_single_process_on_cpu(tiny, tmp_path):
    """bitsandbytes quantizes the saved tiny model to NF4 on load; GRPO samples with it, takes
    the KL to the adapter-disabled base and checkpoints the adapters only."""
    from safetensors import safe_open

    out = tmp_path / "run"
    cmd = [sys.executable, str(RECIPES / "grpo.py"), "--output-dir", str(out)]
    cmd += ["--finetuning", "qlora", "--model", str(tiny["model"]), "--beta", "0.1"]
    cmd += ["--max-steps", "2", "--save-every", "1", "--per-device-batch-size", "8"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_LIMIT)
    assert res.returncode == 0, failure_text(res)
    assert "qlora r=16 on all-linear" in res.stdout + res.stderr
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["kl"] == 0 and rows[1]["kl"] > 0  # the reference is the base, the policy moved
    with safe_open(out / "checkpoint-1" / "model.safetensors", "pt") as saved:
        assert lora_keys_only(list(saved.keys()))
    config = json.loads((out / "final" / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["base_model_name_or_path"] == str(tiny["model"])


def test_merge_matches_peft(tmp_path):
    """lora.merge_lora_weights (what --merge-adapter saves, from any ZeRO stage's gathered
    state dict) gives the weights of peft's own merge_and_unload."""
    import torch

    load_recipe("sft")  # puts recipes/ on sys.path, as a recipe run does
    import common
    import lora
    from peft import LoraConfig, get_peft_model

    tok = common.build_tiny_tokenizer()
    config = LoraConfig(r=4, lora_alpha=12, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(common.build_tiny_model(tok), config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()
    merged = lora.merge_lora_weights(model.state_dict(), 12 / 4)
    expected = model.merge_and_unload().state_dict()
    assert set(merged) == set(expected)
    for name, tensor in expected.items():
        assert torch.allclose(merged[name], tensor, atol=1e-6), name


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--lora-rank", "8"], "sft.py: lora_rank: is set but --finetuning is full"),
        (["--finetuning", "dora"], "sft.py: finetuning: 'dora' is not one of full, lora, qlora"),
        (["--finetuning", "lora", "--lora-dropout", "1"], "sft.py: lora_dropout: 1.0 is outside"),
        (["--finetuning", "lora", "--lora-targets", "q_proj,"], "has an empty name"),
        (["--finetuning", "qlora", "--merge-adapter"], "cannot merge into a 4-bit base"),
    ],
)
def test_lora_flags_refused_in_one_line(capsys, tmp_path, flags, expected):
    sft = load_recipe("sft")
    line = one_line_error(capsys, lambda: sft.parse_args(["--output-dir", str(tmp_path), *flags]))
    assert expected in line and "(fix: " in line


def test_adapter_only_checkpoints_of_a_ddp_model_keep_the_adapters(monkeypatch):
    """Under DDP accelerate hands the save hook the module's keys without DDP's `module.`; the
    hook matched them against the wrapper's names and saved an empty model.safetensors (a
    resumed DDP LoRA run restarted from zero adapters). A real DDP wrapper in a 1-process gloo
    group; the accelerator's unwrap is accelerate's own extract_model_from_parallel."""
    import torch
    import torch.distributed as dist
    from accelerate.utils import extract_model_from_parallel

    load_recipe("sft")  # puts recipes/ on sys.path
    import common
    import lora
    from peft import LoraConfig, get_peft_model

    class Accelerator:  # what adapter_only_checkpoints uses of accelerate's Accelerator
        state = type("State", (), {"deepspeed_plugin": None})()

        def __init__(self):
            self.hooks = []

        def unwrap_model(self, model):
            return extract_model_from_parallel(model)

        def register_save_state_pre_hook(self, hook):
            self.hooks.append(hook)

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        config = LoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM")
        model = get_peft_model(common.build_tiny_model(common.build_tiny_tokenizer()), config)
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        accelerator = Accelerator()
        save_kwargs, load_kwargs = lora.adapter_only_checkpoints(accelerator, wrapped)
        adapters = {name for name, param in model.named_parameters() if param.requires_grad}
        for prefix in ("", "module."):
            weights = [{prefix + key: t for key, t in model.state_dict().items()}]
            accelerator.hooks[0]([wrapped], weights, "unused")
            assert set(weights[0]) == {prefix + name for name in adapters}
        assert (save_kwargs, load_kwargs) == ({}, {"strict": False})
    finally:
        dist.destroy_process_group()


class FakeAccelerator:
    """What load_policy reads of accelerate's Accelerator: the mixed precision (the DeepSpeed
    JSON's bf16 block sets it) and whether a DeepSpeed plugin runs; stage 0 here, no DeepSpeed."""

    def __init__(self, mixed_precision: str):
        self.mixed_precision = mixed_precision
        self.state = type("State", (), {"deepspeed_plugin": None})()


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_qlora_model_holds_the_dtypes_the_estimate_counts(tmp_path, precision):
    """The recipe's QLoRA model without DeepSpeed, as built for training: the embedding, norms
    and LM head stay in the dtype `zerofit estimate` counts for them (TrainSetup.weight_dtype,
    memory/lora.py frozen_base_bytes), the adapters in adapter_element_bytes, and one training
    step reaches the adapters through gradient checkpointing. peft's
    prepare_model_for_kbit_training had cast every non-quantized parameter to fp32 (twice the
    bytes of the bf16 base's rest the estimate counts), as TRL's trainers do not."""
    import torch
    from bitsandbytes.nn import Params4bit

    from zerofit.memory import lora as lora_memory
    from zerofit.memory.estimate import DTYPE_BYTES, TrainSetup

    sft = load_recipe("sft")
    import common

    args = sft.parse_args(
        ["--output-dir", str(tmp_path), "--finetuning", "qlora", "--gradient-checkpointing"]
    )
    tokenizer = common.build_tiny_tokenizer()
    model = common.load_policy(args, tokenizer, FakeAccelerator(precision))
    setup = TrainSetup(stage=0, precision=precision, finetuning="qlora")
    base_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[setup.weight_dtype]
    adapter_bytes = lora_memory.adapter_element_bytes(setup, DTYPE_BYTES[precision])

    frozen = {n: p.dtype for n, p in model.named_parameters() if not p.requires_grad}
    quantized = {n for n, p in model.named_parameters() if isinstance(p, Params4bit)}
    unquantized = {n: dtype for n, dtype in frozen.items() if n not in quantized}
    assert any("embed_tokens" in n for n in unquantized) and any("norm" in n for n in unquantized)
    assert set(unquantized.values()) == {base_dtype}, unquantized
    adapters = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert adapters and all(".lora_" in n for n in adapters)
    assert {p.element_size() for p in adapters.values()} == {adapter_bytes}

    model.train()
    ids = torch.randint(3, len(tokenizer), (2, 12))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    # B starts at zero, so A's first gradient is zero; B's is not
    up = [param for name, param in adapters.items() if "lora_B" in name]
    assert up and all(param.grad is not None and param.grad.abs().sum() > 0 for param in up)


@pytest.mark.parametrize(
    ("finetuning", "precision"),
    [("lora", "bf16"), ("lora", "fp16"), ("lora", "fp32"), ("full", "bf16")],
    ids=["lora-bf16", "lora-fp16", "lora-fp32", "full-bf16"],
)
def test_model_without_deepspeed_holds_the_weight_dtype_the_estimate_counts(
    tmp_path, finetuning, precision
):
    """The recipe's plain-LoRA or full model without DeepSpeed, loaded from a saved fp32 model:
    a LoRA run's frozen base in TrainSetup.weight_dtype (the run's 16-bit compute dtype, as
    LLaMA-Factory, axolotl and ms-swift load it; an fp32 copy had cost 2 bytes more per base
    parameter than `zerofit estimate --finetuning lora` counts), its adapters in
    adapter_element_bytes (peft's fp32 upcast), and a full fine-tune's weights in fp32 (its
    master weights). The tiny model without --model gets the same dtype."""
    import torch

    from zerofit.memory import lora as lora_memory
    from zerofit.memory.estimate import DTYPE_BYTES, TrainSetup

    sft = load_recipe("sft")
    import common

    model_dir = save_tiny_model(tmp_path / "model")
    flags = ["--output-dir", str(tmp_path / "out"), "--finetuning", finetuning]
    args = sft.parse_args([*flags, "--model", str(model_dir)])
    tokenizer = common.build_tiny_tokenizer()
    model = common.load_policy(args, tokenizer, FakeAccelerator(precision))
    setup = TrainSetup(stage=0, precision=precision, finetuning=finetuning)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    base_dtype = dtypes[setup.weight_dtype]

    base = {n: p.dtype for n, p in model.named_parameters() if ".lora_" not in n}
    assert base and set(base.values()) == {base_dtype}, base
    if finetuning == "full":
        assert all(p.requires_grad for p in model.parameters())
        return
    assert not any(p.requires_grad for n, p in model.named_parameters() if n in base)
    adapters = [p for p in model.parameters() if p.requires_grad]
    adapter_bytes = lora_memory.adapter_element_bytes(setup, DTYPE_BYTES[precision])
    assert adapters and {p.element_size() for p in adapters} == {adapter_bytes}

    # one training step under the autocast accelerate runs without DeepSpeed reaches the adapters
    model.train()
    ids = torch.randint(3, len(tokenizer), (2, 12))
    with torch.autocast("cpu", dtype=dtypes[precision], enabled=precision != "fp32"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    # B starts at zero, so A's first gradient is zero; B's is not
    up = [param for name, param in model.named_parameters() if "lora_B" in name]
    assert up and all(param.grad is not None and param.grad.abs().sum() > 0 for param in up)

    tiny_args = sft.parse_args(flags)
    tiny = common.load_policy(tiny_args, tokenizer, FakeAccelerator(precision))
    assert {p.dtype for n, p in tiny.named_parameters() if ".lora_" not in n} == {base_dtype}
