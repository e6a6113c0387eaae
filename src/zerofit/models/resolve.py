"""Model shapes and exact parameter counts: built-in names, config.json files, model dirs, hub ids.

Known families (llama, mistral, qwen2, qwen3, mixtral, qwen3_moe) are counted with a closed formula
that mirrors the transformers modules parameter for parameter; any other architecture is
instantiated on the meta device (no weights, no memory) and its unique parameters summed, cached on
disk because importing transformers costs seconds. Nothing here imports torch, transformers or
huggingface_hub at import.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from zerofit.cache import cache_file, read_cache, store_in_cache
from zerofit.errors import ZerofitError
from zerofit.model_classes import training_auto_class
from zerofit.models.builtin import BUILTIN_CONFIGS as _BUILTIN


@dataclass(frozen=True)
class ModelSpec:
    """What the planner needs to know about a model: its shape and exact parameter counts."""

    name: str
    architecture: str  # transformers model_type, e.g. "qwen2", "qwen3_moe"
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_embeddings: bool
    params: int  # total parameters, exact (tied embeddings counted once)
    active_params: int  # used per token: == params when dense; MoE: all but unselected experts
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    # the config.json it was read from (sorted JSON text): memory/layer_trace.py traces the
    # decoder layers of architectures without a closed formula from it
    config_json: str = field(default="", compare=False, repr=False)


def param_count_words(count: int) -> str:
    """A parameter count as people write it: '7.62B', '12.3M', '9,216'.

    Billions keep two decimals (the precision model cards use); below 0.1B that would print a tiny
    model as '0.00B', so millions, and below 100k the plain count.
    """
    if count >= 100_000_000:
        return f"{count / 1e9:.2f}B"
    if count >= 100_000:
        return f"{count / 1e6:.1f}M"
    return f"{count:,}"


# transformers' defaults (its 5.x config classes) for fields a hand-written config.json may leave
# out; a key present with null means "same as num_attention_heads", as those classes do.
_DEFAULTS: dict[str, dict] = {
    "llama": {"num_key_value_heads": None},
    "mistral": {"num_key_value_heads": 8},
    "qwen2": {"num_key_value_heads": 32},
    "qwen3": {"num_key_value_heads": 32, "head_dim": 128},
    "mixtral": {"num_key_value_heads": 8, "num_experts": 8, "num_experts_per_tok": 2},
    "qwen3_moe": {
        "num_key_value_heads": 4,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "decoder_sparse_step": 1,
    },
}
_REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
)
# bump when what a meta-device count records changes (2: T5 and DeBERTa-v2 counted with their
# LM heads, T5's d_ff / d_kv read as its widths; 3: encoder-decoders counted as their seq2seq LM,
# BART's encoder included)
_CACHE_VERSION = "3"


def count_params_analytic(config: dict, where: str = "config.json") -> dict | None:
    """Shape fields + exact ``params``/``active_params`` for a known family, else None.

    Per layer: q/k/v/o projections (qwen2: q/k/v biases; llama/qwen3: all four when attention_bias),
    qwen3 q_norm/k_norm over head_dim, two RMSNorms, then a SwiGLU MLP (llama: biases when mlp_bias)
    or a router plus ``num_experts`` SwiGLU experts. Plus embeddings, final norm and an lm_head that
    shares the embedding when ``tie_word_embeddings``.
    """
    family = config.get("model_type")
    if family not in _DEFAULTS:
        return None
    c = {**_DEFAULTS[family], **config}
    h, inter, layers, heads, vocab = (_positive(c, k, where) for k in _REQUIRED)
    kv = (
        _positive(c, "num_key_value_heads", where)
        if c["num_key_value_heads"] is not None
        else heads
    )
    hd = _positive(c, "head_dim", where) if c.get("head_dim") else h // heads
    tie = bool(c.get("tie_word_embeddings", False))
    q, k = heads * hd, kv * hd
    attn = h * q + 2 * h * k + q * h
    if family == "qwen2":
        attn += q + 2 * k
    elif family in ("llama", "qwen3", "qwen3_moe") and c.get("attention_bias"):
        attn += q + 2 * k + h
    if family in ("qwen3", "qwen3_moe"):
        attn += 2 * hd
    dense_mlp = 3 * h * inter + (2 * inter + h if family == "llama" and c.get("mlp_bias") else 0)
    experts = top_k = moe_inter = 0
    if family in ("mixtral", "qwen3_moe"):
        experts = _positive(
            c, "num_local_experts" if "num_local_experts" in c else "num_experts", where
        )
        top_k = _positive(c, "num_experts_per_tok", where)
        moe_inter = inter if family == "mixtral" else _positive(c, "moe_intermediate_size", where)
    if family == "qwen3_moe":
        dense_only, step = set(c.get("mlp_only_layers") or []), _positive(
            c, "decoder_sparse_step", where
        )
        sparse = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    else:
        sparse = layers if experts else 0
    expert = 3 * h * moe_inter
    total = (
        layers * (attn + 2 * h)
        + (layers - sparse) * dense_mlp
        + sparse * (experts * h + experts * expert)
        + vocab * h * (1 if tie else 2)
        + h
    )
    active = total - sparse * (experts - top_k) * expert
    return dict(
        architecture=family,
        hidden_size=h,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        vocab_size=vocab,
        tie_embeddings=tie,
        params=total,
        active_params=active,
        num_experts=experts,
        experts_per_token=top_k,
        moe_intermediate_size=moe_inter,
    )


def count_params_meta(config: dict, where: str = "config.json") -> dict:
    """Shape fields + exact counts for any transformers architecture: build it on the meta device.

    Routed-expert parameters are those under a module named ``experts`` (fused 3-D tensors or one
    module per expert); the active count keeps top-k of them. Slow (imports transformers): see
    ``count_params``, which caches this.
    """
    import torch
    import transformers
    from transformers import AutoConfig

    model_type = config.get("model_type")
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # config sanity warnings are noise for a count
    try:
        cfg = AutoConfig.for_model(
            model_type, **{k: v for k, v in config.items() if k != "model_type"}
        )
        with torch.device("meta"):
            model = training_model_class(cfg).from_config(cfg)
    except Exception as err:  # transformers raises many types for unknown or inconsistent configs
        raise _meta_failure(config, where, err, transformers.__version__) from err
    finally:
        transformers.logging.set_verbosity(verbosity)
    total = routed = 0
    for name, p in model.named_parameters():  # deduplicates tied weights
        total += p.numel()
        routed += p.numel() if "experts" in name.split(".") else 0
    text = cfg.get_text_config()  # multimodal configs keep the language model's shape here

    def get(*keys: str, default: int = 0) -> int:  # architectures name the same field differently
        return next((getattr(text, k) for k in keys if getattr(text, k, None)), default)

    h, heads = get("hidden_size"), get("num_attention_heads", default=1)
    experts, top_k = get("num_experts", "num_local_experts", "n_routed_experts"), get(
        "num_experts_per_tok"
    )
    active = total - routed * (experts - top_k) // experts if routed and experts else total
    return dict(
        architecture=model_type,
        hidden_size=h,
        # GPT-2's n_inner (None: 4 x n_embd, GPT2Block), T5's d_ff and d_kv
        intermediate_size=get("intermediate_size", "n_inner", "d_ff", default=4 * h),
        num_layers=get("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=get("num_key_value_heads", default=heads),
        head_dim=get("head_dim", "d_kv", default=h // heads),
        vocab_size=get("vocab_size"),
        tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        params=total,
        active_params=active,
        num_experts=experts if routed else 0,
        experts_per_token=top_k if routed else 0,
        moe_intermediate_size=get("moe_intermediate_size", "intermediate_size") if routed else 0,
    )


def training_model_class(config):
    """The transformers class a model of ``config`` (a config object) trains as
    (``model_classes.training_auto_class``), else the bare model (some multimodal models)."""
    from transformers import AutoModel

    return training_auto_class(config) or AutoModel


def _positive(config: dict, key: str, where: str) -> int:
    """``config[key]`` as a positive int, else a one-line error naming the field."""
    if key not in config or config[key] is None:
        raise ZerofitError(
            "model", f"{where} has no \"{key}\"", f"add \"{key}\" (a positive integer) to it"
        )
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ZerofitError(
            "model",
            f"{where}: \"{key}\" is {value!r}, not a positive integer",
            f"set \"{key}\" to the model's value",
        )
    return value


def _meta_failure(config: dict, where: str, err: Exception, version: str) -> ZerofitError:
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        remote = (
            " (it needs trust_remote_code, which zerofit never runs)"
            if "auto_map" in config
            else ""
        )
        if remote:  # custom code in the repo: a newer transformers would not know it either
            return ZerofitError(
                "model",
                f"{where}: architecture {model_type!r} ships its own code{remote}",
                "use the transformers-native port of the model (e.g. Qwen2 for "
                "Qwen v1) or a built-in name with the same shape",
            )
        return ZerofitError(
            "model",
            f"{where}: architecture {model_type!r} is unknown to transformers " f"{version}",
            "upgrade transformers, or use a transformers-native config or a built-in name",
        )
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    return ZerofitError(
        "model",
        f"{where}: transformers cannot build {model_type!r}: {detail}",
        "fix the config values it names",
    )


def cache_path() -> Path:
    """Where meta-device counts are cached: ``$XDG_CACHE_HOME/zerofit/params.json``.

    ``$XDG_CACHE_HOME`` defaults to ``~/.cache``.
    """
    return cache_file("params.json")


def _cache_key(config: dict) -> str:
    from importlib.metadata import version

    # Bookkeeping keys differ between copies of the same model; the transformers version can change
    # modules.
    kept = {
        k: v for k, v in config.items() if not k.startswith("_") and k != "transformers_version"
    }
    blob = json.dumps([_CACHE_VERSION, version("transformers"), kept], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


# Models whose code lives in their hub repo (``auto_map``, trust_remote_code): zerofit never runs
# that code, it reads the shape fields. Qwen v1 (Qwen/Qwen-7B modeling_qwen.py: QWenAttention
# c_attn = Linear(h, 3 * kv_channels * heads, bias) and c_proj without bias; QWenMLP w1/w2 of
# intermediate_size // 2 and c_proj back; RMSNorm ln_1/ln_2/ln_f; untied lm_head) and Baichuan
# (baichuan-inc modeling_baichuan.py: W_pack = Linear(h, 3h, bias=False), o_proj, a LLaMA MLP,
# RMSNorms; lm_head or NormHead of V x h, untied).
# ChatGLM2/3 and GLM-4 (THUDM modeling_chatglm.py) name their fields their own way: num_layers,
# ffn_hidden_size, kv_channels, multi_query_group_num, padded_vocab_size; query_key_value =
# Linear(h, q + 2 kv, bias=add_qkv_bias), dense back without bias, dense_h_to_4h of 2 x ffn (the
# SwiGLU pair) and dense_4h_to_h, RMSNorms, an untied output_layer.
_REMOTE_CODE_FAMILIES = ("qwen", "baichuan", "chatglm")


@dataclass(frozen=True)
class _DenseShape:
    """The shape fields of a dense (no MoE) decoder read from a trust_remote_code config.json."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie: bool


