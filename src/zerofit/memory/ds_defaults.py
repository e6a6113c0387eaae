"""DeepSpeed bucket sizes zerofit writes, shared by the config builder and the memory model.

One source so the memory estimate counts exactly the buffers the written JSON asks for.
"""

from __future__ import annotations

# Stage 1/2: DeepSpeed's own defaults (5e8 elements). The calibration points were measured
# with these, and they keep reduction launches few on fast links.
STAGE12_REDUCE_BUCKET = 500_000_000
STAGE12_ALLGATHER_BUCKET = 500_000_000
# Stage 3: what HF's "auto" resolves to (hidden² scaled), proven across TRL/Trainer runs;
# DeepSpeed's own max-live/reuse defaults bound how many gathered params stay resident.
STAGE3_MAX_LIVE_PARAMETERS = 1_000_000_000
STAGE3_MAX_REUSE_DISTANCE = 1_000_000_000


def ds_bucket_sizes(hidden_size: int, stage: int) -> dict[str, int]:
    """Bucket/prefetch sizes (in elements) for ``zero_optimization`` at ``stage``."""
    if stage in (1, 2):
        return {
            "reduce_bucket_size": STAGE12_REDUCE_BUCKET,
            "allgather_bucket_size": STAGE12_ALLGATHER_BUCKET,
        }
    if stage == 3:
        h2 = hidden_size * hidden_size
        return {
            "reduce_bucket_size": h2,
            "stage3_prefetch_bucket_size": int(0.9 * h2),
            "stage3_param_persistence_threshold": 10 * hidden_size,
            "stage3_max_live_parameters": STAGE3_MAX_LIVE_PARAMETERS,
            "stage3_max_reuse_distance": STAGE3_MAX_REUSE_DISTANCE,
        }
    return {}
