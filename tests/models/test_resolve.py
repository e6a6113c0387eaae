"""Tests for zerofit.models: built-in shapes, exact parameter counts, resolution and errors.

Run: .venv/bin/python -m pytest tests/models/test_resolve.py -q
(no network: the hub download is faked)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from model_families import FAMILY_CONFIGS, build_family_model, family_config_json

from zerofit.errors import ZerofitError
from zerofit.models import resolve as models
from zerofit.models.resolve import (
    BUILTIN_MODELS,
    builtin_config,
    cache_path,
    count_params,
    count_params_analytic,
    count_params_meta,
    model_names,
    resolve_model,
    spec_from_config,
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No network and no writes to the real ~/.cache for any test here."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def _no_download(*args, **kwargs):
    raise AssertionError("the hub must not be contacted here")


# Totals are the published counts (model cards / safetensors metadata); MoE active counts follow
# from top-k of the experts (Qwen3-30B-A3B: "3.3B activated", Mixtral-8x7B: "12.9B active").
PUBLISHED = [
    ("qwen2.5-0.5b", 494_032_768, 494_032_768),
    ("qwen2.5-1.5b", 1_543_714_304, 1_543_714_304),
    ("qwen2.5-7b", 7_615_616_512, 7_615_616_512),
    ("qwen2.5-72b", 72_706_203_648, 72_706_203_648),
    ("llama-3.2-1b", 1_235_814_400, 1_235_814_400),
    ("llama-3.2-3b", 3_212_749_824, 3_212_749_824),
    ("llama-3.1-8b", 8_030_261_248, 8_030_261_248),
    ("llama-3.1-70b", 70_553_706_496, 70_553_706_496),
    ("mistral-7b-v0.3", 7_248_023_552, 7_248_023_552),
    ("qwen3-8b", 8_190_735_360, 8_190_735_360),
    ("qwen3-30b-a3b", 30_532_122_624, 3_353_032_704),
    ("mixtral-8x7b", 46_702_792_704, 12_879_925_248),
]


@pytest.mark.parametrize("name,params,active", PUBLISHED)
def test_builtin_counts_match_published(name, params, active):
    spec = BUILTIN_MODELS[name]
    assert (spec.params, spec.active_params) == (params, active)


def test_builtin_shapes():
    small = BUILTIN_MODELS["qwen2.5-0.5b"]
    assert (
        small.hidden_size,
        small.intermediate_size,
        small.num_layers,
        small.num_heads,
        small.num_kv_heads,
        small.head_dim,
        small.vocab_size,
        small.tie_embeddings,
    ) == (896, 4864, 24, 14, 2, 64, 151936, True)
    assert (
        BUILTIN_MODELS["qwen2.5-7b"].vocab_size,
        BUILTIN_MODELS["qwen2.5-7b"].tie_embeddings,
    ) == (152064, False)
    moe = BUILTIN_MODELS["qwen3-30b-a3b"]
    assert (
        moe.architecture,
        moe.num_layers,
        moe.num_experts,
        moe.experts_per_token,
        moe.moe_intermediate_size,
        moe.head_dim,
        moe.num_heads,
        moe.num_kv_heads,
    ) == ("qwen3_moe", 48, 128, 8, 768, 128, 32, 4)
    assert (
        round(moe.params / 1e9, 1) == 30.5 and round(moe.active_params / 1e9, 1) == 3.4
    )  # card: 3.3B
    # Qwen's cards also give "non-embedding" counts: total minus embedding and lm_head.
    assert round((BUILTIN_MODELS["qwen3-8b"].params - 2 * 151936 * 4096) / 1e9, 2) == 6.95
    assert round((small.params - 151936 * 896) / 1e9, 2) == 0.36  # tied: one matrix
    assert all(n == n.lower() and BUILTIN_MODELS[n].name == n for n in model_names())
    assert {
        "qwen2.5-0.5b",
        "qwen2.5-32b",
        "llama-3.1-70b",
        "mistral-7b-v0.3",
        "qwen3-30b-a3b",
    } <= set(model_names())


def _tiny(model_type, **extra):
    base = {
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
    }
    return {**base, **extra}


def _minimal(model_type):
    """Only the required fields: every optional one takes transformers' default."""
    return {
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 128,
    }


