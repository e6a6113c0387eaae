"""check, one DeepSpeed JSON: DeepSpeed's own config classes first, then what no library knows.

DeepSpeed judges keys and values: the top-level keys are the ones ``DeepSpeedConfig`` looks up
while it reads a config (recorded by running it), ``zero_optimization`` and the precision blocks
go through ``DeepSpeedZeroConfig`` / ``DeepSpeedBF16Config`` / ``DeepSpeedFP16Config``, removed
and deprecated forms come from DeepSpeed's own lists and field metadata, and finally the whole
``DeepSpeedConfig`` runs at the world size given. zerofit's rules add what DeepSpeed only finds
at start-up, or never: batch arithmetic against the process count, offload_param below stage 3,
nvme without a path, "auto" per client (``auto_values``), bf16 against the GPU.
"""

from __future__ import annotations

import functools
import logging
from contextlib import contextmanager
from typing import Any
from unittest import mock

from zerofit.configs.check.auto_values import as_filled, check_autos, trainer_must_match
from zerofit.configs.check.problems import (
    Problem,
    has_type,
    is_int,
    not_a_mapping,
    suggest_key,
    type_problem,
)
from zerofit.memory.ds_defaults import import_deepspeed

_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def deepspeed_version() -> str:
    """The installed DeepSpeed's version (a broken install is a ZerofitError)."""
    return getattr(import_deepspeed(), "__version__", "?")


def check_deepspeed(
    cfg: dict,
    name: str = "ds_config.json",
    world: int | None = None,
    gpu_bf16: bool | None = None,
    trainer: bool = False,
    client: str | None = None,
) -> list[Problem]:
    """Problems in one DeepSpeed config dict (``world``: total processes, when known).

    ``client`` as in ``check_files``; ``trainer`` is shorthand for ``client="trainer"``.
    """
    if not isinstance(cfg, dict):
        return [not_a_mapping(name)]
    deepspeed_version()  # a broken install stops here, as one error
    client = "trainer" if trainer and client is None else client
    problems = _check_top_level(cfg, name)
    problems += _check_sections(cfg, name)
    removed = set(_removed_keys()[0])
    # a removed block is reported once, whole: its "auto" values are not judged on their own
    problems += check_autos({k: v for k, v in cfg.items() if k not in removed}, name, client)
    problems += _check_offload(cfg, name)
    problems += _check_zero_plus(cfg, name, world)
    problems += _check_precision(cfg, name, gpu_bf16)
    problems += check_batch(cfg, name, world)
    if client == "trainer":
        problems += trainer_must_match(cfg, name)
    if not any(p.severity == "error" for p in problems):
        problems += _check_whole(as_filled(cfg), name, world or 1)
    return problems


