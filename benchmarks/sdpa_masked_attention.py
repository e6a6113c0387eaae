"""What a padding mask costs PyTorch's SDPA on a GPU: each attention kernel's rate, apart.

zerofit's speed model counts a decoder's attention products for the causal half only where the
kernel skips the masked blocks (flash kernel, ``is_causal=True`` and no mask) and for the whole
square where it cannot: a padded batch, for which transformers hands SDPA a 4D boolean mask and
``is_causal=False`` (``speed/step_time.py: attention_skips_masked_blocks``). A mask rules out the
flash kernel, so the padded call also runs a different kernel, at its own rate. This sweep
times, forward and forward + backward, bf16, the kernel pinned with
``torch.nn.attention.sdpa_kernel`` where one is named:

- ``flash_causal``: flash, ``is_causal=True``, no mask (an unpadded batch);
- ``flash_full``: flash, no mask, not causal (the whole square);
- ``efficient_masked``: memory-efficient, the causal mask with the last 10 % of each row's keys
  masked as padding, a 4D boolean ``attn_mask``, ``is_causal=False`` (a padded batch);
- ``efficient_full``: memory-efficient, no mask, not causal;
- ``default_masked``, ``default_causal``, ``default_full``: the masked, causal and full calls
  with no kernel pinned (what transformers' calls dispatch to);
- ``cudnn_masked``: cuDNN attention pinned, with the mask.

Rates count FLOPs as speed/flops.py does: a multiply-add is 2 FLOPs, the two products Q K^T and
P V make a forward of ``4 * B * H * S^2 * D`` over the whole square (half that for
``flash_causal``), the backward twice the forward. ``masked_over_flash`` is the rate of
``efficient_masked`` over ``flash_full`` on the same square; ``default_masked_over_full`` the
rate of what the masked call dispatches to over the unmasked whole square's (``dispatched``
names the backends, torch's ``_fused_sdp_choice``).

Two runs on a lent H200 (torch 2.11.0+cu130, 16k tokens per call, 2048 = heads x head dim),
forward + backward TFLOP/s of the second; ``eff/fl``: efficient masked over flash full (the
first run's in brackets); ``cuDNN``: cuDNN masked over cuDNN full:

| D | seq | B | fl. causal | fl. full | eff. masked | cuDNN causal | full | masked | eff/fl | cuDNN|
|---|---|---|---|---|---|---|---|---|---|---|
| 64 | 1024 | 16 | 129 | 184 | 72 | 202 | 296 | 189 | 0.39 (0.38) | 0.64 |
| 64 | 2048 | 8 | 169 | 213 | 77 | 271 | 354 | 213 | 0.36 (0.37) | 0.60 |
| 64 | 4096 | 4 | 200 | 232 | 79 | 323 | 381 | 215 | 0.34 (0.34) | 0.56 |
| 64 | 8192 | 2 | 219 | 239 | 79 | 358 | 376 | 217 | 0.33 (0.33) | 0.58 |
| 64 | 16384 | 1 | 234 | 248 | 80 | 382 | 377 | 222 | 0.32 (0.33) | 0.59 |
| 128 | 1024 | 16 | 144 | 198 | 89 | 274 | 362 | 221 | 0.45 (0.45) | 0.61 |
| 128 | 2048 | 8 | 187 | 234 | 98 | 356 | 457 | 243 | 0.42 (0.42) | 0.53 |
| 128 | 4096 | 4 | 220 | 250 | 102 | 424 | 488 | 256 | 0.41 (0.40) | 0.53 |
| 128 | 8192 | 2 | 243 | 264 | 104 | 457 | 488 | 261 | 0.40 (0.40) | 0.53 |
| 128 | 16384 | 1 | 261 | 270 | 104 | 499 | 468 | 258 | 0.39 (0.38) | 0.55 |

(The "cuDNN" columns are the default dispatch: on this H200 and torch, ``_fused_sdp_choice``
picks cuDNN attention for both the masked and the causal call, and a pinned cuDNN masked call
times as the default one.) So the padded call transformers makes does not run the
memory-efficient kernel here: it runs cuDNN's, with the mask, at 0.53-0.64 of cuDNN's unmasked
rate on the same square; the memory-efficient kernel, 0.32-0.45 of the flash kernel's, would be
slower still. Both ratios repeat to 0.01 between the two runs.

An earlier run of three default-dispatch calls (batch 4, 32 heads of 128; fwd+bwd, median of
10, seconds):

| seq | causal | padded | full | padded / causal | full / causal |
|---|---|---|---|---|---|
| 1024 | 0.000482 | 0.001031 | 0.000760 | 2.14 | 1.58 |
| 4096 | 0.003825 | 0.012777 | 0.006885 | 3.34 | 1.80 |
| 8192 | 0.015157 | 0.048792 | 0.028464 | 3.22 | 1.88 |

Run on a GPU:  python benchmarks/sdpa_masked_attention.py [--head-dim 64 128 --seq 1024 4096]
CPU dry run:   python benchmarks/sdpa_masked_attention.py --device cpu --seq 128 --tokens 256
"""

from __future__ import annotations

import argparse
import json
import time