TINY = {
    "llama": _tiny("llama"),
    "llama-tied": _tiny("llama", tie_word_embeddings=True),
    "llama-biases": _tiny("llama", attention_bias=True, mlp_bias=True, head_dim=32),
    "llama-minimal": _minimal("llama"),
    "qwen2": _tiny("qwen2"),
    "qwen2-tied": _tiny("qwen2", tie_word_embeddings=True),
    "qwen2-minimal": _minimal("qwen2"),
    "qwen3": _tiny("qwen3", head_dim=32, tie_word_embeddings=True),
    "qwen3-bias": _tiny("qwen3", head_dim=8, attention_bias=True),
    "qwen3-minimal": _minimal("qwen3"),
    "mistral": _tiny("mistral", head_dim=32),
    "mistral-minimal": _minimal("mistral"),
    "mixtral": _tiny("mixtral", num_local_experts=4, num_experts_per_tok=2),
    "mixtral-minimal": _minimal("mixtral"),
    "qwen3_moe": _tiny(
        "qwen3_moe",
        num_hidden_layers=4,
        head_dim=16,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        decoder_sparse_step=2,
        mlp_only_layers=[3],
        attention_bias=True,
    ),
    "qwen3_moe-minimal": _minimal("qwen3_moe"),
}


@pytest.mark.parametrize("key", list(TINY))
def test_analytic_equals_meta_on_tiny_configs(key):
    analytic = count_params_analytic(TINY[key])
    assert analytic is not None
    assert analytic == count_params_meta(TINY[key])


def test_moe_active_counts_the_right_experts():
    # qwen3_moe tiny: layers 1 (index 1, (1+1)%2==0) is sparse; 0, 2 by step and 3 by mlp_only
    # are dense.
    record = count_params_analytic(TINY["qwen3_moe"])
    assert record["params"] - record["active_params"] == 1 * (6 - 2) * 3 * 64 * 24


@pytest.mark.parametrize("name", model_names())
def test_analytic_equals_meta_on_builtin_shapes(name):
    assert count_params_meta(builtin_config(name)) == count_params_analytic(builtin_config(name))


def test_resolve_builtins_and_their_hub_ids_offline(monkeypatch):
    monkeypatch.setattr("huggingface_hub.hf_hub_download", _no_download)
    small = BUILTIN_MODELS["qwen2.5-0.5b"]
    assert resolve_model("Qwen2.5-0.5B") is small
    assert resolve_model(" qwen/qwen2.5-0.5b-instruct ") is small
    assert resolve_model("Qwen/Qwen2.5-7B").params == 7_615_616_512
    assert resolve_model("meta-llama/Meta-Llama-3.1-8B-Instruct") is BUILTIN_MODELS["llama-3.1-8b"]
    assert resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507") is BUILTIN_MODELS["qwen3-30b-a3b"]


