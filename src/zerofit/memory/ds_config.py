"""What a user's own DeepSpeed JSON / accelerate YAML says about memory, as estimate inputs.

Defaults come from DeepSpeed's own config class (``deepspeed/runtime/zero/config.py:
DeepSpeedZeroConfig``), not from a hand-written table, so a JSON that leaves the bucket sizes out
is estimated with exactly the buckets DeepSpeed will allocate. ``"auto"`` values are what HF
Trainer / accelerate fill in (``transformers/integrations/deepspeed.py:
HfTrainerDeepSpeedConfig.trainer_config_finalize``: stage-3 buckets from hidden_size, batch sizes
from the training arguments), so they are left to the estimate's own inputs.
"""

from __future__ import annotations

import json
from typing import Any

from zerofit.errors import ZerofitError
from zerofit.memory.ds_defaults import ZERO_BUCKET_FIELDS, ds_bucket_sizes, import_deepspeed

# accelerate distributed types whose memory zerofit does not model (an estimate would describe
# ZeRO), with the ZeRO configuration closest to them; `zerofit check` says so too.
NOT_MODELLED = {"FSDP": "--stage 3 for FULL_SHARD, --stage 2 for SHARD_GRAD_OP"}


def load_deepspeed_json(text: str, flag: str, path: str) -> Any:
    """The parsed text of the DeepSpeed JSON at ``path`` (given by ``flag``); any parse failure,
    deep nesting included, is one ZerofitError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        detail = f"{exc.msg}, line {exc.lineno}"
    except RecursionError:
        detail = "nested too deeply to read"
    raise ZerofitError(flag, f"{path} is not valid JSON ({detail})", "fix the JSON syntax")


def load_accelerate_yaml(text: str, flag: str, path: str) -> Any:
    """The parsed text of the accelerate YAML at ``path`` (given by ``flag``); any parse failure,
    deep nesting included, is one ZerofitError."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        detail = str(exc).splitlines()[0]
    except RecursionError:
        detail = "nested too deeply to read"
    raise ZerofitError(flag, f"{path} is not valid YAML ({detail})", "fix the YAML syntax")


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def _int(field: str, value: Any) -> int:
    try:
        out = int(float(value))
    except (TypeError, ValueError):
        raise ZerofitError(
            field, f"{value!r} is not a number", 'write a whole number or "auto"'
        ) from None
    if out < 0:
        raise ZerofitError(field, f"{value!r} is negative", "write a positive number")
    return out


def read_ds_config(ds: dict, hidden_size: int) -> dict[str, Any]:
    """Estimate inputs from a DeepSpeed config mapping.

    Returns a dict with any of: ``stage``, ``offload_optimizer``, ``offload_param``,
    ``precision``, ``micro_batch``, ``grad_accum``, ``train_batch_size`` (each only when the file
    states it as a number), and always ``buckets``, ``overlap_comm``,
    ``memory_efficient_linear``, ``ds_optimizer_block``,
    ``optimizer`` (the implementation DeepSpeed builds from the block, or None without one) and
    the offload blocks' ``pin_optimizer_offload`` / ``pin_param_offload``.
    """
    if not isinstance(ds, dict):
        raise ZerofitError(
            "deepspeed config", "is not a JSON object", "give a DeepSpeed config file"
        )
    zero = ds.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        raise ZerofitError("zero_optimization", "is not an object", "write a JSON object")
    out = read_zero_block(zero, hidden_size)
    out.update(_read_precision(ds))
    for key, name in (
        ("train_micro_batch_size_per_gpu", "micro_batch"),
        ("gradient_accumulation_steps", "grad_accum"),
        ("train_batch_size", "train_batch_size"),
    ):
        if key in ds and not _is_auto(ds[key]):
            out[name] = _int(key, ds[key])
    out.update(_read_optimizer(ds.get("optimizer"), out["offload_optimizer"]))
    return out


