"""Bytes a decoder layer saves for backward, traced from transformers' own modeling code.

``activations.py`` has closed formulas for the layers it was checked against (Llama, Qwen2/3,
Mistral, Mixtral, Gemma, Gemma3, OLMo2). Every other architecture transformers can build (Gemma2,
Cohere, Phi-3, GLM-4, EXAONE, StarCoder2, Falcon, BLOOM...) is traced here instead of being
estimated with a Llama-shaped layer: the model's real forward runs on fake tensors
(``torch._subclasses.fake_tensor.FakeTensorMode``: shapes and dtypes, no memory, no weights), and
``torch.autograd.graph.saved_tensors_hooks`` sees every tensor autograd keeps for backward.

The model is the one users train (``model_classes.training_auto_class``): the causal LM, else the
sequence-to-sequence LM (T5), else the masked LM (DeBERTa-v2; BERT and RoBERTa have a causal-LM
class with the same modules). For an encoder-decoder a "layer" is one encoder block and one decoder
block, both over ``s`` tokens unless the targets are given their own length (what
``activations.py`` multiplies by ``num_layers``, the encoder's depth). One layer is the mean
difference between the model at its real depth and a 1-layer model of the user's config
(embedding, final norm and the LM head cancel; layers that differ, like DeepSeek-V3's first dense
ones or Qwen3-Next's linear-attention ones, are averaged). Its bytes at sequence length ``s``
are ``C + L*s + Q*s*s``: ``C`` is constant (autocast's bf16 copies of the layer's weights,
counted by ``states.autocast_weight_bytes``), ``L`` is per token, ``Q`` is the attention scores
that eager attention keeps. Three lengths solve for the three; a micro batch of
two sequences splits ``Q`` into what each sequence keeps and what the micro batch keeps once.
An encoder-decoder whose targets are shorter than its inputs (``trace_encoder_decoder_layer``)
is traced at pairs of source and target lengths instead, so that the encoder's bytes scale with
the source, the decoder's with the target and the cross-attention's scores with both.
Nothing here runs at import; torch and transformers are imported by the trace functions only.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
from dataclasses import asdict, dataclass, fields
from importlib.metadata import PackageNotFoundError, version

from zerofit.cache import cache_file, read_cache, store_in_cache
from zerofit.model_classes import training_auto_class

# the attention implementation traced for a kernel attention (sdpa / flash): transformers' own
# sdpa function, registered under a name transformers' mask builders do not know, so that no mask
# is built (masking_utils._preprocess_mask_arguments: an implementation without a mask function
# gets ``None``), exactly what a training batch without padding gets on a GPU (the causal mask is
# skipped and sdpa runs ``is_causal`` with ``enable_gqa``: sdpa_attention.use_gqa_in_sdpa)
KERNEL_ATTENTION = "zerofit_kernel"
# bump when what a trace records changes: older cache entries are then ignored
TRACE_CACHE_VERSION = "5"  # 5: encoder-decoders trace their seq2seq LM (BART)
UNTRACEABLE = "untraceable"  # cached too: no reason to import transformers again to fail again
# sequence lengths traced (any three distinct lengths solve C + L*s + Q*s*s exactly)
TRACE_LENGTHS = (64, 128, 256)


@dataclass(frozen=True)
class LayerTrace:
    """What one decoder layer keeps for backward: ``per_token`` bytes for each token and
    ``scores`` bytes per sequence per ``seq_len**2`` (eager attention's score tensors).
    ``attention`` is the implementation traced (``eager`` or ``kernel``: sdpa / flash) and
    ``flash`` whether the model class supports flash attention at all. ``shared_scores``: bytes
    per ``seq_len**2`` that one micro batch keeps once, whatever its size (DeBERTa-v2's
    relative-position indices, T5's position-bias mask of batch 1)."""

    per_token: int
    scores: int
    attention: str
    flash: bool
    shared_scores: int = 0


@functools.lru_cache(maxsize=64)
def trace_decoder_layer(
    config_json: str, a: int, attention: str, residual: int
) -> LayerTrace | None:
    """Trace one decoder layer of the model ``config_json`` describes (a config.json's text).

    ``a``: compute dtype bytes (2: bf16, 4: fp32); ``residual`` 4 with ``a`` 2: fp32 weights under
    bf16 autocast (training without DeepSpeed). ``attention``: what the user asked for; a model
    class without sdpa support runs eager when sdpa is asked (what transformers picks by default,
    ``PreTrainedModel._check_and_adjust_attn_implementation``), and flash kernels save what
    sdpa's kernel saves (q, k, v, the output and its log-sum-exp). None when transformers cannot
    build or run the architecture on fake tensors (remote code, data-dependent routing): the
    caller keeps its Llama-shaped formula. Cached on disk (``cache.py``: ``layer_traces.json``,
    keyed by the config and the transformers and torch versions), since importing transformers
    costs seconds.
    """
    return _cached_trace(LayerTrace, _trace, (), config_json, a, attention, residual)


def _cached_trace(
    trace_class: type, build, kind: tuple, config_json: str, a: int, attention: str, residual: int
):
    """``build(config_json, a, attention, residual)`` once per arguments and installed
    transformers and torch, kept in ``layer_traces.json`` as a ``trace_class`` (or as
    UNTRACEABLE); ``kind`` tells apart traces of one config. None where the training stack is
    not installed: zerofit's planning works without it."""
    try:
        versions = [version("transformers"), version("torch")]
    except PackageNotFoundError:
        return None
    path = cache_file("layer_traces.json")
    blob = json.dumps([TRACE_CACHE_VERSION, *kind, versions, config_json, a, attention, residual])
    key = hashlib.sha256(blob.encode()).hexdigest()
    cached = read_cache(path).get(key)
    if isinstance(cached, dict) and set(cached) == {f.name for f in fields(trace_class)}:
        return trace_class(**cached)
    if cached == UNTRACEABLE:
        return None
    trace = build(config_json, a, attention, residual)
    store_in_cache(path, key, asdict(trace) if trace else UNTRACEABLE)
    return trace


def _trace(config_json: str, a: int, attention: str, residual: int) -> LayerTrace | None:
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # config sanity warnings are noise here
    try:
        config = _model_config(json.loads(config_json))
        model_class = _training_auto_class(config)._model_mapping[type(config)]
        implementation = _implementation(model_class, attention)
        depth = max(2, config.num_hidden_layers)
        sizes = {
            (layers, s): _saved_bytes(config, layers, (s, s), a, residual, implementation)
            for layers in (1, depth)
            for s in TRACE_LENGTHS
        }
        longest = TRACE_LENGTHS[-1]
        two_sequences = [
            _saved_bytes(config, layers, (longest, longest), a, residual, implementation, batch=2)
            for layers in (1, depth)
        ]
    except Exception:  # transformers and torch raise many types for what they cannot build or run
        return None
    finally:
        transformers.logging.set_verbosity(verbosity)
    # the mean layer after the first: models whose layers differ (DeepSeek-V3's first dense
    # layers, Qwen3-Next's linear-attention layers) are averaged over their real depth
    one_layer = [(sizes[(depth, s)] - sizes[(1, s)]) / (depth - 1) for s in TRACE_LENGTHS]
    per_token, scores = _solve(TRACE_LENGTHS, one_layer)
    # the second sequence of a micro batch adds its tokens and its own scores, not the shared
    # seq x seq tensors (the constant, autocast's weight copies, cancels too)
    second = (two_sequences[1] - two_sequences[0]) / (depth - 1) - one_layer[-1]
    own_scores = min(scores, round((second - per_token * longest) / longest**2))
    if per_token <= 0 or scores < 0 or own_scores < 0:
        return None
    flash = bool(getattr(model_class, "_supports_flash_attn", False))
    kind = "eager" if implementation == "eager" else "kernel"
    return LayerTrace(per_token, own_scores, kind, flash, scores - own_scores)


@dataclass(frozen=True)
class EncoderDecoderTrace:
    """What one layer of an encoder-decoder (one encoder block and one decoder block, as in
    ``LayerTrace``) keeps for backward when its ``s`` source and ``t`` target tokens differ.

    Per token: ``source_per_token`` (the encoder block's tensors, and the decoder's
    cross-attention keys and values, projected from every encoder token: ``T5Attention.forward``
    with ``key_value_states``) and ``target_per_token`` (the decoder block's own: self-attention,
    the cross-attention's queries and output, the feed-forward). Per sequence, the score-shaped
    tensors eager attention (or T5's relative position bias, a float mask under sdpa) keeps:
    ``source_scores`` per ``s*s`` (encoder self-attention), ``target_scores`` per ``t*t`` (decoder
    self-attention), ``cross_scores`` per ``t*s`` (cross-attention: queries over the targets,
    keys over the source); the ``shared_`` ones are what a micro batch keeps once."""

    source_per_token: int
    target_per_token: int
    source_scores: int
    target_scores: int
    cross_scores: int
    shared_source_scores: int
    shared_target_scores: int
    shared_cross_scores: int

    def layer_bytes(self, micro_batch: int, source_len: int, target_len: int) -> int:
        """Bytes one layer keeps for ``micro_batch`` pairs of ``source_len`` and ``target_len``
        tokens."""
        per_token = self.source_per_token * source_len + self.target_per_token * target_len
        source = (self.source_scores * micro_batch + self.shared_source_scores) * source_len**2
        target = (self.target_scores * micro_batch + self.shared_target_scores) * target_len**2
        cross = (self.cross_scores * micro_batch + self.shared_cross_scores) * (
            source_len * target_len
        )
        return micro_batch * per_token + source + target + cross


@functools.lru_cache(maxsize=64)
def trace_encoder_decoder_layer(
    config_json: str, a: int, attention: str, residual: int
) -> EncoderDecoderTrace | None:
    """Trace one layer of the encoder-decoder ``config_json`` describes with source and target
    lengths apart (the arguments and the cache as ``trace_decoder_layer``'s). None when the model
    is no encoder-decoder or cannot be traced: the caller keeps the equal-length layer."""
    return _cached_trace(
        EncoderDecoderTrace,
        _trace_encoder_decoder,
        ("encoder_decoder",),
        config_json,
        a,
        attention,
        residual,
    )


def _trace_encoder_decoder(
    config_json: str, a: int, attention: str, residual: int
) -> EncoderDecoderTrace | None:
    """One layer's bytes ``f(s, t) = C + A*s + B*t + Qe*s*s + Qd*t*t + Qx*s*t`` (the terms
    ``EncoderDecoderTrace`` names) solved from traces at a row of source lengths with the
    shortest target, a column of target lengths with the shortest source, and one mixed point;
    then a micro batch of two at three points splits each ``Q`` into what each sequence keeps
    and what the micro batch keeps once."""
    import transformers

    shortest, middle, longest = TRACE_LENGTHS
    row = [(s, shortest) for s in TRACE_LENGTHS]
    column = [(shortest, t) for t in TRACE_LENGTHS]
    apart = [(longest, shortest), (shortest, longest), (longest, longest)]
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        config = _model_config(json.loads(config_json))
        if not getattr(config, "is_encoder_decoder", False):
            return None
        model_class = _training_auto_class(config)._model_mapping[type(config)]
        implementation = _implementation(model_class, attention)
        depth = max(2, config.num_hidden_layers)

        def one_layer(lengths: tuple[int, int], batch: int = 1) -> float:
            sizes = [
                _saved_bytes(config, layers, lengths, a, residual, implementation, batch)
                for layers in (1, depth)
            ]
            return (sizes[1] - sizes[0]) / (depth - 1)

        single = {lengths: one_layer(lengths) for lengths in {*row, *column, *apart, (middle,) * 2}}
        pairs = {lengths: one_layer(lengths, batch=2) for lengths in apart}
    except Exception:  # as in _trace: what transformers or torch cannot build or run
        return None
    finally:
        transformers.logging.set_verbosity(verbosity)
    source_slope, source_scores = _quadratic(TRACE_LENGTHS, [single[p] for p in row])
    target_slope, target_scores = _quadratic(TRACE_LENGTHS, [single[p] for p in column])
    step = middle - shortest
    mixed = single[(middle, middle)] - single[(middle, shortest)] - single[(shortest, middle)]
    cross_scores = (mixed + single[(shortest, shortest)]) / step**2
    # the row's slope over s holds the cross term at t = shortest, the column's likewise
    source_per_token = source_slope - cross_scores * shortest
    target_per_token = target_slope - cross_scores * shortest
    # what the second sequence adds beyond its tokens: its own scores (the shared ones once)
    second = [
        pairs[(s, t)] - single[(s, t)] - source_per_token * s - target_per_token * t
        for s, t in apart
    ]
    own = _own_scores(second, shortest, longest)
    solved = (source_scores, target_scores, cross_scores)
    if source_per_token <= 0 or target_per_token <= 0 or min(solved) < -0.5:
        return None
    totals = [max(0.0, total) for total in solved]  # -0.5 < total < 0: rounding, not bytes
    kept = [min(total, max(0.0, part)) for total, part in zip(totals, own, strict=True)]
    return EncoderDecoderTrace(
        round(source_per_token),
        round(target_per_token),
        *(round(part) for part in kept),
        *(round(total - part) for total, part in zip(totals, kept, strict=True)),
    )


def _own_scores(second: list[float], short: int, long: int) -> tuple[float, float, float]:
    """Each sequence's own ``(Qe, Qd, Qx)`` from what a second sequence adds beyond its tokens at
    (long, short), (short, long) and (long, long): ``g = Qe*s*s + Qd*t*t + Qx*s*t`` at each,
    solved in closed form."""
    at_long_short, at_short_long, at_long_long = second
    cross = (
        at_long_long * (long**2 + short**2) / long**2 - at_long_short - at_short_long
    ) / (long - short) ** 2
    both = at_long_long / long**2 - cross  # Qe + Qd
    apart = (at_long_short - at_short_long) / (long**2 - short**2)  # Qe - Qd
    return (both + apart) / 2, (both - apart) / 2, cross


def _implementation(model_class, attention: str) -> str:
    """The attention implementation to trace for the user's ``attention``: transformers runs eager
    for a model class without the kernel asked for (sdpa: its default when the class has no sdpa,
    ``PreTrainedModel._check_and_adjust_attn_implementation``; flash: a class without it refuses
    to load, and its sdpa, else eager, is what the user can run)."""
    sdpa = getattr(model_class, "_supports_sdpa", False)
    flash = getattr(model_class, "_supports_flash_attn", False)
    if attention == "eager" or not (sdpa or (flash and attention.startswith("flash"))):
        return "eager"
    return _register_kernel_attention()


@functools.cache
def _register_kernel_attention() -> str:
    """Register ``KERNEL_ATTENTION`` with transformers' ``AttentionInterface`` (once)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def kernel_attention(module, query, key, value, attention_mask, **kwargs):
        # flash kernels apply Gemma2's soft-capping inside the kernel; sdpa refuses the argument,
        # and the tensors saved for backward are the same without it
        kwargs.pop("softcap", None)
        # GPU kernels drop attention weights inside the kernel and keep only the RNG state; the
        # CPU's sdpa would fall back to its math path and keep seq x seq masks (GPT-2, BERT and
        # T5 train with attention dropout 0.1 by default)
        kwargs["dropout"] = 0.0
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)

    AttentionInterface.register(KERNEL_ATTENTION, kernel_attention)
    return KERNEL_ATTENTION


def _training_auto_class(config):
    """``model_classes.training_auto_class``; a KeyError when transformers has none of the three
    (the caller then keeps the Llama-shaped layer)."""
    auto_class = training_auto_class(config)
    if auto_class is None:
        raise KeyError(type(config).__name__)
    return auto_class


def _model_config(config: dict):
    """transformers' config object for ``config`` (a config.json's fields)."""
    from transformers import AutoConfig

    # layer_types lists one entry per layer (the config class rebuilds it for another depth);
    # keys starting with "_" are bookkeeping (_name_or_path, zerofit's _source)
    fields = {
        k: v
        for k, v in config.items()
        if k not in ("model_type", "layer_types") and not k.startswith("_")
    }
    return AutoConfig.for_model(config["model_type"], **fields)


def _saved_bytes(
    config,
    layers: int,
    lengths: tuple[int, int],
    a: int,
    residual: int,
    implementation: str,
    batch: int = 1,
) -> int:
    """Bytes of the distinct storages autograd saves in one forward of a ``layers``-layer model
    of ``config`` (a config object, left unchanged), ``batch`` sequences of ``lengths``: (input
    tokens, an encoder-decoder's target tokens; a decoder-only model reads the first), weights
    excluded. Fake tensors: nothing is allocated."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.autograd.graph import saved_tensors_hooks

    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = layers
    if getattr(cfg, "is_encoder_decoder", False) and getattr(cfg, "num_decoder_layers", None):
        # T5Config keeps the decoder's depth apart (num_hidden_layers is the encoder's): one
        # block each for the 1-layer model, the config's own depths for the full one
        cfg.num_decoder_layers = 1 if layers == 1 else cfg.num_decoder_layers
    cfg.use_cache = False
    cfg._attn_implementation = implementation
    # bf16 weights train in bf16; fp32 weights (with or without bf16 autocast) stay fp32
    weights_dtype = torch.bfloat16 if a == 2 and residual == 2 else torch.float32
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=residual != a)
    ids = torch.zeros((batch, lengths[0]), dtype=torch.long)
    targets = torch.zeros((batch, lengths[1]), dtype=torch.long)
    with FakeTensorMode(allow_non_fake_inputs=True):
        auto_class = _training_auto_class(cfg)
        model = auto_class.from_config(cfg, dtype=weights_dtype).train()
        weights = {p.untyped_storage()._cdata for p in model.parameters()}
        saved: dict[int, int] = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage._cdata not in weights:  # each saved storage once, however many views
                saved[storage._cdata] = storage.nbytes()
            return tensor

        with saved_tensors_hooks(pack, lambda tensor: tensor), autocast, _fused_dropout():
            model(input_ids=ids, **_extra_inputs(auto_class, ids, targets))
    return sum(saved.values())


@contextlib.contextmanager
def _fused_dropout():
    """Dropout as a GPU runs it, while the trace runs on CPU tensors: ``torch.dropout`` takes
    the fused ``native_dropout`` kernel on CUDA, which keeps a bool mask (1 byte an element),
    and a multiply by a noise tensor of the input's dtype on the CPU (2 bytes in bf16)
    (aten/src/ATen/native/Dropout.cpp: ``is_fused_kernel_acceptable``, CUDA only). Measured on
    an H100: GPT-2's, BERT's and DeBERTa's layers keep what this trace keeps. Matters for
    models that train with dropout (GPT-2, BERT, T5: 0.1); the Llama-style ones have none."""
    import torch

    plain_dropout = torch.nn.functional.dropout

    def fused_dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return input
        return torch.native_dropout(input, p, True)[0]

    torch.nn.functional.dropout = fused_dropout
    try:
        yield
    finally:
        torch.nn.functional.dropout = plain_dropout


def _extra_inputs(auto_class, ids, targets) -> dict:
    """What the model's forward needs beside ``input_ids``: an encoder-decoder's ``targets``
    (``decoder_input_ids``); a masked LM's all-ones ``attention_mask``, the one
    DebertaV2Model builds itself when none is given, passed so that
    ``PreTrainedModel.warn_if_padding_and_no_attention_mask`` does not read the ids' values
    (fake tensors have none)."""
    from transformers import AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    if auto_class is AutoModelForSeq2SeqLM:
        return {"decoder_input_ids": targets}
    if auto_class is AutoModelForMaskedLM:
        return {"attention_mask": ids.new_ones(ids.shape)}
    return {}


def _solve(lengths: tuple[int, int, int], sizes: list[int]) -> tuple[int, int]:
    """``L`` and ``Q`` of ``size(s) = C + L*s + Q*s*s`` through three points (divided
    differences), rounded to whole bytes."""
    per_token, q = _quadratic(lengths, sizes)
    return round(per_token), round(q)


def _quadratic(lengths: tuple[int, int, int], sizes: list[float]) -> tuple[float, float]:
    """``L`` and ``Q`` of ``size(s) = C + L*s + Q*s*s`` through three points, unrounded."""
    (s1, s2, s3), (f1, f2, f3) = lengths, sizes
    slope_12 = (f2 - f1) / (s2 - s1)
    slope_23 = (f3 - f2) / (s3 - s2)
    q = (slope_23 - slope_12) / (s3 - s1)
    return slope_12 - q * (s1 + s2), q