def test_resolve_local_dir_and_config_path(tiny_model_dir):
    """A save_pretrained directory and its config.json both give transformers' real count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    by_dir = resolve_model(str(tiny_model_dir))
    by_file = resolve_model(str(tiny_model_dir / "config.json"))
    with torch.device("meta"):  # the directory has no weights; the architecture is what counts
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir))
    real = sum(p.numel() for p in model.parameters())
    assert by_dir.params == by_file.params == real
    # conftest's Qwen2: hidden 64, vocab 128, tied, 2 layers of q/k/v(+bias)/o + MLP 128 + 2 norms.
    layer = 64 * 64 * 2 + 64 * 32 * 2 + 64 + 32 * 2 + 3 * 64 * 128 + 2 * 64
    assert real == 128 * 64 + 2 * layer + 64
    assert (by_dir.architecture, by_dir.tie_embeddings, by_dir.num_kv_heads) == ("qwen2", True, 2)
    assert by_dir.name == str(tiny_model_dir)


def test_resolve_plain_config_json_file(tmp_path):
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(builtin_config("llama-3.1-8b")))
    spec = resolve_model(str(path))
    assert (spec.params, spec.name, spec.num_kv_heads) == (8_030_261_248, str(path), 8)


@pytest.fixture(autouse=True)
def _hub_head_answers(monkeypatch):
    """Unit tests fake hf_hub_download; the metadata HEAD before it must not touch the network."""
    monkeypatch.setattr(models, "_hub_head", lambda repo_id: None)


def test_resolve_hub_id_fetches_only_config_json(monkeypatch, tmp_path):
    calls = []
    config = tmp_path / "snap" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(_tiny("mistral", vocab_size=1000)))

    def fake_download(repo_id, filename, **kwargs):
        calls.append((repo_id, filename, kwargs))
        if kwargs.get("local_files_only"):  # not in the hub cache yet
            from huggingface_hub import errors

            raise errors.LocalEntryNotFoundError("not cached")
        return str(config)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", fake_download)
    spec = resolve_model("someorg/Tiny-Mistral")
    assert calls == [
        ("someorg/Tiny-Mistral", "config.json", {"local_files_only": True}),
        ("someorg/Tiny-Mistral", "config.json", {}),
    ]
    assert (spec.name, spec.architecture, spec.vocab_size) == (
        "someorg/Tiny-Mistral",
        "mistral",
        1000,
    )
    assert spec.params == count_params_meta(_tiny("mistral", vocab_size=1000))["params"]
    config.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    with pytest.raises(
        ZerofitError, match='config.json of someorg/Tiny-Mistral has no "hidden_size"'
    ):
        resolve_model("someorg/Tiny-Mistral")


def _raising(err):
    def download(repo_id, filename, **kwargs):
        raise err

    return download


@pytest.mark.parametrize(
    "ref,err,expected",
    [
        ("someorg/x", "offline", "cannot fetch config.json of someorg/x: offline and not cached"),
        ("qwen2.5-0.5", "missing", "did you mean qwen2.5-0.5b"),
        ("someorg/gated", "gated", "someorg/gated is gated on the Hugging Face Hub"),
        (
            "someorg/x",
            "network",
            "cannot reach the Hugging Face Hub for someorg/x (connection refused)",
        ),
    ],
)
def test_hub_failures_are_one_line(monkeypatch, ref, err, expected):
    from huggingface_hub import errors

    response = mock.Mock(headers={}, status_code=404)
    exc = {
        "offline": errors.LocalEntryNotFoundError("not in cache"),
        "missing": errors.RepositoryNotFoundError("404", response=response),
        "gated": errors.GatedRepoError("401", response=response),
        "network": ConnectionError("connection refused\nmore detail"),
    }[err]
    monkeypatch.setattr("huggingface_hub.hf_hub_download", _raising(exc))
    with pytest.raises(ZerofitError) as info:
        resolve_model(ref)
    assert (
        info.value.field == "model" and expected in str(info.value) and "\n" not in str(info.value)
    )


def test_invalid_hub_id_is_rejected_before_download(monkeypatch):
    monkeypatch.setattr("huggingface_hub.hf_hub_download", _no_download)
    with pytest.raises(ZerofitError, match="not a built-in name, a local path or a hub id"):
        resolve_model("bad--id..")


GPT2 = {
    "model_type": "gpt2",
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 4,
    "vocab_size": 64,
    "n_positions": 64,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def test_meta_count_is_cached_on_disk(monkeypatch, tmp_path):
    first = count_params(GPT2)
    # gpt2: wte 64x32 (tied lm_head) + wpe 64x32 + per layer (ln 2x64, attn 32x96+96, proj 32x32+32,
    # mlp 32x128+128 and 128x32+32) + final ln 64.
    layer = 2 * 64 + 32 * 96 + 96 + 32 * 32 + 32 + 32 * 128 + 128 + 128 * 32 + 32
    assert first["params"] == 64 * 32 + 64 * 32 + 2 * layer + 64
    assert cache_path() == tmp_path / "xdg" / "zerofit" / "params.json"
    stored = json.loads(cache_path().read_text())
    assert list(stored.values()) == [first]
    monkeypatch.setattr(
        models, "count_params_meta", mock.Mock(side_effect=AssertionError("cache missed"))
    )
    # Bookkeeping keys do not change the key, so another copy of the same config hits the cache.
    assert (
        count_params({**GPT2, "_name_or_path": "elsewhere", "transformers_version": "0"}) == first
    )
    assert spec_from_config(GPT2, "tiny-gpt2").params == first["params"]


def test_broken_or_unwritable_cache_only_costs_time(monkeypatch, tmp_path):
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text("{not json")
    assert count_params(GPT2)["params"] > 0
    assert json.loads(cache_path().read_text())  # rewritten as valid JSON
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert count_params(GPT2)["params"] > 0


@pytest.mark.parametrize(
    "content,expected",
    [
        ("{\"model_type\": \"llama\",", "is not valid JSON"),
        ("[1, 2]", "is not a JSON object"),
        (
            json.dumps({k: v for k, v in _tiny("llama").items() if k != "hidden_size"}),
            'has no "hidden_size"',
        ),
        (
            json.dumps(_tiny("qwen2", num_hidden_layers="24")),
            '"num_hidden_layers" is \'24\', not a positive integer',
        ),
        (json.dumps(_tiny("mixtral", num_local_experts=0)), '"num_local_experts" is 0'),
        (json.dumps({"hidden_size": 64}), 'has no "model_type"'),
        (
            json.dumps({"model_type": "no_such_arch", "hidden_size": 64}),
            "architecture 'no_such_arch' is unknown",
        ),
        (
            json.dumps({"model_type": "custom_x", "auto_map": {"AutoConfig": "x.Y"}}),
            "trust_remote_code",
        ),
    ],
)
def test_bad_config_files_give_one_line_errors(tmp_path, content, expected):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ZerofitError) as info:
        resolve_model(str(tmp_path))
    text = str(info.value)
    assert info.value.field == "model" and expected in text and "\n" not in text and "fix:" in text


@pytest.mark.parametrize(
    "ref,expected",
    [
        ("./missing/config.json", "no such file or directory: ./missing/config.json"),
        ("models/qwen/7b", "no such file or directory"),
        ("", "no model given"),
    ],
)
def test_missing_paths(monkeypatch, ref, expected):
    monkeypatch.setattr("huggingface_hub.hf_hub_download", _no_download)
    with pytest.raises(ZerofitError, match=expected):
        resolve_model(ref)


def test_directory_without_config(tmp_path):
    with pytest.raises(ZerofitError, match="has no config.json"):
        resolve_model(str(tmp_path))


def test_builtin_config_is_a_copy():
    config = builtin_config("Qwen/Qwen3-30B-A3B")
    config["num_experts"] = 1
    assert builtin_config("qwen3-30b-a3b")["num_experts"] == 128
    with pytest.raises(ZerofitError, match="did you mean llama-3.1-8b"):
        builtin_config("llama-3.1-8")


def test_import_stays_light():
    """The CLI imports this module for completions: no torch, transformers or huggingface_hub."""
    code = (
        "import sys, zerofit.models; "
        "print(sorted(m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "[]"


def test_typo_of_builtin_fails_fast_without_hub(monkeypatch):
    # A near-miss of a built-in name must never reach the hub client (5 network retries online).
    monkeypatch.setattr(
        "zerofit.models.resolve._download_config", lambda ref: pytest.fail("hub contacted")
    )
    with pytest.raises(ZerofitError, match="did you mean qwen2.5-7b"):
        resolve_model("qwen2.5-77b")


def test_unreachable_hub_fails_fast_in_one_line(tmp_path):
    """Issue 8: a hub that accepts the connection and never answers (a local socket) costs one
    short HEAD, not five retries with back-off, and the error is one line."""
    import socket
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    env = {
        "HF_ENDPOINT": f"http://127.0.0.1:{port}",
        "HF_HOME": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(Path(models.__file__).resolve().parents[2]),
    }
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "zerofit", "estimate", "--model", "someorg/some-model"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        server.close()
    took = time.monotonic() - start
    lines = proc.stderr.strip().splitlines()
    assert (
        proc.returncode == 2 and len(lines) == 1 and "someorg/some-model" in lines[0]
    ), proc.stderr
    assert "Retrying" not in proc.stderr + proc.stdout
    # the 1 s HEAD deadline plus interpreter start-up (inflated on a shared 2-core box)
    assert took < 2 + 3, took


@pytest.mark.parametrize(
    "config, params, inter",
    [
        (
            {
                "model_type": "qwen",
                "hidden_size": 4096,
                "intermediate_size": 22016,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "vocab_size": 151936,
                "kv_channels": 128,
                "no_bias": True,
            },
            7_721_324_544,
            11008,
        ),
        (
            {
                "model_type": "baichuan",
                "hidden_size": 4096,
                "intermediate_size": 11008,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "vocab_size": 64000,
            },
            7_000_559_616,
            11008,
        ),
        (
            {
                "model_type": "baichuan",
                "hidden_size": 4096,
                "intermediate_size": 11008,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "vocab_size": 125696,
            },
            7_505_973_248,
            11008,
        ),
        (
            {  # THUDM/chatglm3-6b: its own field names
                "model_type": "chatglm",
                "num_layers": 28,
                "hidden_size": 4096,
                "ffn_hidden_size": 13696,
                "num_attention_heads": 32,
                "multi_query_attention": True,
                "multi_query_group_num": 2,
                "kv_channels": 128,
                "padded_vocab_size": 65024,
                "add_qkv_bias": True,
            },
            6_243_584_000,
            13696,
        ),
    ],
)
def test_trust_remote_code_families_read_from_config(tmp_path, config, params, inter):
    """Qwen-7B (v1), Baichuan-7B, Baichuan2-7B, ChatGLM3-6B: published parameter counts,
    without their code."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "auto_map": {"AutoConfig": "configuration_x.XConfig"}}))
    spec = resolve_model(str(path))
    assert (spec.params, spec.intermediate_size) == (params, inter)


