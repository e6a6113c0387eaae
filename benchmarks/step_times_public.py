"""zerofit's speed model (src/zerofit/speed/) against public step-time measurements.

Reads tests/data/step_times_public.jsonl (tests/data/step_times_public.md says what each field
means) and the H100 calibration runs (tests/data/mem_h100_qwen2.5-0.5b.jsonl), predicts every row
the model can express, and prints:

- why each left-out row is left out, counted by reason;
- the median absolute % error of the predicted step time (or tokens/s per GPU, or model TFLOPs
  per GPU: whatever the row measured), per source and overall;
- Kendall's tau-b of predicted against measured speed (tokens per second per GPU) inside each
  scenario with two or more predicted rows, and `plan`'s pick rate: how often the configuration
  predicted fastest (what `zerofit plan` picks among fits) is measured fastest or within 5 % of
  it, beside the baseline, the fixed speed order the planner used before the speed model (no
  parameter offload, no optimizer offload, not ZeRO-3, no checkpointing, the lower stage, the
  larger micro batch; ``fixed_order_key``). Where that order cannot tell a scenario's fastest
  rows apart (they differ in what it never looked at: the network, the GPU count, the sequence
  length), its pick is the first of them in the file, and the table counts those scenarios.

Nothing here is tuned per row: the model's constants are speed/step_time.py's named ones.

Run: .venv/bin/python benchmarks/step_times_public.py [--limit N]   (a few seconds)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from zerofit.errors import ZerofitError
from zerofit.hardware import GpuSpec, lookup
from zerofit.memory.estimate import TrainSetup
from zerofit.models.resolve import ModelSpec, resolve_model, spec_from_config
from zerofit.speed.step_time import DEFAULT_INTER_NODE_GBITS, estimate_step_time, gpu_profile

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ROOT / "tests" / "data" / "step_times_public.jsonl"
CALIBRATION = ROOT / "tests" / "data" / "mem_h100_qwen2.5-0.5b.jsonl"


def _llama(hidden: int, inter: int, layers: int, heads: tuple[int, int], vocab: int) -> dict:
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads[0],
        "num_key_value_heads": heads[1],
        "vocab_size": vocab,
        "tie_word_embeddings": False,
    }


def _qwen1(hidden: int, inter: int, layers: int, heads: int, vocab: int) -> dict:
    return {
        "model_type": "qwen",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "kv_channels": hidden // heads,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "no_bias": True,
    }


# The rows' models that zerofit has no built-in shape for: their config.json fields on the hub
# (Qwen/Qwen-{1_8B,7B,14B,72B}, meta-llama/Llama-2-{7b,70b}-hf, meta-llama/Meta-Llama-3-{8B,70B},
# 01-ai/Yi-34B-200K, Qwen/Qwen2-1.5B); built-in names otherwise. Models the rows leave vague
# ("1T-parameter GPT-style model"), encoder-decoders (t5) and vision-language models (their
# vision tower is not a decoder) are absent, so their rows are left out.
MODELS: dict[str, dict | str] = {
    "Qwen-1.8B": _qwen1(2048, 11008, 24, 16, 151936),
    "Qwen-7B": _qwen1(4096, 22016, 32, 32, 151936),
    "Qwen-14B": _qwen1(5120, 27392, 40, 40, 152064),
    "Qwen-72B": _qwen1(8192, 49152, 80, 64, 152064),
    "meta-llama/Llama-2-7b": _llama(4096, 11008, 32, (32, 32), 32000),
    "meta-llama/Llama-2-7b-hf": _llama(4096, 11008, 32, (32, 32), 32000),
    "meta-llama/Llama-2-70b-hf": _llama(8192, 28672, 80, (64, 8), 32000),
    "meta-llama/Meta-Llama-3-8B": _llama(4096, 14336, 32, (32, 8), 128256),
    "meta-llama/Meta-Llama-3-8B-Instruct": _llama(4096, 14336, 32, (32, 8), 128256),
    "meta-llama/Meta-Llama-3-70B": _llama(8192, 28672, 80, (64, 8), 128256),
    "meta-llama/Llama-3.3-70B-Instruct": _llama(8192, 28672, 80, (64, 8), 128256),
    "01-ai/Yi-34B-200K": _llama(7168, 20480, 60, (56, 8), 64000),
    "Qwen/Qwen2-1.5B": "qwen2.5-1.5b",  # the same config.json shape as Qwen2.5-1.5B
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.2-3B-Instruct": "llama-3.2-3b",
    "Qwen/Qwen2.5-1.5B": "qwen2.5-1.5b",
    "Qwen/Qwen2.5-3B": "qwen2.5-3b",
    "Qwen/Qwen2.5-7B": "qwen2.5-7b",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b",
    "Qwen/Qwen2.5-14B": "qwen2.5-14b",
    "Qwen/Qwen2.5-32B": "qwen2.5-32b",
    "Qwen/Qwen3-30B-A3B-Base": "qwen3-30b-a3b",
}

# gpu_norm spellings of the data -> catalog keys. "H100-96GB-HBM2e" (torchtitan's H100 with 96 GB
# HBM2e) has the SXM part's 989 dense TFLOPs and NVLink; only its HBM differs, which the model
# uses for the optimizer step alone.
GPU_KEYS = {
    "A100-80GB": "A100-80GB",
    "A100-40GB": "A100-40GB",
    "A800-80GB": "A800",
    "H100-SXM": "H100-SXM",
    "H100-96GB-HBM2e": "H100-SXM",
    "H20-96GB": "H20",
    "H200": "H200",
    "B200": "B200",
    "A10": "A10",
    "A40-48GB": "A40",
    "V100-32GB": "V100-32GB",
}

NEEDED = (
    "stage",
    "micro_batch",
    "grad_accum",
    "seq_len",
    "gradient_checkpointing",
    "precision",
    "gpus_per_node",
    "nodes",
    "offload_optimizer",
    "offload_param",
)
# options that change how a step runs in ways the model does not know
UNMODELED_OPTIONS = (
    "tensor_parallel",
    "pipeline_parallel",
    "context_parallel",
    "expert_parallel",
    "sequence_parallel",
    "torch_compile",
    "zenflow",
)
# the rows' attention kernels as transformers names them (speed/step_time.py times
# FlashAttention-3 apart; the others run at the fitted efficiency)
ATTENTION_KERNELS = {
    "flash": "flash_attention_2",
    "flash3": "flash_attention_3",
    "sdpa": "sdpa",
    "eager": "eager",
}
# The DeepSpeed release each source's runs paid ZeRO-3's hooks at (speed/step_time.py
# ``STAGE3_HOOK_COST_BY_DEEPSPEED``: 0.12's module hooks cost half of 0.19's), by the source's
# date where it names no version: the Qwen README's profiling table came with Qwen-1.8B and
# Qwen-72B (30 Nov 2023), when 0.12 was DeepSpeed's release; ms-swift's docs at the stored
# commit time Qwen3 models (2025), on 0.16. Every other source (our H100 calibration, torchtitan's
# FSDP) is 0.19's or runs no ZeRO-3.
DEEPSPEED_OF_SOURCE = {"QwenLM/Qwen": "0.12", "modelscope/ms-swift": "0.16"}
LORA_TRAINABLE_SHARE = 0.01  # LoRA adapters: ~1 % of the weights (rank 64 on every projection)


@dataclass(frozen=True)
class Expressed:
    """A row as the model's inputs."""

    setup: TrainSetup
    model: ModelSpec
    gpu: GpuSpec
    inter_node_gbps: float
    trainable: int | None
    assumed_network: bool
    # the mean tokens of the samples packed into each row, where the source states it (the
    # row's options.avg_sample_len); None: the row's attention spans it whole
    sample_len: int | None = None