def _chatglm_shape(config: dict, where: str) -> dict:
    """Shape fields + exact counts of a ChatGLM2/3 / GLM-4 config.json."""
    h, ffn = _positive(config, "hidden_size", where), _positive(config, "ffn_hidden_size", where)
    layers, heads = _positive(config, "num_layers", where), _positive(
        config, "num_attention_heads", where
    )
    vocab = _positive(config, "padded_vocab_size", where)
    hd = _positive(config, "kv_channels", where) if config.get("kv_channels") else h // heads
    groups = heads
    if config.get("multi_query_attention"):
        groups = _positive(config, "multi_query_group_num", where)
    q, kv = heads * hd, groups * hd
    qkv_bias = (q + 2 * kv) if config.get("add_qkv_bias", config.get("add_bias_linear")) else 0
    layer = h * (q + 2 * kv) + qkv_bias + q * h + h * 2 * ffn + ffn * h + 2 * h
    total = layers * layer + 2 * vocab * h + h
    shape = _DenseShape(h, ffn, layers, heads, groups, hd, vocab, tie=False)
    return _dense_record("chatglm", shape, total)


def _dense_record(family: str, shape: _DenseShape, params: int) -> dict:
    """The count record of a dense (no MoE) model of ``shape`` with ``params`` parameters."""
    return dict(
        architecture=family,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_layers=shape.layers,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        vocab_size=shape.vocab,
        tie_embeddings=shape.tie,
        params=params,
        active_params=params,
        num_experts=0,
        experts_per_token=0,
        moe_intermediate_size=0,
    )


