"""check, the ecosystem's own truth: DeepSpeed's config classes and accelerate's loader and flags.

`zerofit check` validates with the installed libraries whenever they import, so every key,
alias, deprecated and removed form is judged exactly as the run will judge it:

* DeepSpeed JSON: ``DeepSpeedZeroConfig`` (``zero_optimization``, offload blocks included),
  ``DeepSpeedBF16Config`` / ``DeepSpeedFP16Config``, the removed-key lists DeepSpeed raises on
  (``deepspeed/runtime/config.py``: ``_reject_removed_config_keys``), and finally the whole
  ``DeepSpeedConfig`` (its ``_initialize_params`` + sanity checks), at the world size given.
* accelerate YAML: ``ClusterConfig.process_config`` + ``ClusterConfig(**cfg)`` (what
  ``load_config_from_file`` does), the ``accelerate launch`` flags that nested keys become
  (``commands/launch.py``: ``_validate_launch_command`` copies ``deepspeed_config`` /
  ``fsdp_config`` keys onto its arguments, and silently ignores the ones it has no flag for),
  ``DeepSpeedPlugin``'s conversions (``str_to_bool``) and the
  ZeRO section accelerate builds from the YAML, checked by ``DeepSpeedZeroConfig`` again.

Every function returns ``list[Problem]`` and never raises: a library failure is the user's file.
Imported only by ``check`` at run time, so ``zerofit --help`` never pays for deepspeed.
"""

from __future__ import annotations

import difflib
import logging
from contextlib import contextmanager
from typing import Any

from zerofit.configs.check_problem import Problem
from zerofit.configs.check_tables import DS_TOP


def deepspeed_version() -> str | None:
    """The importable DeepSpeed version, or None when DeepSpeed cannot be imported.

    DeepSpeed logs its accelerator detection to stdout at import time ("Setting accelerator to
    CPU"), which would corrupt `check --json`: the import runs with stdout captured, and the
    logger's handler is pointed back at the real stdout afterwards.
    """
    import io
    import sys
    from contextlib import redirect_stdout

    if "deepspeed" not in sys.modules:
        buffer = io.StringIO()
        try:
            with redirect_stdout(buffer):
                import deepspeed  # noqa: F401
        except Exception:  # noqa: BLE001 - any import failure means "fall back to the tables"
            return None
        finally:
            for handler in logging.getLogger("DeepSpeed").handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is buffer:
                    handler.setStream(sys.stdout)
    return getattr(sys.modules["deepspeed"], "__version__", "?")


def accelerate_version() -> str | None:
    """The importable accelerate version, or None."""
    try:
        import accelerate
    except Exception:  # noqa: BLE001
        return None
    return getattr(accelerate, "__version__", "?")