@dataclass(frozen=True)
class Prediction:
    row_id: str
    source: str
    scenario: str
    quantity: str  # step_s, tokens_per_s_per_gpu or tflops_per_gpu
    measured: float
    predicted: float
    measured_speed: float  # tokens/s per GPU (or TFLOPs per GPU): higher is faster
    predicted_speed: float
    fixed_order: tuple = ()  # the old planner's sort key of the row's configuration

    @property
    def error_pct(self) -> float:
        return 100 * (self.predicted - self.measured) / self.measured


def source_name(url: str) -> str:
    """A short name: owner/repo and the issue, pull request or file."""
    parts = url.split("github.com/")[-1].split("#")[0].split("/")
    if len(parts) >= 4 and parts[2] in ("issues", "pull"):
        return f"{parts[0]}/{parts[1]}#{parts[3]}"
    return f"{parts[0]}/{parts[1]}:{parts[-1]}"


def row_model(name: str) -> ModelSpec | None:
    entry = MODELS.get(name)
    if entry is None:
        return None
    if isinstance(entry, str):
        return resolve_model(entry)
    return spec_from_config(entry, name)


def inter_node_gbits(setup: dict) -> tuple[float | None, bool]:
    """The node's network in Gbit/s from the row's ``interconnect`` text, and whether it was
    assumed (the row does not say: zerofit's default)."""
    text = (setup.get("interconnect") or "").lower()
    if not text or text == "roce":
        return DEFAULT_INTER_NODE_GBITS, True
    if "disable" in text:
        return None, False  # NCCL's socket transport on an unstated NIC
    match = re.search(r"(\d+)\s*gb", text)
    if match is None:
        return DEFAULT_INTER_NODE_GBITS, True
    gbits = float(match.group(1))
    if "per gpu" in text:
        gbits *= setup["gpus_per_node"]
    return gbits, False


