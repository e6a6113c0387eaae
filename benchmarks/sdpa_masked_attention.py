"""What a padding mask costs PyTorch's SDPA on a GPU: the same causal attention timed three ways.

zerofit's speed model counts a decoder's attention products for the causal half only where the
kernel skips the masked blocks (flash kernel, ``is_causal=True`` and no mask) and for the whole
square where it cannot: a padded batch, for which transformers hands SDPA a 4D boolean mask and
``is_causal=False`` (``speed/step_time.py: attention_skips_masked_blocks``). This times, forward
and backward, bf16:

- ``causal``: ``is_causal=True``, no mask (what an unpadded batch gets);
- ``padded``: the causal mask with the last 10 % of each row's keys masked as padding, as a 4D
  boolean ``attn_mask`` and ``is_causal=False`` (what a padded batch gets);
- ``full``: no mask, not causal (the whole square, for scale).

If the model is right, ``padded`` costs at least what ``full`` costs, about twice ``causal``.

One run on a lent H200 (torch 2.11.0+cu130; batch 4, 32 heads of 128; median of 10, seconds):

| seq | causal | padded | full | padded / causal | full / causal |
|---|---|---|---|---|---|
| 1024 | 0.000482 | 0.001031 | 0.000760 | 2.14 | 1.58 |
| 4096 | 0.003825 | 0.012777 | 0.006885 | 3.34 | 1.80 |
| 8192 | 0.015157 | 0.048792 | 0.028464 | 3.22 | 1.88 |

The padded rows cost more than the whole square: the masked call runs the memory-efficient
kernel, which reaches 0.54-0.74 of the flash kernel's rate on the same square (full / padded).

Run on a GPU:  python benchmarks/sdpa_masked_attention.py [--seq 4096 --batch 4]
CPU dry run:   python benchmarks/sdpa_masked_attention.py --device cpu --seq 256 --heads 4
"""

from __future__ import annotations

import argparse
import json
import time


def timed(fn, device: str, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after two warm-up runs."""
    import statistics

    import torch

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(2):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def padded_causal_mask(batch: int, seq: int, device: str):
    """(batch, 1, seq, seq) booleans: causal, and the last tenth of the keys are padding."""
    import torch

    causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    keys_kept = torch.arange(seq, device=device) < seq - seq // 10
    # right padding under a causal mask leaves no query row empty (each sees key 0)
    mask = causal[None, None] & keys_kept[None, None, None, :]
    return mask.expand(batch, 1, seq, seq)


def measure(args) -> dict:
    """Forward + backward seconds of each variant, and their ratios to ``causal``."""
    import torch
    import torch.nn.functional as F

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    shape = (args.batch, args.heads, args.seq, args.head_dim)
    q, k, v = (
        torch.randn(shape, device=args.device, dtype=dtype, requires_grad=True) for _ in range(3)
    )
    grad = torch.randn(shape, device=args.device, dtype=dtype)
    mask = padded_causal_mask(args.batch, args.seq, args.device)

    def step(**kwargs) -> None:
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        out.backward(grad)
        q.grad = k.grad = v.grad = None

    seconds = {
        "causal": timed(lambda: step(is_causal=True), args.device, args.repeats),
        "padded": timed(lambda: step(attn_mask=mask, is_causal=False), args.device, args.repeats),
        "full": timed(lambda: step(is_causal=False), args.device, args.repeats),
    }
    return {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": list(shape),
        "seconds": {name: round(value, 6) for name, value in seconds.items()},
        "padded_over_causal": round(seconds["padded"] / seconds["causal"], 3),
        "full_over_causal": round(seconds["full"] / seconds["causal"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seq", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    for seq in args.seq:
        print(json.dumps(measure(argparse.Namespace(**{**vars(args), "seq": seq}))), flush=True)


if __name__ == "__main__":
    main()