@contextmanager
def _quiet():
    # DeepSpeed/accelerate log deprecations and config dumps at INFO/WARNING; check reports them itself.
    loggers = [logging.getLogger(n) for n in ("DeepSpeed", "deepspeed", "accelerate")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _near(key: str, known) -> str:
    near = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
    return (
        f"did you mean {near[0]!r}?"
        if near
        else "remove it (see the DeepSpeed / accelerate config docs)"
    )


# --------------------------------------------------------------------------- DeepSpeed JSON
def _model_keys(model) -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        keys.add(name)
        if field.alias:
            keys.add(field.alias)
    return keys


def _validate_model(model, data: dict, prefix: str, name: str) -> list[Problem]:
    """Instantiate a DeepSpeed pydantic config model; each validation error becomes a Problem."""
    from pydantic import ValidationError

    try:
        with _quiet():
            model(**data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = [str(x) for x in err.get("loc", ())]
            path = f"{name}:{prefix}{'.'.join(loc)}" if loc else f"{name}:{prefix.rstrip('.')}"
            if err.get("type") == "extra_forbidden":
                parent = model
                for part in loc[:-1]:  # nested offload blocks: find the sub-model for suggestions
                    field = parent.model_fields.get(part) or next(
                        (f for f in parent.model_fields.values() if f.alias == part), None
                    )
                    ann = getattr(field, "annotation", None)
                    sub = next(
                        (a for a in getattr(ann, "__args__", (ann,)) if hasattr(a, "model_fields")),
                        None,
                    )
                    parent = sub or parent
                fix = _near(loc[-1], _model_keys(parent))
                if len(loc) == 1 and prefix == "zero_optimization." and loc[0] in DS_TOP:
                    fix = f"move {loc[0]!r} to the top level of the file (DeepSpeed reads it there)"
                problems.append(
                    Problem(path, "is not a key DeepSpeed knows (DeepSpeed refuses the file)", fix)
                )
            else:
                got = err.get("input")
                problems.append(
                    Problem(
                        path,
                        f"{got!r}: {err.get('msg', 'invalid')} (DeepSpeed's check)",
                        "write a value DeepSpeed accepts (see its config docs)",
                    )
                )
        return problems
    except Exception as exc:  # noqa: BLE001 - validators may raise plain errors
        return [
            Problem(
                f"{name}:{prefix.rstrip('.')}",
                f"DeepSpeed rejects it: {_first_line(exc)}",
                "fix the value named in the message",
            )
        ]
    return []


def _deprecations(model, data: dict, prefix: str, name: str) -> list[Problem]:
    """Deprecated field names (DeepSpeed still maps them, with a warning): say what replaces them."""
    problems = []
    by_key = {}
    for fname, field in model.model_fields.items():
        by_key[fname] = field
        if field.alias:
            by_key[field.alias] = field
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


def removed_top_level_keys() -> set[str]:
    """Top-level blocks the installed DeepSpeed refuses as removed features."""
    from deepspeed.runtime import config as ds_config

    return set(getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {}))


def check_deepspeed_sections(cfg: dict, name: str) -> list[Problem]:
    """Removed keys, zero_optimization and the precision blocks, judged by DeepSpeed's classes."""
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    problems: list[Problem] = []
    removed_top = getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})
    removed_zero = getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {})
    version = deepspeed_version()
    for key, message in removed_top.items():
        if key in cfg:
            problems.append(
                Problem(
                    f"{name}:{key}",
                    f"was removed from DeepSpeed ({version} refuses the file): "
                    + message.split(" See ")[0].strip(),
                    "remove it",
                )
            )
    zero = cfg.get("zero_optimization")
    if isinstance(zero, dict):
        for key, message in removed_zero.items():
            if key in zero:
                problems.append(
                    Problem(
                        f"{name}:zero_optimization.{key}",
                        f"was removed from DeepSpeed ({version} refuses the file): "
                        + message.split(" See ")[0].strip(),
                        "remove it",
                    )
                )
        clean = {k: v for k, v in zero.items() if k not in removed_zero}
        problems += _validate_model(DeepSpeedZeroConfig, clean, "zero_optimization.", name)
        problems += _deprecations(DeepSpeedZeroConfig, clean, "zero_optimization.", name)
    # "zero_optimization": true is DeepSpeed's legacy form (read_zero_config_deprecated): valid.
    for key, model in (
        ("bf16", DeepSpeedBF16Config),
        ("bfloat16", DeepSpeedBF16Config),
        ("fp16", DeepSpeedFP16Config),
    ):
        block = cfg.get(key)
        if isinstance(block, dict):
            problems += _validate_model(model, block, key + ".", name)
    return problems


def check_deepspeed_whole(cfg: dict, name: str, world: int) -> list[Problem]:
    """Run DeepSpeed's full ``DeepSpeedConfig`` over ``cfg`` as a ``world``-process job would.

    ``cfg`` must already hold numbers where "auto" was (check substitutes what the client fills).
    """
    from unittest import mock

    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        with (
            _quiet(),
            mock.patch("deepspeed.comm.get_rank", return_value=0),
            mock.patch("deepspeed.comm.get_world_size", return_value=world),
        ):
            DeepSpeedConfig(cfg)
    except Exception as exc:  # noqa: BLE001 - DeepSpeed raises asserts, ValueError, its own errors
        return [
            Problem(
                name,
                f"DeepSpeed rejects it: {_first_line(exc)}",
                "fix the value named in the message",
            )
        ]
    return []


# --------------------------------------------------------------------------- accelerate YAML
def accelerate_top_keys() -> set[str]:
    """Keys accelerate's loader takes: ClusterConfig's fields plus the legacy ones process_config converts."""
    from accelerate.commands.config.config_args import ClusterConfig

    return set(ClusterConfig.__dataclass_fields__) | {"fp16", "dynamo_backend"}


def launch_flags() -> set[str]:
    """Every ``accelerate launch`` option name without dashes (what nested YAML keys become)."""
    from accelerate.commands.launch import launch_command_parser

    return {o.lstrip("-") for a in launch_command_parser()._actions for o in a.option_strings}