def why_not_expressible(row: dict) -> str | None:
    """The reason a row is left out, or None."""
    setup = row["setup"]
    lacking = [name for name in NEEDED if setup.get(name) is None]
    if lacking:
        return "setup lacks " + lacking[0]
    if setup["gpu_norm"] not in GPU_KEYS:
        return "GPU not in zerofit's catalog or unnamed"
    if row_model(setup["model"]) is None:
        return "model shape unknown (vague, encoder-decoder or vision-language)"
    if setup["precision"] not in ("bf16", "fp16"):
        return f"precision {setup['precision']} (the model knows 16-bit compute only)"
    if setup["tuning"] == "qlora":
        # every stored QLoRA row is the Qwen README's, whose finetune.py loads the GPTQ Int4
        # checkpoints (GPTQConfig(bits=4, disable_exllama=True)): auto-gptq's kernels
        return "QLoRA on a GPTQ Int4 checkpoint (zerofit models bitsandbytes NF4)"
    if setup["workload"] not in ("sft", "pretrain", "dpo"):
        return "workload without a training-only step"
    options = setup.get("options") or {}
    for name in UNMODELED_OPTIONS:
        value = options.get(name)
        if value is True or (not isinstance(value, bool) and (value or 0) > 1):
            return f"{name} (the model knows data parallelism and eager PyTorch only)"
    if inter_node_gbits(setup)[0] is None:
        return "network unstated (NCCL sockets)"
    return None