def read_zero_block(zero: dict, hidden_size: int) -> dict[str, Any]:
    """Stage, buckets, overlap and offload from ``zero_optimization``, as DeepSpeedZeroConfig
    parses it (its defaults for what the block leaves out), and ``zero_plus`` where the block
    turns ZeRO++ on at stage 3."""
    out: dict[str, Any] = {}
    stage = zero.get("stage", 0)
    if not _is_auto(stage):
        stage = _int("zero_optimization.stage", stage)
        if stage not in (0, 1, 2, 3):
            raise ZerofitError(
                "zero_optimization.stage", f"{stage} is not a ZeRO stage", "use 0, 1, 2 or 3"
            )
        out["stage"] = stage
    parsed = _parse_zero(zero)
    # "auto" buckets: what HF fills in at any stage (reduce_bucket_size = hidden^2, the stage-3
    # prefetch/persistence from hidden_size): the same formula zerofit writes for stage 3
    hf_auto = ds_bucket_sizes(hidden_size, 3)
    out["buckets"] = {
        key: int(hf_auto.get(key, getattr(parsed, attr)))
        if _is_auto(zero.get(key))
        else int(getattr(parsed, attr))
        for key, attr in ZERO_BUCKET_FIELDS.items()
    }
    out["overlap_comm"] = (
        bool(parsed.overlap_comm) if parsed.overlap_comm is not None else out.get("stage") == 3
    )
    # zero.Init swaps F.linear for zero3_linear_wrap unless this is off (partition_parameters.py
    # ``Init.__init__``: ``_ds_config.zero_config.memory_efficient_linear``)
    out["memory_efficient_linear"] = bool(parsed.memory_efficient_linear)
    out.update(_read_offload(parsed, out.get("stage", 3)))
    zero_plus = _read_zero_plus(parsed)
    if zero_plus != "none" and out.get("stage", 3) == 3:
        out["zero_plus"] = zero_plus
    return out


def _read_zero_plus(parsed) -> str:
    """ZeRO++ as TrainSetup.zero_plus names it (``hpz``, ``qwz``, ``qgz`` joined by ``+``, or
    ``none``), from DeepSpeedZeroConfig's ``zero_hpz_partition_size`` (> 1: the secondary
    partition), ``zero_quantized_weights`` and ``zero_quantized_gradients``
    (deepspeed/runtime/zero/config.py). Only ZeRO-3 reads them (stage3.py
    ``DeepSpeedZeroOptimizer_Stage3``, partition_parameters.py ``Init``), so the caller drops
    them below stage 3. hpZ's partition is taken as one node, the size zerofit writes."""
    parts = []
    if int(parsed.zero_hpz_partition_size or 1) > 1:
        parts.append("hpz")
    if parsed.zero_quantized_weights:
        parts.append("qwz")
    if parsed.zero_quantized_gradients:
        parts.append("qgz")
    return "+".join(parts) or "none"


def _parse_zero(zero: dict):
    """``DeepSpeedZeroConfig`` over the block's non-"auto" values; its refusal is one error."""
    zero_config = import_deepspeed("deepspeed.runtime.zero.config").DeepSpeedZeroConfig
    numeric = {k: v for k, v in zero.items() if not _is_auto(v)}
    try:
        return zero_config(**numeric)
    except Exception as exc:  # pydantic's ValidationError: report DeepSpeed's own first line
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ZerofitError(
            "zero_optimization",
            f"DeepSpeed rejects it ({first})",
            "fix the block as DeepSpeed's error says",
        ) from None


def _read_offload(parsed, stage: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "offload_optimizer": _offload_device(parsed.offload_optimizer),
        "offload_param": _offload_device(parsed.offload_param),
    }
    if stage < 3:
        # only ZeRO-3 is handed the offload_param block (deepspeed/runtime/engine.py:
        # _configure_zero_optimizer); stage_1_and_2.py keeps every bit16 weight on the GPU
        out["offload_param"] = "none"
    # pin_memory: DeepSpeedZeroOffload{Optimizer,Param}Config fill in their default (on) when a
    # block leaves it out (deepspeed/runtime/zero/offload_config.py)
    out["pin_optimizer_offload"] = bool(getattr(parsed.offload_optimizer, "pin_memory", True))
    out["pin_param_offload"] = bool(getattr(parsed.offload_param, "pin_memory", True))
    if "nvme" in (out["offload_optimizer"], out["offload_param"]):
        for block in (parsed.offload_optimizer, parsed.offload_param):
            if block is not None and getattr(block, "nvme_path", None):
                out["nvme_path"] = str(block.nvme_path)
                break
    return out


