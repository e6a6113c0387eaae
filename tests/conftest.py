"""Shared fixtures: free TCP ports, Plans built directly from answers, tiny local model
directories; DeepSpeed's op builds kept in the venv."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from zerofit.demo import clear_stale_build_locks, use_venv_extensions_dir

REPO = Path(__file__).resolve().parents[1]
# Tests never reach a model hub: a hub-looking model name must fail fast offline, not hang on DNS.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# DeepSpeed's JIT ops build in the venv's own directory (as under `make test`), for this process
# and every launch the tests spawn (they pass os.environ on): not in ~/.cache/torch_extensions,
# which other clones and venvs of the machine share and rebuild for one another.
use_venv_extensions_dir()


def pytest_sessionstart(session):
    """A build lock left by an interrupted op build would hang every engine test: remove it."""
    clear_stale_build_locks(
        os.environ.get("TORCH_EXTENSIONS_DIR"), say=lambda line: print(f"conftest: {line}")
    )


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` imported as a module (the benchmarks are scripts, not a package);
    its sibling imports (``import model_shapes``) resolve as when it runs as a script."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.append(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it is executed
    spec.loader.exec_module(module)
    return module


# The H100 calibration points (how they were measured: tests/data/mem_h100_qwen2.5-0.5b.md).
CALIBRATION = REPO / "tests" / "data" / "mem_h100_qwen2.5-0.5b.jsonl"


def calibration_points() -> list[dict]:
    """Every H100 calibration point (one dict per measured run)."""
    return [json.loads(line) for line in CALIBRATION.read_text().splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def fp32_kernels_where_bf16_is_emulated(request):
    """tests/memory measures the bytes of real bf16 training steps on the CPU. Where the CPU has
    no native bf16 (AVX2 only) each bf16 matmul is ~200x slower and one probe takes minutes: there
    the heavy kernels run in fp32 and round to bf16 (memory_probe.fp32_kernels_for_emulated_bf16),
    which leaves every counted byte as it is (tests/test_memory_probe.py checks that)."""
    if request.node.path.parent != REPO / "tests" / "memory":
        yield
        return
    from memory_probe import fp32_kernels_for_emulated_bf16

    with fp32_kernels_for_emulated_bf16():
        yield


def find_free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (bind to port 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    """A free rendezvous port for accelerate launch / torchrun (never hard-code 29500)."""
    return find_free_port()


def build_plan(
    hidden_size: int = 64,
    params: int = 1_000_000,
    peak_gib: float = 1.0,
    fits: bool = True,
    grad_accum: int = 1,
    **answer_fields,
):
    """A Plan made directly from Answers fields (no planner): stage/offload/micro taken from the
    answers.

    Unset knobs default to stage 2, no offload, micro batch 1, precision bf16, explicit flavour.
    """
    from zerofit.hardware import lookup
    from zerofit.planning.answers import Answers
    from zerofit.planning.plan import Plan

    answer_fields.setdefault("stage", 2)
    answer_fields.setdefault("micro_batch", 1)
    answer_fields.setdefault("precision", "bf16")
    answer_fields.setdefault("flavour", "explicit")
    answers = Answers(**answer_fields)  # validated on construction
    world = answers.world_size
    return Plan(
        answers=answers,
        gpu=lookup(answers.gpu),
        model_name=answers.model,
        params=params,
        hidden_size=hidden_size,
        precision=answers.precision,
        world_size=world,
        stage=answers.stage,
        offload_optimizer=answers.offload_optimizer or "none",
        offload_param=answers.offload_param or "none",
        gradient_checkpointing=bool(answers.gradient_checkpointing),
        micro_batch=answers.micro_batch,
        grad_accum=grad_accum,
        global_batch=answers.micro_batch * grad_accum * world,
        peak_gib=peak_gib,
        fits=fits,
    )


@pytest.fixture
def plan_factory():
    """``plan_factory(stage=3, gpus_per_node=2, ...)`` -> Plan (see build_plan)."""
    return build_plan


def write_tiny_model_dir(
    path: Path, hidden_size: int = 64, layers: int = 2, vocab_size: int = 128
) -> Path:
    """A local Qwen2 model directory: config.json + a word-level tokenizer (no weights, no
    downloads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config

    path.mkdir(parents=True, exist_ok=True)
    Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    ).save_pretrained(path)
    specials = ["<pad>", "<eos>", "<unk>"]
    words = [str(i) for i in range(vocab_size - len(specials))]
    vocab = {w: i for i, w in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    ).save_pretrained(path)
    return path


@pytest.fixture
def tiny_model_dir(tmp_path) -> Path:
    """Path to a tiny local Qwen2 model directory (config + tokenizer)."""
    return write_tiny_model_dir(tmp_path / "tiny-qwen2")


def load_nf4_model(folder: Path, dtype):
    """A saved model loaded by transformers with QLoRA's BitsAndBytesConfig (NF4, double
    quantization, computing in ``dtype``, bitsandbytes' default uint8 storage) on the CPU, in
    train mode (from_pretrained returns eval mode, where checkpointing is off)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
    )
    model = AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=quantization, device_map="cpu", dtype=dtype
    )
    return model.train()


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def two_node_config_argv(port: int | str, *extra: str, gpu: str = "H100-SXM") -> list[str]:
    """`zerofit config` argv for the shape every real multi-node test launches: qwen2.5-0.5b,
    2 nodes x 1 GPU, ZeRO-2, written to ./cfg; ``extra`` adds the test's own batch/workload flags.
    """
    return [
        "config",
        "--model",
        "qwen2.5-0.5b",
        "--gpu",
        gpu,
        "--gpus-per-node",
        "1",
        "--nodes",
        "2",
        "--stage",
        "2",
        "--flavor",  # the recipes are plain accelerate loops: the numbers written out
        "explicit",
        *extra,
        "--main-process-port",
        str(port),
        "--out",
        "cfg",
    ]


# The GRPO sizes of the two-node recipe runs (test_multinode, the Slurm cluster): a tiny batch the
# recipe's toy task trains on in seconds.
GRPO_TWO_NODE_FLAGS = (
    "--workload",
    "grpo",
    "--global-batch",
    "16",
    "--micro-batch",
    "8",
    "--num-generations",
    "8",
    "--seq-len",
    "16",
    "--completion-len",
    "8",
    "--precision",
    "bf16",
)
