"""Which transformers auto class a model config trains as, for the two folders that build the
model from a config and may not import each other: ``models/resolve.py`` (meta-device parameter
counts) and ``memory/layer_trace.py`` (the layer traced on fake tensors). transformers is
imported inside the function."""

from __future__ import annotations


def training_auto_class(config):
    """The auto class whose model users train for ``config`` (a config object): its causal LM,
    else its sequence-to-sequence LM (T5: ``T5ForConditionalGeneration``, its lm_head;
    transformers 5 ties it to the embedding even for T5 v1.1, ``T5Config.__post_init__``), else
    its masked LM (DeBERTa-v2: ``DebertaV2ForMaskedLM``); None when transformers registers none
    of the three for it (some multimodal models). BERT and RoBERTa have a causal-LM class
    (``BertLMHeadModel``, ``RobertaForCausalLM``) with the same modules as their masked LM.
    An encoder-decoder config (``is_encoder_decoder``) trains as its sequence-to-sequence LM
    even where transformers also registers a causal LM for it: BART's, mBART's, Marian's and
    Pegasus's ``...ForCausalLM`` is their decoder alone (``BartForCausalLM`` wraps
    ``BartDecoderWrapper``), while fine-tuning scripts load ``AutoModelForSeq2SeqLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    order = (AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForMaskedLM)
    if getattr(config, "is_encoder_decoder", False):
        order = (AutoModelForSeq2SeqLM, AutoModelForCausalLM, AutoModelForMaskedLM)
    for auto_class in order:
        if type(config) in auto_class._model_mapping:
            return auto_class
    return None