def test_param_counts_read_as_people_write_them() -> None:
    from zerofit.models.resolve import param_count_words

    assert param_count_words(7_615_616_512) == "7.62B"
    assert param_count_words(494_032_768) == "0.49B"
    # a tiny test model used to print as '0.00B'
    assert param_count_words(1_234_567) == "1.2M"
    assert param_count_words(9_216) == "9,216"


def test_a_tiny_model_s_plan_names_its_real_size(tmp_path) -> None:
    from zerofit.planning.answers import Answers
    from zerofit.planning.plan import plan

    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 256,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    decisions = plan(Answers(model=str(path), gpu="H100", seq_len=128)).decisions
    stage = next(decision for decision in decisions if decision.field == "stage")
    assert "0.00B" not in stage.reason and "(0.1M) on 1 x H100-SXM" in stage.reason


@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_non_llama_families_count_the_real_model(name, tmp_path):
    """GPT-2, BERT, RoBERTa, DeBERTa-v2 and T5, read from the config.json transformers saves:
    the count (meta device) equals the parameters of the model users train, built for real on
    the CPU: T5's seq2seq LM, DeBERTa-v2's masked LM with its head (it has no causal LM)."""
    fields = family_config_json(name)
    (tmp_path / "config.json").write_text(json.dumps(fields))
    spec = resolve_model(str(tmp_path))
    real = build_family_model(name)
    assert spec.params == sum(p.numel() for p in real.parameters())
    assert spec.active_params == spec.params and spec.num_experts == 0