def count_params_remote_code(config: dict, where: str = "config.json") -> dict | None:
    """Shape fields + exact counts for a trust_remote_code family, read from config.json."""
    family = config.get("model_type")
    if family not in _REMOTE_CODE_FAMILIES:
        return None
    if family == "chatglm":
        return _chatglm_shape(config, where)
    h, inter, layers, heads, vocab = (_positive(config, k, where) for k in _REQUIRED)
    tie = bool(config.get("tie_word_embeddings", False))
    if family == "qwen":
        hd = _positive(config, "kv_channels", where) if config.get("kv_channels") else h // heads
        proj, mlp = heads * hd, inter // 2
        attn = h * 3 * proj + 3 * proj + proj * h + (0 if config.get("no_bias", True) else h)
        dense = 3 * h * mlp
    else:
        hd, proj, mlp = h // heads, h, inter
        attn, dense = 4 * h * h, 3 * h * inter
    total = layers * (attn + dense + 2 * h) + vocab * h * (1 if tie else 2) + h
    return _dense_record(family, _DenseShape(h, mlp, layers, heads, heads, hd, vocab, tie), total)


def count_params(config: dict, where: str = "config.json") -> dict:
    """Shape fields + exact counts: the closed formula for known families (and the
    trust_remote_code families zerofit reads), else meta-device build (cached)."""
    record = count_params_analytic(config, where) or count_params_remote_code(config, where)
    if record is not None:
        return record
    if not config.get("model_type"):
        raise ZerofitError(
            "model",
            f"{where} has no \"model_type\"",
            "add it (e.g. \"llama\"); every transformers config.json carries one",
        )
    path, key = cache_path(), _cache_key(config)
    cached = read_cache(path).get(key)
    record_fields = {f.name for f in fields(ModelSpec)} - {"name", "config_json"}
    if isinstance(cached, dict) and set(cached) == record_fields:
        return cached
    record = count_params_meta(config, where)
    store_in_cache(path, key, record)
    return record


