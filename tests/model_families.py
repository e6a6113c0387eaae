"""Tiny configs of the non-Llama families zerofit counts from their own modules (GPT-2, BERT,
RoBERTa, DeBERTa-v2, T5), made by transformers' own config classes as a user's
``Config(...).save_pretrained(dir)`` writes them, for the parameter, FLOP and activation tests.
Each variant turns on a branch of the family's modules (relative attention, shared keys, the
first layer's convolution, a legacy head, a gated FF, an untied head, unequal depths)."""

from __future__ import annotations

VOCAB = 1000
# the ids fed to the models lie above every special token of these configs
FIRST_ID = 3

# the sizes every tiny encoder (BERT, RoBERTa, DeBERTa-v2) shares
ENCODER_SIZES = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
)
# DeBERTa-v3's layout: relative attention in 2 x position_buckets buckets, shared keys, no
# absolute position or token-type embeddings
DEBERTA_V3_LAYOUT = dict(
    relative_attention=True,
    pos_att_type="p2c|c2p",
    norm_rel_ebd="layer_norm",
    share_att_key=True,
    position_biased_input=False,
    type_vocab_size=0,
)

FAMILY_CONFIGS: dict[str, tuple[str, dict]] = {
    # bos / eos default to GPT-2's 50256, outside this vocabulary
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)),
    "gpt2-n_inner": (
        "GPT2Config",
        dict(n_embd=64, n_layer=3, n_head=4, n_inner=80, bos_token_id=0, eos_token_id=0),
    ),
    "bert": ("BertConfig", dict(ENCODER_SIZES)),
    "roberta": (
        "RobertaConfig",
        dict(ENCODER_SIZES, max_position_embeddings=258),
    ),
    "deberta-v3": (
        "DebertaV2Config",
        dict(ENCODER_SIZES, position_buckets=32, **DEBERTA_V3_LAYOUT),
    ),
    # DeBERTa-v2-xlarge's: the first layer's convolution, separate position projections, no
    # buckets (the relative distance is max_position_embeddings), the non-legacy MLM head
    "deberta-v2-conv": (
        "DebertaV2Config",
        dict(
            ENCODER_SIZES,
            max_position_embeddings=256,  # the longest traced length
            relative_attention=True,
            pos_att_type=["c2p", "p2c"],
            conv_kernel_size=3,
            legacy=False,
        ),
    ),
    "t5": (
        "T5Config",
        dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4),
    ),
    # T5 v1.1 / Flan-T5: gated-GELU FF, an "untied" head; and a decoder deeper than the encoder
    "t5-v1.1": (
        "T5Config",
        dict(
            d_model=64,
            d_kv=16,
            d_ff=96,
            num_layers=2,
            num_decoder_layers=3,
            num_heads=4,
            feed_forward_proj="gated-gelu",
            tie_word_embeddings=False,  # transformers 5 ties it anyway
        ),
    ),
}


def family_config_json(name: str) -> dict:
    """The config.json fields transformers writes for ``FAMILY_CONFIGS[name]``
    (``PreTrainedConfig.to_dict``, what ``save_pretrained`` stores)."""
    import transformers

    class_name, fields = FAMILY_CONFIGS[name]
    config = getattr(transformers, class_name)(vocab_size=VOCAB, **fields)
    fields = config.to_dict()
    fields.pop("transformers_version", None)
    return fields


def build_family_model(name: str, attention: str = "eager", num_layers: int | None = None):
    """The model users train for ``FAMILY_CONFIGS[name]``, randomly initialised on the CPU
    (models/resolve.py ``training_model_class``: causal, seq2seq or masked LM); ``num_layers``
    another depth (T5: one encoder and one decoder block for 1)."""
    from transformers import AutoConfig

    from zerofit.models.resolve import training_model_class

    fields = {**family_config_json(name), "use_cache": False}
    config = AutoConfig.for_model(fields.pop("model_type"), attn_implementation=attention, **fields)
    if num_layers is not None:
        config.num_hidden_layers = num_layers
        if num_layers == 1 and getattr(config, "num_decoder_layers", None):
            config.num_decoder_layers = 1
    return training_model_class(config).from_config(config)


def family_inputs(name: str, batch: int, seq_len: int, decoder_len: int) -> dict:
    """Random token ids for the model of ``name``: ``decoder_input_ids`` too for T5."""
    import torch

    ids = torch.randint(FIRST_ID, VOCAB, (batch, seq_len))
    if FAMILY_CONFIGS[name][0] != "T5Config":
        return {"input_ids": ids}
    targets = torch.randint(FIRST_ID, VOCAB, (batch, decoder_len))
    return {"input_ids": ids, "decoder_input_ids": targets}