def test_non_llama_families_read_their_own_field_names():
    """GPT-2's n_embd / n_layer / n_head / n_inner (None: 4 x n_embd) and T5's d_model /
    num_layers / num_heads / d_ff / d_kv land in the shape fields the FLOPs and memory read."""
    gpt2 = spec_from_config(family_config_json("gpt2"), "gpt2")
    assert (gpt2.hidden_size, gpt2.num_layers, gpt2.num_heads) == (64, 2, 4)
    assert gpt2.intermediate_size == 256 and gpt2.tie_embeddings
    t5 = spec_from_config(family_config_json("t5-v1.1"), "t5-v1.1")
    assert (t5.hidden_size, t5.num_layers, t5.num_heads, t5.head_dim) == (64, 2, 4, 16)
    # transformers 5 ties T5's lm_head whatever the config says (T5Config.__post_init__)
    assert t5.intermediate_size == 96 and t5.tie_embeddings
    assert models.training_model_class(_config_of(t5)).__name__ == "AutoModelForSeq2SeqLM"
    deberta = spec_from_config(family_config_json("deberta-v3"), "deberta-v3")
    assert models.training_model_class(_config_of(deberta)).__name__ == "AutoModelForMaskedLM"


def _config_of(spec):
    from transformers import AutoConfig

    fields = json.loads(spec.config_json)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def test_an_encoder_decoder_counts_its_seq2seq_lm_even_with_a_causal_lm_class(tmp_path):
    """BART registers a causal LM too (``BartForCausalLM``: its decoder alone); fine-tuning
    scripts load ``AutoModelForSeq2SeqLM``, encoder included, and that is what is counted."""
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(
        vocab_size=1000,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=128,
    )
    config.save_pretrained(tmp_path)
    spec = resolve_model(str(tmp_path))
    real = BartForConditionalGeneration(config)
    assert spec.params == sum(p.numel() for p in real.parameters())
    assert models.training_model_class(_config_of(spec)).__name__ == "AutoModelForSeq2SeqLM"
