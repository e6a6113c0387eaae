"""DeepSpeed's ZeRO defaults, read from DeepSpeed itself, and the bucket sizes zerofit writes.

One source for the config builder (``configs/deepspeed_json.py``), the memory model
(``estimate.TrainSetup.bucket_sizes``) and the reader of the user's own JSON (``ds_config.py``), so
the estimate counts exactly the buffers DeepSpeed allocates. The defaults are those of DeepSpeed's
own config class (``deepspeed/runtime/zero/config.py``: ``DeepSpeedZeroConfig``), never copied by
hand. Importing DeepSpeed costs seconds (it pulls in torch), so the values are kept in zerofit's
disk cache per installed DeepSpeed version: planning stays as fast as the arithmetic it is.
"""

from __future__ import annotations

import functools
import importlib
import io
import logging
import sys
from contextlib import redirect_stdout
from types import ModuleType

from zerofit.cache import cache_file, read_cache, store_in_cache
from zerofit.errors import ZerofitError

# zero_optimization key as a JSON spells it -> the DeepSpeedZeroConfig attribute holding it (the
# stage3_ names are the fields' aliases).
ZERO_BUCKET_FIELDS = {
    "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "sub_group_size": "sub_group_size",
}

_REINSTALL = (
    "reinstall it (pip install --force-reinstall deepspeed); zerofit reads its config classes"
)


def import_deepspeed(module: str = "deepspeed") -> ModuleType:
    """``deepspeed`` (or one of its modules), imported without writing to stdout.

    DeepSpeed logs its accelerator detection to stdout while it is imported ("Setting accelerator
    to CPU"), which would corrupt ``--json`` output: the import runs with stdout captured, and its
    logger's handler is pointed back at the real stdout afterwards. A broken install (missing,
    or failing at import) is one ZerofitError naming the fix.
    """
    if sys.modules.get("deepspeed") is None:  # None: an import that failed, or was blocked
        buffer = io.StringIO()
        try:
            with redirect_stdout(buffer):
                importlib.import_module("deepspeed")
        except Exception as exc:  # an import error, a missing CUDA op, a broken dependency
            problem = f"cannot be imported ({_first_line(exc)})"
            raise ZerofitError("deepspeed", problem, _REINSTALL) from None
        finally:
            for handler in logging.getLogger("DeepSpeed").handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is buffer:
                    handler.setStream(sys.stdout)
    try:
        return importlib.import_module(module)
    except Exception as exc:
        problem = f"has no {module} ({_first_line(exc)})"
        raise ZerofitError("deepspeed", problem, _REINSTALL) from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:200]


def deepspeed_default_buckets() -> dict[str, int]:
    """DeepSpeed's default bucket sizes and stage-3 limits in elements, keyed as the JSON spells
    them (what DeepSpeed allocates for a ``zero_optimization`` block that leaves them out)."""
    return dict(_deepspeed_default_buckets())


@functools.lru_cache(maxsize=1)
def _deepspeed_default_buckets() -> dict[str, int]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        key = f"deepspeed {version('deepspeed')}"
    except PackageNotFoundError:
        raise ZerofitError("deepspeed", "is not installed", _REINSTALL) from None
    path = cache_file("deepspeed_defaults.json")
    cached = read_cache(path).get(key)
    if (
        isinstance(cached, dict)
        and set(cached) == set(ZERO_BUCKET_FIELDS)
        and all(isinstance(value, int) for value in cached.values())
    ):
        return cached
    defaults = import_deepspeed("deepspeed.runtime.zero.config").DeepSpeedZeroConfig()
    values = {field: int(getattr(defaults, attr)) for field, attr in ZERO_BUCKET_FIELDS.items()}
    store_in_cache(path, key, values)
    return values


def __getattr__(name: str) -> dict[str, int]:
    """``DEEPSPEED_DEFAULT_BUCKETS``: ``deepspeed_default_buckets()`` as a module constant, read
    from DeepSpeed only when first asked for (PEP 562), so importing this module stays free."""
    if name == "DEEPSPEED_DEFAULT_BUCKETS":
        return deepspeed_default_buckets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def hf_auto_bucket_sizes(hidden_size: int) -> dict[str, int]:
    """What transformers and accelerate substitute for "auto" in these ``zero_optimization`` keys.

    transformers/integrations/deepspeed.py, ``HfTrainerDeepSpeedConfig.trainer_config_finalize``,
    and accelerate/accelerator.py, ``Accelerator._prepare_deepspeed``: hidden² for the reduce
    bucket, 0.9 hidden² for stage 3's prefetch bucket, 10 hidden for its persistence threshold.
    """
    hidden_squared = hidden_size * hidden_size
    return {
        "reduce_bucket_size": hidden_squared,
        "stage3_prefetch_bucket_size": int(0.9 * hidden_squared),
        "stage3_param_persistence_threshold": 10 * hidden_size,
    }


def ds_bucket_sizes(hidden_size: int, stage: int) -> dict[str, int]:
    """Bucket/prefetch sizes (in elements) zerofit writes into ``zero_optimization`` at ``stage``.

    Stage 1/2: DeepSpeed's own defaults (the calibration points were measured with them, and they
    keep reduction launches few on fast links). Stage 3: what HF's "auto" resolves to (hidden²
    scaled, ``transformers/integrations/deepspeed.py``: ``trainer_config_finalize``), proven across
    TRL/Trainer runs, with DeepSpeed's own max-live/reuse defaults bounding how many gathered
    parameters stay resident.
    """
    defaults = deepspeed_default_buckets()
    if stage in (1, 2):
        return {key: defaults[key] for key in ("reduce_bucket_size", "allgather_bucket_size")}
    if stage == 3:
        return {
            **hf_auto_bucket_sizes(hidden_size),
            "stage3_max_live_parameters": defaults["stage3_max_live_parameters"],
            "stage3_max_reuse_distance": defaults["stage3_max_reuse_distance"],
        }
    return {}