# variant name -> (kernel pinned or None, masked, causal)
VARIANTS = {
    "flash_causal": ("FLASH_ATTENTION", False, True),
    "flash_full": ("FLASH_ATTENTION", False, False),
    "efficient_masked": ("EFFICIENT_ATTENTION", True, False),
    "efficient_full": ("EFFICIENT_ATTENTION", False, False),
    "default_masked": (None, True, False),
    "default_causal": (None, False, True),
    "default_full": (None, False, False),
    "cudnn_masked": ("CUDNN_ATTENTION", True, False),
}


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


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool) -> dict:
    """Forward and backward FLOPs of one call as speed/flops.py counts them."""
    forward = 4.0 * batch * heads * seq * seq * head_dim
    if causal:
        forward /= 2
    return {"forward": forward, "backward": 2 * forward}


def time_variant(name: str, tensors: dict, device: str, repeats: int) -> dict:
    """Forward and forward + backward median seconds of one variant."""
    import contextlib

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernel, masked, causal = VARIANTS[name]
    q, k, v, grad = tensors["q"], tensors["k"], tensors["v"], tensors["grad"]
    kwargs = {"attn_mask": tensors["mask"] if masked else None, "is_causal": causal}
    # the CPU dry run has neither GPU kernel: it takes the default dispatch
    pinned = kernel is not None and device == "cuda"

    def context():
        if pinned:
            return sdpa_kernel(getattr(SDPBackend, kernel))
        return contextlib.nullcontext()

    def forward() -> None:
        with context():
            F.scaled_dot_product_attention(q, k, v, **kwargs)

    def forward_backward() -> None:
        with context():
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        out.backward(grad)
        q.grad = k.grad = v.grad = None

    return {
        "forward": timed(forward, device, repeats),
        "total": timed(forward_backward, device, repeats),
    }


def dispatched_backends(tensors: dict) -> dict:
    """Which SDPA backend the default dispatch picks for the masked and the causal call."""
    import torch
    from torch.nn.attention import SDPBackend

    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    names = {int(backend): name for name, backend in SDPBackend.__members__.items()}
    masked = torch._fused_sdp_choice(q, k, v, tensors["mask"], 0.0, False)
    causal = torch._fused_sdp_choice(q, k, v, None, 0.0, True)
    return {"masked": names.get(int(masked)), "causal": names.get(int(causal))}


def measure(device: str, seq: int, head_dim: int, heads: int, tokens: int, repeats: int) -> dict:
    """Seconds and achieved TFLOP/s of every variant at one shape."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    batch = max(1, tokens // seq)
    shape = (batch, heads, seq, head_dim)
    tensors = {
        name: torch.randn(shape, device=device, dtype=dtype, requires_grad=name != "grad")
        for name in ("q", "k", "v", "grad")
    }
    tensors["mask"] = padded_causal_mask(batch, seq, device)
    row = {"seq": seq, "head_dim": head_dim, "batch": batch, "heads": heads, "variants": {}}
    rates = {}
    row["dispatched"] = dispatched_backends(tensors)
    for name in VARIANTS:
        try:
            seconds = time_variant(name, tensors, device, repeats)
        except RuntimeError as error:  # a pinned kernel that refuses this call
            row["variants"][name] = {"error": str(error).splitlines()[0][:200]}
            continue
        causal = VARIANTS[name][2]
        flops = attention_flops(batch, heads, seq, head_dim, causal=causal)
        backward_s = max(seconds["total"] - seconds["forward"], 1e-9)
        rates[name] = {
            "forward": flops["forward"] / seconds["forward"] / 1e12,
            "backward": flops["backward"] / backward_s / 1e12,
            "total": sum(flops.values()) / seconds["total"] / 1e12,
        }
        row["variants"][name] = {
            "forward_s": round(seconds["forward"], 6),
            "total_s": round(seconds["total"], 6),
            **{f"{part}_tflops": round(rate, 1) for part, rate in rates[name].items()},
        }
    row["masked_over_flash"] = rate_ratios(rates, "efficient_masked", "flash_full")
    row["default_masked_over_full"] = rate_ratios(rates, "default_masked", "default_full")
    del tensors
    return row


def rate_ratios(rates: dict, numerator: str, denominator: str) -> dict:
    """Forward, backward and total rate of one variant over another's (None if either failed)."""
    if numerator not in rates or denominator not in rates:
        return {part: None for part in ("forward", "backward", "total")}
    return {
        part: round(rates[numerator][part] / rates[denominator][part], 3)
        for part in ("forward", "backward", "total")
    }


def render_table(rows: list[dict]) -> str:
    """Markdown: fwd+bwd TFLOP/s of each variant and the masked kernel's rate against flash."""
    names = list(VARIANTS)
    lines = [
        "| head dim | seq | batch | " + " | ".join(names)
        + " | efficient masked / flash full | default masked / default full | masked dispatch |",
        "|---" * (len(names) + 6) + "|",
    ]
    for row in rows:
        rates = [str(row["variants"][name].get("total_tflops", "refused")) for name in names]
        lines.append(
            f"| {row['head_dim']} | {row['seq']} | {row['batch']} | "
            + " | ".join(rates)
            + f" | {row['masked_over_flash']['total']}"
            + f" | {row['default_masked_over_full']['total']} | {row['dispatched']['masked']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seq", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--width", type=int, default=2048, help="heads x head dim")
    parser.add_argument("--tokens", type=int, default=16384, help="batch x seq per call")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    import torch

    rows = []
    for head_dim in args.head_dim:
        for seq in args.seq:
            row = measure(
                args.device, seq, head_dim, args.width // head_dim, args.tokens, args.repeats
            )
            row["device"] = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
            row["torch"] = torch.__version__
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(render_table(rows), flush=True)


if __name__ == "__main__":
    main()