def _read_precision(ds: dict) -> dict[str, str]:
    if (ds.get("bf16") or {}).get("enabled") is True:
        return {"precision": "bf16"}
    if (ds.get("fp16") or {}).get("enabled") is True:
        return {"precision": "fp16"}
    if not any(_is_auto((ds.get(k) or {}).get("enabled")) for k in ("bf16", "fp16")):
        return {"precision": "fp32"}
    return {}


def _read_optimizer(block: Any, offload_optimizer: str) -> dict[str, Any]:
    """The optimizer DeepSpeed builds from the JSON's ``optimizer`` block (None without one)."""
    if not isinstance(block, dict):
        return {"ds_optimizer_block": False, "optimizer": None}
    params = block.get("params") or {}
    # engine.py:get_optimizer_configuration: torch_adam -> torch AdamW(foreach), offload ->
    # DeepSpeedCPUAdam, else FusedAdam
    if params.get("torch_adam"):
        optimizer = "adamw_torch"
    elif offload_optimizer != "none":
        optimizer = "ds_cpu_adam"
    else:
        optimizer = "ds_fused_adam"
    return {"ds_optimizer_block": True, "optimizer": optimizer}


def _offload_device(block) -> str:
    if block is None:
        return "none"
    device = getattr(block, "device", "none")
    return str(getattr(device, "value", device) or "none")


def read_accelerate_config(cfg: dict) -> tuple[dict[str, Any], str | None]:
    """Estimate inputs from an accelerate YAML mapping, and the DeepSpeed JSON path it names.

    accelerate's keys (``accelerate/commands/config/config_args.py``, ``deepspeed_config``):
    ``num_processes`` and ``num_machines`` give GPUs per node and nodes, ``mixed_precision`` the
    precision, ``deepspeed_config.{zero_stage, offload_optimizer_device, offload_param_device,
    gradient_accumulation_steps}`` the rest, unless ``deepspeed_config_file`` points at a JSON.
    A distributed type zerofit does not model (FSDP) is refused rather than estimated as ZeRO.
    """
    if not isinstance(cfg, dict):
        raise ZerofitError(
            "accelerate config", "is not a YAML mapping", "give an accelerate config file"
        )
    dtype = cfg.get("distributed_type")
    if dtype in NOT_MODELLED:
        raise ZerofitError(
            "distributed_type",
            f"{dtype} is not modelled by zerofit yet",
            f"estimate the DeepSpeed equivalent instead: {NOT_MODELLED[dtype]}",
        )
    out: dict[str, Any] = {}
    machines = _int("num_machines", cfg.get("num_machines", 1) or 1)
    processes = _int("num_processes", cfg.get("num_processes", 1) or 1)
    if machines < 1 or processes < machines or processes % machines:
        raise ZerofitError(
            "num_processes",
            f"{processes} processes do not split over {machines} machines",
            "make num_processes a multiple of num_machines",
        )
    out["num_nodes"], out["gpus_per_node"] = machines, processes // machines
    if cfg.get("mixed_precision") in ("bf16", "fp16"):
        out["precision"] = cfg["mixed_precision"]
    ds = cfg.get("deepspeed_config") or {}
    path = ds.get("deepspeed_config_file") if isinstance(ds, dict) else None
    if isinstance(ds, dict) and not path:
        out.update(_read_plugin_section(ds))
    return out, path


def _read_plugin_section(ds: dict) -> dict[str, Any]:
    """The ZeRO settings an accelerate YAML writes inline (no deepspeed_config_file)."""
    out: dict[str, Any] = {}
    if "zero_stage" in ds:
        out["stage"] = _int("deepspeed_config.zero_stage", ds["zero_stage"])
    for key, name in (
        ("offload_optimizer_device", "offload_optimizer"),
        ("offload_param_device", "offload_param"),
    ):
        if ds.get(key):
            out[name] = str(ds[key])
    if "gradient_accumulation_steps" in ds and not _is_auto(ds["gradient_accumulation_steps"]):
        out["grad_accum"] = _int(
            "deepspeed_config.gradient_accumulation_steps", ds["gradient_accumulation_steps"]
        )
    return out