def spec_from_config(config: dict, name: str, where: str = "config.json") -> ModelSpec:
    """The ModelSpec for a parsed config.json; ``where`` names its source in error messages."""
    if not isinstance(config, dict):
        raise ZerofitError(
            "model", f"{where} is not a JSON object", "point at a transformers config.json"
        )
    shape = count_params(config, where)
    return ModelSpec(name=name, config_json=json.dumps(config, sort_keys=True), **shape)


BUILTIN_MODELS: dict[str, ModelSpec] = {n: spec_from_config(c, n) for n, (_, c) in _BUILTIN.items()}
_HUB_ALIASES: dict[str, str] = {hub.lower(): n for n, (ids, _) in _BUILTIN.items() for hub in ids}


def model_names() -> list[str]:
    """Built-in model names (lowercase), in table order: family by family, small to large."""
    return list(BUILTIN_MODELS)


def builtin_config(name: str) -> dict:
    """A copy of the config.json fields stored for a built-in model (name or hub id, any case)."""
    key = _HUB_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in _BUILTIN:
        raise ZerofitError("model", f"{name!r} is not a built-in model", _suggest(name))
    return json.loads(json.dumps(_BUILTIN[key][1]))


def resolve_model(ref: str) -> ModelSpec:
    """Resolve a built-in name or its hub id, a config.json path, a model directory, or a hub id.

    Hub ids outside the table download only ``config.json`` (huggingface_hub, imported here).
    """
    ref = (ref or "").strip()
    if not ref:
        raise ZerofitError("model", "no model given", _suggest(""))
    key = ref.lower()
    if key in BUILTIN_MODELS or key in _HUB_ALIASES:
        return BUILTIN_MODELS[_HUB_ALIASES.get(key, key)]
    path = Path(ref).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ZerofitError(
                "model",
                f"directory {ref} has no config.json",
                "point at a model directory saved by transformers, or at its config.json",
            )
    elif not path.is_file():
        if ref.startswith(("/", ".", "~")) or ref.endswith(".json") or ref.count("/") > 1:
            raise ZerofitError("model", f"no such file or directory: {ref}", _suggest(ref))
        # An org-less name this close to a built-in is a typo, not a legacy hub id: answer at once
        # instead of spending the hub client's retries on a name that does not exist.
        if "/" not in ref and difflib.get_close_matches(key, list(BUILTIN_MODELS), n=1, cutoff=0.8):
            raise ZerofitError("model", f"{ref!r} is not a built-in model", _suggest(ref))
        return spec_from_config(_read_json(_download_config(ref)), ref, f"config.json of {ref}")
    return spec_from_config(_read_json(path), ref, str(path))