def express(row: dict) -> Expressed:
    setup = row["setup"]
    model = row_model(setup["model"])
    gpus_per_node = setup["gpus_per_node"]
    train_setup = TrainSetup(
        stage=setup["stage"],
        world_size=gpus_per_node * setup["nodes"],
        gpus_per_node=gpus_per_node,
        offload_optimizer=setup["offload_optimizer"],
        offload_param=setup["offload_param"],
        precision=setup["precision"],
        gradient_checkpointing=setup["gradient_checkpointing"],
        micro_batch=setup["micro_batch"],
        seq_len=setup["seq_len"],
        grad_accum=setup["grad_accum"],
        workload=setup["workload"],
        attention=ATTENTION_KERNELS.get(setup.get("attention"), "sdpa"),
        # padded stays False (TrainSetup's default): no expressible row records a padding mask;
        # under SDPA or eager a padded batch's attention would count its whole seq x seq square
        # (speed/step_time.py ``attention_skips_masked_blocks``); the expressible SDPA rows are
        # torchtitan's pretraining, documents concatenated into full rows: nothing to pad
    )
    trainable = None
    if setup["tuning"] in ("lora", "lora-emb"):
        # PEFT's LoRA path (speed/step_time.py ``adapter_elementwise_seconds``): the rows'
        # scripts adapt every projection, with dropout (TrainSetup's default)
        train_setup = dataclasses.replace(train_setup, finetuning="lora")
        trainable = int(model.params * LORA_TRAINABLE_SHARE)
        if setup["tuning"] == "lora-emb" or (setup.get("options") or {}).get(
            "lora_trains_embeddings"
        ):
            trainable += 2 * model.vocab_size * model.hidden_size
    gbits, assumed = inter_node_gbits(setup)
    multi_node = setup["nodes"] > 1
    return Expressed(
        train_setup,
        model,
        lookup(GPU_KEYS[setup["gpu_norm"]]),
        gbits,
        trainable,
        assumed and multi_node,
        packed_sample_len(setup),
    )


def packed_sample_len(setup: dict) -> int | None:
    """The stated mean length of the samples a packed or padding-free row holds
    (``options.avg_sample_len``, set only where the source states it and the row's samples
    attend within themselves); the speed model shrinks their attention under flash-attention
    (speed/step_time.py ``attention_sample_len``). None for every other row."""
    if setup.get("packing") not in ("packed", "padding_free"):
        return None
    return (setup.get("options") or {}).get("avg_sample_len")


def fixed_order_key(setup: TrainSetup) -> tuple:
    """The planner's speed order before the speed model (its ``Candidate.speed_key``, kept here
    only as the baseline): fastest first, no parameter offload, no optimizer offload, ZeRO-0/1/2
    before 3, no checkpointing, the lower stage, the larger micro batch. Its fragmentation rule
    (a tight fit later) needs memory the rows do not state, so it is left out."""
    return (
        setup.offload_param != "none",
        setup.offload_optimizer != "none",
        setup.stage == 3,
        setup.gradient_checkpointing,
        setup.stage,
        -setup.micro_batch,
    )


def tokens_per_gpu_step(setup: TrainSetup) -> int:
    sequences = 2 * setup.micro_batch if setup.workload == "dpo" else setup.micro_batch
    return sequences * setup.seq_len * setup.grad_accum


def deepspeed_of_row(row: dict) -> str:
    """The DeepSpeed release a row's run paid ZeRO-3's hooks at (``DEEPSPEED_OF_SOURCE``)."""
    for repository, version in DEEPSPEED_OF_SOURCE.items():
        if f"github.com/{repository}/" in row["source"]:
            return version
    return "0.19"


def predict(row: dict, expressed: Expressed) -> Prediction:
    step = estimate_step_time(
        expressed.setup,
        expressed.model,
        gpu_profile(expressed.gpu, deepspeed_of_row(row)),
        inter_node_gbps=expressed.inter_node_gbps,
        trainable_params=expressed.trainable,
        sample_len=expressed.sample_len,
    )
    measured = row["measured"]
    tokens = tokens_per_gpu_step(expressed.setup)
    if "step_s" in measured:
        quantity, value, predicted = "step_s", measured["step_s"], step.total_s
        measured_speed = tokens / value
    elif "tokens_per_s_per_gpu" in measured:
        quantity, value = "tokens_per_s_per_gpu", measured["tokens_per_s_per_gpu"]
        predicted = step.tokens_per_s_per_gpu
        measured_speed = value
    else:
        quantity, value = "tflops_per_gpu", measured["tflops_per_gpu"]
        predicted = step.mfu * expressed.gpu.bf16_tflops
        measured_speed = value
    predicted_speed = predicted if quantity != "step_s" else tokens / predicted
    return Prediction(
        row["id"],
        source_name(row["source"]),
        row["scenario"],
        quantity,
        value,
        predicted,
        measured_speed,
        predicted_speed,
        fixed_order_key(expressed.setup),
    )