# Nested sections whose keys become launch arguments, and the prefix accelerate adds
# (commands/launch.py `_validate_launch_command`: fsdp_/fp8_/dynamo_ prefixes).
_NESTED = {
    "deepspeed_config": "",
    "fsdp_config": "fsdp_",
    "fp8_config": "fp8_",
    "dynamo_config": "dynamo_",
    "megatron_lm_config": "",
    "mpirun_config": "",
}
# YAML deepspeed_config key -> the zero_optimization path DeepSpeedPlugin writes it to
# (accelerate utils/dataclasses.py DeepSpeedPlugin.__post_init__ `plugin_to_config_mapping`).
_PLUGIN_TO_ZERO = {
    "zero_stage": ("stage",),
    "offload_optimizer_device": ("offload_optimizer", "device"),
    "offload_param_device": ("offload_param", "device"),
    "offload_optimizer_nvme_path": ("offload_optimizer", "nvme_path"),
    "offload_param_nvme_path": ("offload_param", "nvme_path"),
}
_BOOL_KEYS = ("zero3_init_flag", "zero3_save_16bit_model")


def check_accelerate_loader(cfg: dict, name: str) -> list[Problem]:
    """Keys and values as accelerate's loader and launcher judge them."""
    problems: list[Problem] = []
    top = accelerate_top_keys()
    for key in cfg:
        if not isinstance(key, str) or key not in top:
            problems.append(
                Problem(
                    f"{name}:{key}",
                    "is not a key accelerate knows (its loader refuses the file)",
                    _near(str(key), top),
                )
            )
    flags = launch_flags()
    for section, prefix in _NESTED.items():
        block = cfg.get(section)
        if not isinstance(block, dict):
            continue
        for key in block:
            flag = str(key) if str(key).startswith(prefix) else prefix + str(key)
            if flag not in flags:
                known = sorted(f for f in flags if f.startswith(prefix or section.split("_")[0]))
                problems.append(
                    Problem(
                        f"{name}:{section}.{key}",
                        "is not an accelerate launch setting (accelerate ignores it silently)",
                        _near(flag, known or flags),
                    )
                )
    if not problems:
        problems += _load(cfg, name)
    ds = cfg.get("deepspeed_config")
    if isinstance(ds, dict):
        problems += _check_plugin_values(ds, name)
    return problems


def _load(cfg: dict, name: str) -> list[Problem]:
    import copy

    from accelerate.commands.config.config_args import ClusterConfig

    data = copy.deepcopy(cfg)
    try:
        with _quiet():
            ClusterConfig(**ClusterConfig.process_config(data))
    except (
        Exception
    ) as exc:  # noqa: BLE001 - enum conversions raise ValueError, bad kwargs TypeError
        return [
            Problem(
                name,
                f"accelerate's loader refuses it: {_first_line(exc)}",
                "fix the value named in the message (compare with `accelerate config`)",
            )
        ]
    return []


def _check_plugin_values(ds: dict, name: str) -> list[Problem]:
    """The DeepSpeed values of an accelerate YAML, converted and validated as the run would."""
    from accelerate.utils import str_to_bool

    problems: list[Problem] = []
    for key in _BOOL_KEYS:
        value = ds.get(key)
        if value is None or isinstance(value, bool):
            continue
        try:
            str_to_bool(str(value))
        except ValueError:
            problems.append(
                Problem(
                    f"{name}:deepspeed_config.{key}",
                    f"{value!r} is not true/false " "(accelerate's str_to_bool raises at start-up)",
                    f"set {key}: true or false",
                )
            )
    if ds.get("deepspeed_config_file"):
        return problems  # the JSON holds the ZeRO settings; check reads it separately
    zero: dict[str, Any] = {}
    for key, path in _PLUGIN_TO_ZERO.items():
        if key in ds and ds[key] is not None:
            value = ds[key]
            if key == "zero_stage" and isinstance(value, str) and value.isdigit():
                value = int(value)  # accelerate passes it through the environment as text
            node = zero
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = value
    if zero:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        reverse = {".".join(v): k for k, v in _PLUGIN_TO_ZERO.items()}
        for p in _validate_model(DeepSpeedZeroConfig, zero, "", "\0"):
            inner = p.path.split(":", 1)[1]
            key = reverse.get(inner, inner)
            problems.append(Problem(f"{name}:deepspeed_config.{key}", p.message, p.fix, p.severity))
    return problems