def _read_json(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ZerofitError(
            "model",
            f"cannot read {path}: {err.__class__.__name__}",
            "check the path and its permissions",
        ) from err
    try:
        return json.loads(text)
    except ValueError as err:
        raise ZerofitError(
            "model", f"{path} is not valid JSON ({err})", "fix the file, or re-download config.json"
        ) from err


HUB_TIMEOUT_S = 1.0  # seconds for the one metadata request (a reachable hub answers in ~0.2 s)


def _download_config(repo_id: str) -> Path:
    """Fetch only config.json of a hub repo; every failure becomes one ZerofitError line."""
    from huggingface_hub import errors, hf_hub_download
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except errors.HFValidationError as err:
        raise ZerofitError(
            "model",
            f"{repo_id!r} is not a built-in name, a local path or a hub id",
            _suggest(repo_id),
        ) from err
    from huggingface_hub import constants as hub_constants
    from huggingface_hub.utils import logging as hub_logging

    level, telemetry = hub_logging.get_verbosity(), hub_constants.HF_HUB_DISABLE_TELEMETRY
    hub_logging.set_verbosity_error()  # no "Retrying in 8s" lines: the answer is one line
    # the user-agent header otherwise fetches an agent registry from the hub first, with its own
    # timeout (huggingface_hub/utils/_headers.py:_http_user_agent -> _detect_agent.detect_agent)
    hub_constants.HF_HUB_DISABLE_TELEMETRY = True
    try:
        try:  # a config.json already in the hub cache answers without the network
            return Path(
                hf_hub_download(repo_id=repo_id, filename="config.json", local_files_only=True)
            )
        except errors.LocalEntryNotFoundError:
            pass
        _hub_head(repo_id)  # unreachable: one line now, not five retries
        return Path(hf_hub_download(repo_id=repo_id, filename="config.json"))
    except Exception as err:  # every failure, network ones included, becomes one line
        problem, fix = _hub_failure(repo_id, err, errors)
        raise ZerofitError("model", problem, fix) from err
    finally:
        hub_logging.set_verbosity(level)
        hub_constants.HF_HUB_DISABLE_TELEMETRY = telemetry


def _hub_head(repo_id: str) -> None:
    """One HEAD request for config.json, no retries (``get_hf_file_metadata`` defaults to
    ``retry_on_errors=False``), bounded by a hard deadline, so an unreachable hub fails in under
    2 s; ``hf_hub_download`` alone retries a file missing from the cache 5 times with back-off
    (``huggingface_hub/file_download.py``, the ``_DEFAULT_RETRY_ON_EXCEPTIONS`` branch). The
    request runs in a daemon thread because the HTTP client's own timeout applies per phase
    (connect, read, ...) and was measured at 3x the value given against a silent server."""
    import threading

    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    outcome: list = []

    def head() -> None:
        try:
            get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=HUB_TIMEOUT_S)
            outcome.append(None)
        except Exception as err:  # handed to the caller below
            outcome.append(err)

    worker = threading.Thread(target=head, daemon=True)
    worker.start()
    worker.join(HUB_TIMEOUT_S)
    if not outcome:
        raise TimeoutError(f"no answer from the hub in {HUB_TIMEOUT_S:g} s")
    if outcome[0] is not None:
        raise outcome[0]


def _hub_failure(repo_id: str, err: Exception, errors) -> tuple[str, str]:
    if isinstance(err, errors.GatedRepoError):
        return (
            f"{repo_id} is gated on the Hugging Face Hub",
            "accept its licence on the model page and run `hf auth login`, "
            "or pass a local config.json",
        )
    if isinstance(err, errors.RepositoryNotFoundError):
        return f"{repo_id!r} is not a built-in model, a local path or a model on the Hub", _suggest(
            repo_id
        )
    if isinstance(err, errors.LocalEntryNotFoundError):  # offline and not in the local hub cache
        return (
            f"cannot fetch config.json of {repo_id}: offline and not cached",
            "connect to the network, or download config.json and pass its path",
        )
    if isinstance(err, (errors.RemoteEntryNotFoundError, errors.EntryNotFoundError)):
        return f"hub repo {repo_id} has no config.json", "pass a transformers model repo"
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    if isinstance(err, (OSError, TimeoutError)) or any(
        word in type(err).__name__ for word in ("Connect", "Timeout", "Network")
    ):
        return (
            f"cannot reach the Hugging Face Hub for {repo_id} ({detail})",
            "check the network (or HF_ENDPOINT), or download config.json and pass its path",
        )
    return (
        f"cannot fetch config.json of {repo_id} ({detail})",
        "check the network and HF_HUB_OFFLINE, or download config.json and pass its path",
    )


def _suggest(ref: str) -> str:
    close = difflib.get_close_matches(
        ref.lower().split("/")[-1], list(BUILTIN_MODELS), n=3, cutoff=0.6
    )
    if close:
        return f"did you mean {' or '.join(close)}?"
    examples = ", ".join(list(BUILTIN_MODELS)[::4])
    return f"use a built-in name ({examples}, ...), a config.json, a model directory or a hub id"


__all__ = [
    "ModelSpec",
    "BUILTIN_MODELS",
    "model_names",
    "resolve_model",
    "spec_from_config",
    "builtin_config",
    "count_params",
    "count_params_analytic",
    "count_params_meta",
    "cache_path",
]