# --------------------------------------------------------------------------- DeepSpeed's verdicts
@contextmanager
def quiet_libraries():
    """DeepSpeed/accelerate log deprecations and config dumps; check reports them itself."""
    loggers = [logging.getLogger(n) for n in ("DeepSpeed", "deepspeed", "accelerate")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


_NOT_READ = object()  # a key looked up by membership only, with no default


class _ReadRecorder(dict):
    """A config mapping that records each key read from it, with the default the reader passes."""

    def __init__(self, data: dict):
        super().__init__(data)
        self.read: dict[Any, Any] = {}

    def get(self, key, default=None):
        if self.read.get(key, _NOT_READ) is _NOT_READ:
            self.read[key] = default
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.setdefault(key, _NOT_READ)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.setdefault(key, _NOT_READ)
        return super().__contains__(key)

    def keys(self):
        return _RecordedKeys(self)


class _RecordedKeys:
    """``config.keys()`` whose ``in`` is recorded too (DeepSpeed asks ``KEY in d.keys()``)."""

    def __init__(self, owner: _ReadRecorder):
        self.owner = owner

    def __contains__(self, key) -> bool:
        return key in self.owner

    def __iter__(self):
        return iter(dict.keys(self.owner))

    def __len__(self) -> int:
        return dict.__len__(self.owner)


def _run_deepspeed_config(cfg: dict, world: int) -> None:
    """``DeepSpeedConfig(cfg)`` as rank 0 of a ``world``-process job, without a process group."""
    config = import_deepspeed("deepspeed.runtime.config")
    with (
        quiet_libraries(),
        mock.patch("deepspeed.comm.get_rank", return_value=0),
        mock.patch("deepspeed.comm.get_world_size", return_value=world),
    ):
        config.DeepSpeedConfig(cfg)


@functools.lru_cache(maxsize=1)
def top_level_reads() -> dict[str, Any]:
    """Every top-level key ``DeepSpeedConfig`` looks up, with the default it falls back to.

    DeepSpeed has no class for the top level: ``_initialize_params`` (deepspeed/runtime/config.py)
    and the section readers it calls look keys up one by one and ignore the rest, so a typo there
    is silently lost. Running it over a mapping that records the lookups gives the exact list for
    the installed version; a default's type is the type DeepSpeed expects there.
    """
    recorder = _ReadRecorder({"train_batch_size": 1})
    _run_deepspeed_config(recorder, 1)
    return {
        key: (None if default is _NOT_READ else default)
        for key, default in recorder.read.items()
        if isinstance(key, str)
    }


def _check_top_level(cfg: dict, name: str) -> list[Problem]:
    reads = top_level_reads()
    problems: list[Problem] = []
    for key, value in cfg.items():
        where = f"{name}:{key}"
        if not isinstance(key, str):
            problems.append(Problem(where, "keys must be strings", "quote the key"))
        elif key.startswith("_"):
            continue  # "_comment" style notes: DeepSpeed ignores unknown top-level keys
        elif key not in reads:
            problems.append(
                Problem(
                    where,
                    "is not a key DeepSpeed reads at the top level (it is ignored)",
                    suggest_key(key, reads),
                    "warning",
                )
            )
        elif value != "auto" and isinstance(reads[key], (bool, int, float, str, dict, list)):
            problem = type_problem(where, key, value, type(reads[key]))
            problems += [problem] if problem else []
    return problems


@functools.lru_cache(maxsize=1)
def _removed_keys() -> tuple[dict, dict]:
    """The top-level and zero_optimization keys the installed DeepSpeed refuses as removed
    features (deepspeed/runtime/config.py ``_reject_removed_config_keys``), with its messages."""
    config = import_deepspeed("deepspeed.runtime.config")
    return (
        dict(getattr(config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})),
        dict(getattr(config, "_REMOVED_ZERO_CONFIG_KEYS", {})),
    )


def _removed(where: str, message: str) -> Problem:
    return Problem(
        where,
        f"was removed from DeepSpeed ({deepspeed_version()} refuses the file): "
        + message.split(" See ")[0].strip(),
        "remove it",
    )


def _check_sections(cfg: dict, name: str) -> list[Problem]:
    """Removed keys, zero_optimization and the precision blocks, judged by DeepSpeed's classes."""
    zero_config = import_deepspeed("deepspeed.runtime.zero.config").DeepSpeedZeroConfig
    precision = import_deepspeed("deepspeed.runtime.precision_config")
    removed_top, removed_zero = _removed_keys()
    problems = [_removed(f"{name}:{key}", text) for key, text in removed_top.items() if key in cfg]
    zero = cfg.get("zero_optimization")
    # "zero_optimization": true is DeepSpeed's legacy form (read_zero_config_deprecated): valid.
    if isinstance(zero, dict):
        problems += [
            _removed(f"{name}:zero_optimization.{key}", text)
            for key, text in removed_zero.items()
            if key in zero
        ]
        kept = {k: v for k, v in zero.items() if k not in removed_zero}
        problems += validate_model(zero_config, kept, "zero_optimization.", name)
        problems += _deprecations(zero_config, kept, "zero_optimization.", name)
    for key, model in (
        ("bf16", precision.DeepSpeedBF16Config),
        ("bfloat16", precision.DeepSpeedBF16Config),
        ("fp16", precision.DeepSpeedFP16Config),
    ):
        if isinstance(cfg.get(key), dict):
            problems += validate_model(model, cfg[key], key + ".", name)
    return problems


def model_keys(model) -> set[str]:
    """A pydantic model's field names and their aliases (DeepSpeed populates by either)."""
    keys = set()
    for field_name, field in model.model_fields.items():
        keys.add(field_name)
        if field.alias:
            keys.add(field.alias)
    return keys


def _sub_model(model, loc: list[str]):
    """The nested model an error location points into (an offload block inside the ZeRO one)."""
    for part in loc:
        field = model.model_fields.get(part) or next(
            (f for f in model.model_fields.values() if f.alias == part), None
        )
        annotation = getattr(field, "annotation", None)
        inner = next(
            (
                a
                for a in getattr(annotation, "__args__", (annotation,))
                if hasattr(a, "model_fields")
            ),
            None,
        )
        model = inner or model
    return model