def kendall_tau_b(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-b (ties in either list allowed); None where one list is all ties."""
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif dx * dy > 0:
                concordant += 1
            else:
                discordant += 1
    denominator = ((concordant + discordant + ties_x) * (concordant + discordant + ties_y)) ** 0.5
    return None if denominator == 0 else (concordant - discordant) / denominator


def calibration_predictions() -> list[Prediction]:
    """The H100 calibration runs (one GPU, Qwen2.5-0.5B's shape, torch AdamW as DeepSpeed's
    client optimizer): the last of each run's three steps, the first two being warm-up."""
    if not CALIBRATION.exists():
        return []
    model = resolve_model("qwen2.5-0.5b")
    gpu = lookup("H100-SXM")
    out = []
    for line in CALIBRATION.read_text().splitlines():
        point = json.loads(line)
        setup = TrainSetup(
            stage=point["stage"],
            offload_optimizer=point["offload"],
            gradient_checkpointing=point["gc"],
            micro_batch=point["mbs"],
            seq_len=point["seq"],
        )
        step = estimate_step_time(setup, model, gpu)
        measured = point["step_s"][-1]
        tokens = tokens_per_gpu_step(setup)
        row_id = f"z{point['stage']}-{point['offload']}-seq{point['seq']}-mbs{point['mbs']}"
        row_id += "-gc" if point["gc"] else ""
        out.append(
            Prediction(
                row_id,
                "zerofit H100 calibration",
                "h100-calibration",
                "step_s",
                measured,
                step.total_s,
                tokens / measured,
                tokens / step.total_s,
                fixed_order_key(setup),
            )
        )
    return out


def read_rows(limit: int | None) -> list[dict]:
    rows = [json.loads(line) for line in PUBLIC.read_text().splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def predict_rows(rows: list[dict]) -> tuple[list[Prediction], Counter, int]:
    """Predictions of every expressible row, the left-out rows' reasons, and how many rows took
    zerofit's default network because they span nodes without saying which."""
    predictions, left_out, assumed = [], Counter(), 0
    for row in rows:
        reason = why_not_expressible(row)
        if reason is not None:
            left_out[reason] += 1
            continue
        try:
            expressed = express(row)
        except ZerofitError as err:
            left_out[f"model did not resolve ({err})"] += 1
            continue
        assumed += expressed.assumed_network
        predictions.append(predict(row, expressed))
    return predictions, left_out, assumed


def median_abs_error(predictions: list[Prediction]) -> float:
    return statistics.median(abs(p.error_pct) for p in predictions)


def error_table(predictions: list[Prediction]) -> list[str]:
    by_source: dict[str, list[Prediction]] = defaultdict(list)
    for p in predictions:
        by_source[p.source].append(p)
    lines = [f"{'source':<66} {'rows':>4} {'median |err| %':>15}"]
    for source, group in sorted(by_source.items(), key=lambda item: -len(item[1])):
        lines.append(f"{source[:66]:<66} {len(group):>4} {median_abs_error(group):>15.0f}")
    lines.append(f"{'all rows':<66} {len(predictions):>4} {median_abs_error(predictions):>15.0f}")
    return lines


@dataclass(frozen=True)
class ScenarioScore:
    scenario: str
    rows: int
    tau: float | None
    picked_fastest: bool  # plan's pick (the predicted fastest) within 5 % of the measured fastest
    fixed_order_picked_fastest: bool  # the old fixed order's pick, the same test
    fixed_order_undecided: bool  # the old order ranks several rows first (picked: the first)


def score_scenarios(predictions: list[Prediction]) -> list[ScenarioScore]:
    """Kendall's tau and the fastest pick per scenario of two or more predicted rows."""
    by_scenario: dict[str, list[Prediction]] = defaultdict(list)
    for p in predictions:
        by_scenario[p.scenario].append(p)
    scores = []
    for scenario, group in sorted(by_scenario.items()):
        if len(group) < 2:
            continue
        measured = [p.measured_speed for p in group]
        predicted = [p.predicted_speed for p in group]
        pick = group[predicted.index(max(predicted))]
        picked_fastest = pick.measured_speed >= 0.95 * max(measured)
        first_key = min(p.fixed_order for p in group)
        fixed_firsts = [p for p in group if p.fixed_order == first_key]
        fixed_pick = fixed_firsts[0]
        scores.append(
            ScenarioScore(
                scenario,
                len(group),
                kendall_tau_b(predicted, measured),
                picked_fastest,
                fixed_pick.measured_speed >= 0.95 * max(measured),
                len(fixed_firsts) > 1,
            )
        )
    return scores


def scenario_table(scores: list[ScenarioScore]) -> list[str]:
    lines = [f"{'scenario':<44} {'rows':>4} {'tau':>6} {'plan picks':>11} {'old order':>10}"]
    for score in scores:
        tau = "n/a" if score.tau is None else f"{score.tau:+.2f}"
        picked = "yes" if score.picked_fastest else "no"
        old = ("yes" if score.fixed_order_picked_fastest else "no") + (
            "*" if score.fixed_order_undecided else ""
        )
        lines.append(
            f"{score.scenario[:44]:<44} {score.rows:>4} {tau:>6} {picked:>11} {old:>10}"
        )
    taus = [s.tau for s in scores if s.tau is not None]
    if scores:
        picks = sum(s.picked_fastest for s in scores)
        old_picks = sum(s.fixed_order_picked_fastest for s in scores)
        undecided = sum(s.fixed_order_undecided for s in scores)
        median_tau = f"{statistics.median(taus):+.2f}" if taus else "n/a"
        lines.append(
            f"{len(scores)} scenarios: median tau {median_tau}; plan's pick (the predicted "
            f"fastest): fastest picked (within 5 %) {picks}/{len(scores)} "
            f"({100 * picks / len(scores):.0f} %); the old fixed order's {old_picks}/{len(scores)} "
            f"({100 * old_picks / len(scores):.0f} %; * {undecided} scenarios it cannot order: "
            "its first row in the file)"
        )
    return lines


def report(predictions: list[Prediction], title: str) -> list[str]:
    if not predictions:
        return [f"== {title}: no rows"]
    lines = [f"== {title}: {len(predictions)} rows", *error_table(predictions), ""]
    return lines + scenario_table(score_scenarios(predictions))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N public rows")
    parser.add_argument("--rows", action="store_true", help="print every predicted row too")
    args = parser.parse_args(argv)
    rows = read_rows(args.limit)
    predictions, left_out, assumed = predict_rows(rows)
    left_out_count = len(rows) - len(predictions)
    print(f"public rows: {len(rows)}, predicted: {len(predictions)}, left out: {left_out_count}")
    for reason, count in left_out.most_common():
        print(f"  left out {count:>3}: {reason}")
    print(f"  {assumed} predicted rows span nodes without naming the network: "
          f"{DEFAULT_INTER_NODE_GBITS:.0f} Gbit/s per node assumed")
    print()
    print("\n".join(report(predictions, "public measurements")))
    print()
    calibration = calibration_predictions()
    print("\n".join(report(calibration, "H100 calibration runs (step_s, last of 3 steps)")))
    if args.rows:
        print()
        for p in predictions + calibration:
            print(
                f"{p.row_id[:48]:<48} {p.quantity:<20} measured {p.measured:>9.3f} "
                f"predicted {p.predicted:>9.3f} ({p.error_pct:+.0f} %)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
