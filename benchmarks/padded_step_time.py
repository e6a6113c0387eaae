"""A whole training step padded against unpadded under SDPA: the measured ratio beside zerofit's.

A random-init Qwen2.5-0.5B (benchmarks/model_shapes.py), bf16 weights, SDPA attention, a plain
loop with torch's AdamW (zerofit's ``accelerate`` stack), micro batch 2, no checkpointing. Each
step is forward + backward + optimizer step, timed as the median of a few after warm-ups, twice
per sequence length:

- ``unpadded``: no attention mask (transformers drops it and runs SDPA causal: flash);
- ``padded``: an attention mask whose rows end in about 10 % padding (what a padding collator
  gives), labels -100 there; transformers passes SDPA a 4D boolean mask and ``is_causal=False``,
  which runs the memory-efficient kernel over the whole square.

``predicted_ratio`` is ``estimate_step_time``'s total for the matching ``TrainSetup`` with
``padded`` True over False, on the catalog entry of the GPU that ran it. Where zerofit is not
importable on the GPU machine the rows carry timings only; ``--annotate`` adds the predictions.

Two runs on a lent H200 (torch 2.11.0+cu130, transformers 5.17.0; median of 6 steps after 3
warm-ups, seconds), zerofit's prediction for the H200:

| seq | run | unpadded | padded | measured ratio | predicted ratio |
|---|---|---|---|---|---|
| 4096 | 1 | 0.1126 | 0.1448 | 1.287 | 1.036 |
| 4096 | 2 | 0.1129 | 0.1405 | 1.245 | 1.036 |
| 1024 | 1 | 0.1021 | 0.1104 | 1.081 | 1.003 |
| 1024 | 2 | 0.0871 | 0.1101 | 1.265 | 1.003 |

The prediction is off on both sides of the ratio: its unpadded step is 0.240 s (0.057 s of
compute, 0.180 s of fixed per-step overhead fitted on other runs) against 0.113 s measured, and
its padded extra at 4096 is 0.0086 s (the other half of the square at the step's rate) against
0.028-0.032 s measured. Counting the masked kernel's rate (cuDNN's, 0.53-0.59 of its unmasked
rate: benchmarks/sdpa_masked_attention.py) would make that extra about 0.023 s, the ratio
still only about 1.09; at 1024 the measured extra (0.008-0.023 s between two runs) is noisy and
far above any attention term (0.0016 s with that rate), so padding costs the step more than
its attention kernel. Neither supports one constant, and the speed model adds none.

Run on a GPU:  python benchmarks/padded_step_time.py --out results.jsonl
Predictions:   python benchmarks/padded_step_time.py --annotate results.jsonl
CPU dry run:   python benchmarks/padded_step_time.py --device cpu --tiny --seq 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_shapes import QWEN25_05B  # noqa: E402

MICRO_BATCH = 2
PADDED_SHARE = 0.10
# a tiny shape of the same family, for the CPU dry run
TINY_SHAPE = dict(
    QWEN25_05B,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
)


def build_model(shape: dict, device: str):
    """A random-init Qwen2 causal LM of ``shape`` in bf16 with SDPA attention, on ``device``."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model("qwen2", **shape, use_cache=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation="sdpa"
        )
    return model


def build_batch(vocab: int, seq: int, padded: bool, device: str) -> dict:
    """Random tokens; padded rows end in about ``PADDED_SHARE`` padding (the second row a little
    less, as a collator's rows differ), masked out of attention and of the loss."""
    import torch

    input_ids = torch.randint(0, vocab, (MICRO_BATCH, seq), device=device)
    labels = input_ids.clone()
    batch = {"input_ids": input_ids, "labels": labels}
    if padded:
        mask = torch.ones(MICRO_BATCH, seq, dtype=torch.long, device=device)
        for row in range(MICRO_BATCH):
            pads = max(1, int(seq * PADDED_SHARE * (1 - 0.5 * row / MICRO_BATCH)))
            mask[row, seq - pads :] = 0
        labels[mask == 0] = -100
        batch["attention_mask"] = mask
    return batch


def time_steps(model, optimizer, batch: dict, device: str, warmup: int, steps: int) -> float:
    """Median seconds of forward + backward + optimizer step."""
    import torch

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    samples = []
    for index in range(warmup + steps):
        sync()
        start = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        if index >= warmup:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(args) -> list[dict]:
    """One row per sequence length: padded and unpadded step seconds and their ratio."""
    import torch
    import transformers

    shape = TINY_SHAPE if args.tiny else QWEN25_05B
    model = build_model(shape, args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    rows = []
    for seq in args.seq:
        seconds = {}
        for padded in (False, True):
            batch = build_batch(shape["vocab_size"], seq, padded, args.device)
            key = "padded" if padded else "unpadded"
            seconds[key] = time_steps(model, optimizer, batch, args.device, args.warmup, args.steps)
        rows.append(
            {
                "device": name,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "shape": "tiny" if args.tiny else "qwen2.5-0.5b",
                "micro_batch": MICRO_BATCH,
                "seq": seq,
                "unpadded_s": round(seconds["unpadded"], 5),
                "padded_s": round(seconds["padded"], 5),
                "measured_ratio": round(seconds["padded"] / seconds["unpadded"], 3),
            }
        )
    return rows


def predicted_seconds(row: dict, padded: bool) -> float:
    """zerofit's step seconds for ``row``'s setup on its GPU's catalog entry."""
    from zerofit.hardware import lookup, match_gpu_name
    from zerofit.memory.estimate import TrainSetup
    from zerofit.models.resolve import resolve_model
    from zerofit.speed.step_time import estimate_step_time

    gpu = lookup(match_gpu_name(row["device"]) or "H100-SXM")
    setup = TrainSetup(
        stage=0,
        micro_batch=row["micro_batch"],
        seq_len=row["seq"],
        gradient_checkpointing=False,
        attention="sdpa",
        padded=padded,
        gpu=gpu.key,
    )
    return estimate_step_time(setup, resolve_model("qwen2.5-0.5b"), gpu).total_s


def with_prediction(row: dict) -> dict:
    """``row`` with zerofit's padded and unpadded step seconds and their ratio."""
    unpadded = predicted_seconds(row, padded=False)
    padded = predicted_seconds(row, padded=True)
    return {
        **row,
        "predicted_unpadded_s": round(unpadded, 5),
        "predicted_padded_s": round(padded, 5),
        "predicted_ratio": round(padded / unpadded, 3),
    }


def annotate(path: Path) -> None:
    """Rewrite a results file with zerofit's predictions beside each row, and print them."""
    rows = [with_prediction(json.loads(line)) for line in path.read_text().splitlines() if line]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    for row in rows:
        measured, predicted = row["measured_ratio"], row["predicted_ratio"]
        print(f"seq {row['seq']}: measured {measured}, predicted {predicted}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--seq", type=int, nargs="+", default=[4096, 1024])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tiny", action="store_true", help="a tiny shape (CPU dry run)")
    parser.add_argument("--out", type=Path, help="write the rows here as JSON lines")
    parser.add_argument("--annotate", type=Path, help="add zerofit's predictions to a file")
    args = parser.parse_args()
    if args.annotate:
        annotate(args.annotate)
        return
    rows = measure(args)
    for row in rows:
        try:
            row = with_prediction(row)
        except ImportError as error:  # zerofit's deps absent on the GPU machine: --annotate
            row["predicted_error"] = str(error)
        print(json.dumps(row), flush=True)
        if args.out:
            with args.out.open("a") as out:
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