def validate_model(model, data: dict, prefix: str, name: str) -> list[Problem]:
    """Instantiate a DeepSpeed pydantic config model; each validation error becomes a Problem
    that names DeepSpeed's own field and its message."""
    from pydantic import ValidationError

    try:
        with quiet_libraries():
            model(**data)
    except ValidationError as exc:
        return [_validation_problem(model, err, prefix, name) for err in exc.errors()]
    except Exception as exc:  # validators may raise plain errors
        return [
            Problem(
                f"{name}:{prefix.rstrip('.')}",
                f"DeepSpeed rejects it: {first_line(exc)}",
                "fix the value named in the message",
            )
        ]
    return []


def _validation_problem(model, err: dict, prefix: str, name: str) -> Problem:
    loc = [str(x) for x in err.get("loc", ())]
    path = f"{name}:{prefix}{'.'.join(loc)}" if loc else f"{name}:{prefix.rstrip('.')}"
    if err.get("type") != "extra_forbidden":
        return Problem(
            path,
            f"{err.get('input')!r}: {err.get('msg', 'invalid')} (DeepSpeed's check)",
            "write a value DeepSpeed accepts (see its config docs)",
        )
    fix = suggest_key(loc[-1], model_keys(_sub_model(model, loc[:-1])))
    if len(loc) == 1 and prefix == "zero_optimization." and loc[0] in top_level_reads():
        fix = f"move {loc[0]!r} to the top level of the file (DeepSpeed reads it there)"
    return Problem(path, "is not a key DeepSpeed knows (DeepSpeed refuses the file)", fix)


def _deprecations(model, data: dict, prefix: str, name: str) -> list[Problem]:
    """Deprecated field names (DeepSpeed still maps them, with a warning): what replaces them."""
    by_key = {}
    for field_name, field in model.model_fields.items():
        by_key[field_name] = field
        if field.alias:
            by_key[field.alias] = field
    problems = []
    for key in data:
        extra = getattr(by_key.get(key), "json_schema_extra", None) or {}
        if isinstance(extra, dict) and extra.get("deprecated"):
            new = extra.get("new_param")
            problems.append(
                Problem(
                    f"{name}:{prefix}{key}",
                    "is deprecated (DeepSpeed still reads it, with a warning)",
                    f"use {new!r} instead" if new else "remove it",
                    "warning",
                )
            )
    return problems


def _check_whole(cfg: dict, name: str, world: int) -> list[Problem]:
    """DeepSpeed's full ``DeepSpeedConfig`` over ``cfg`` as a ``world``-process job would run it.

    ``cfg`` must already hold numbers where "auto" was (``as_filled``).
    """
    try:
        _run_deepspeed_config(cfg, world)
    except Exception as exc:  # DeepSpeed raises asserts, ValueError, its own errors
        return [
            Problem(
                name,
                f"DeepSpeed rejects it: {first_line(exc)}",
                "fix the value named in the message",
            )
        ]
    return []


# --------------------------------------------------------------------------- zerofit's own rules
def _check_offload(cfg: dict, name: str) -> list[Problem]:
    """offload_param below stage 3 (DeepSpeed ignores it silently) and nvme without a path."""
    zero = cfg.get("zero_optimization")
    zero = zero if isinstance(zero, dict) else {}
    stage = zero.get("stage", 0)
    problems: list[Problem] = []
    for section in ("offload_optimizer", "offload_param"):
        block = zero.get(section)
        if not isinstance(block, dict):
            continue
        device = block.get("device", "none")
        where = f"{name}:zero_optimization.{section}"
        if section == "offload_param" and device not in ("none", None) and stage in (0, 1, 2):
            problems.append(
                Problem(
                    where,
                    f"parameter offload needs ZeRO stage 3 (stage is {stage})",
                    "set zero_optimization.stage to 3, or remove offload_param",
                )
            )
        if device == "nvme" and not block.get("nvme_path"):
            problems.append(
                Problem(
                    where + ".nvme_path",
                    "offload to nvme needs a path",
                    'set "nvme_path" to a local NVMe mount, e.g. "/local_nvme"',
                )
            )
    return problems


def _check_zero_plus(cfg: dict, name: str, world: int | None) -> list[Problem]:
    """ZeRO++ where it cannot work: below stage 3 (runtime/engine.py
    ``_configure_zero_optimizer`` hands ``zero_hpz_partition_size`` and the quantized flags only
    to the stage-3 optimizer), an hpZ group the world does not divide into (utils/groups.py
    ``_create_zero_param_parallel_group``: ``_ensure_divisibility``) or that spans every rank.
    That qwZ/qgZ need CUDA GPUs (op_builder/quantizer.py ``QuantizerBuilder`` is a CUDA op) is
    a fact of the machine that runs the file, not of the file: ``config`` says it in the
    ``_comment``, check does not warn wherever it runs without a GPU."""
    zero = cfg.get("zero_optimization")
    zero = zero if isinstance(zero, dict) else {}
    hpz = zero.get("zero_hpz_partition_size", 1)
    hpz = hpz if is_int(hpz) else 1
    quantized = [key for key in _QUANTIZED_KEYS if zero.get(key) is True]
    where = f"{name}:zero_optimization."
    if zero.get("stage", 0) != 3:
        return [
            Problem(
                where + key,
                f"is ZeRO++, which only ZeRO stage 3 runs (stage is {zero.get('stage', 0)})",
                "set zero_optimization.stage to 3, or remove it",
                "warning",
            )
            for key in (["zero_hpz_partition_size"] if hpz > 1 else []) + quantized
        ]
    problems = []
    if hpz > 1 and world is not None and world % hpz:
        problems.append(
            Problem(
                where + "zero_hpz_partition_size",
                f"{hpz} does not divide the {world} processes; DeepSpeed stops at start-up",
                "set it to the GPUs per node",
            )
        )
    elif hpz > 1 and world is not None and hpz >= world:
        problems.append(
            Problem(
                where + "zero_hpz_partition_size",
                f"{hpz} spans all {world} processes: the secondary partition repeats the "
                "primary one and only costs memory",
                "set it to the GPUs per node of a multi-node job, or remove it",
                "warning",
            )
        )
    return problems


_QUANTIZED_KEYS = ("zero_quantized_weights", "zero_quantized_gradients")


def _enabled(block: Any) -> Any:
    return block.get("enabled") if isinstance(block, dict) else None


def _check_precision(cfg: dict, name: str, gpu_bf16: bool | None) -> list[Problem]:
    """bf16 and fp16 both on, or bf16 on a GPU without it (``gpu_bf16`` None: not checked)."""
    bf16, fp16 = _enabled(cfg.get("bf16", cfg.get("bfloat16"))), _enabled(cfg.get("fp16"))
    problems = []
    if bf16 is True and fp16 is True:
        problems.append(
            Problem(
                f"{name}:fp16.enabled", "bf16 and fp16 are both enabled", "enable only one of them"
            )
        )
    if bf16 is True and gpu_bf16 is False:
        problems.append(
            Problem(
                f"{name}:bf16.enabled",
                "this GPU has no bf16 support",
                'use "fp16": {"enabled": true} instead (V100, T4), or "auto" with --fp16',
            )
        )
    return problems


def check_batch(cfg: dict, name: str, world: int | None) -> list[Problem]:
    """The batch triple: whole numbers, and train = micro x accumulation x world (DeepSpeed
    asserts it at start-up; without ``world``, train must at least be a multiple)."""
    problems = []
    for key in _BATCH_KEYS:
        value = cfg.get(key)
        if key in cfg and value != "auto" and not (has_type(value, int) and value >= 0):
            message, fix = f"{value!r} is not a whole number", f"set {key} to a whole number"
            problems.append(Problem(f"{name}:{key}", message, fix))
    tbs, micro, accum = (cfg.get(key) for key in _BATCH_KEYS)
    if problems or not all(is_int(v) and v > 0 for v in (tbs, micro, accum)):
        return problems
    if world is not None and tbs != micro * accum * world:
        return [
            Problem(
                f"{name}:train_batch_size",
                f"{tbs} != {micro} micro x {accum} accumulation x {world} processes "
                f"(= {micro * accum * world}); DeepSpeed stops at start-up",
                f"set train_batch_size to {micro * accum * world}",
            )
        ]
    if world is None and tbs % (micro * accum):
        return [
            Problem(
                f"{name}:train_batch_size",
                f"{tbs} is not a multiple of {micro} micro x {accum} accumulation, "
                "so no world size fits",
                f"use a multiple of {micro * accum}, or set it to \"auto\" with HF Trainer",
            )
        ]
    return []
