"""memory/allocation_trace.py: a training run recorded on fake tensors through the real
transformers / peft / torch.optim code and replayed through the caching allocator agrees with
zerofit's own estimate, refuses what it does not emulate in one line, reports an out-of-memory
run, and is cached on disk.

Run: .venv/bin/python -m pytest tests/memory/test_allocation_trace.py -q"""

from __future__ import annotations

import dataclasses

import pytest
from memory_shapes import TINY_REPLAY_LLAMA

from zerofit.memory import allocation_trace
from zerofit.memory.allocation_trace import (
    AllocationRecorder,
    check_events,
    replay_support,
    replay_training_run,
)
from zerofit.memory.estimate import TrainSetup, estimate_memory
from zerofit.models.resolve import spec_from_config

# fake-tensor recordings of whole runs: run_suite.py runs them beside the launches
pytestmark = pytest.mark.replay

TINY_CONFIG = TINY_REPLAY_LLAMA
TINY = spec_from_config(TINY_CONFIG, "tiny-llama")


def tiny_setup(**fields) -> TrainSetup:
    """The HF Trainer on one GPU (stage 0 without DeepSpeed), 2 x 256 tokens, no cuBLAS."""
    defaults = dict(stage=0, stack="hf", micro_batch=2, seq_len=256, gpu=None)
    return TrainSetup(**{**defaults, **fields})


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test replays into its own empty cache (cache.py reads XDG_CACHE_HOME)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def test_the_recorder_sees_fake_storages_born_and_freed():
    """Known allocations on fake tensors: a bf16 tensor is one alloc of its bytes, a view none,
    an expression's temporaries are allocated and freed, and deleting the tensor frees it (the
    weak reference on a fake storage fires)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    recorder = AllocationRecorder(workspaces=False)
    with FakeTensorMode(), recorder.recording():
        tensor = torch.empty(1000, dtype=torch.bfloat16)
        view = tensor[:10]
        assert recorder.events == [("alloc", 0, 2000)]
        total = (tensor.float() * 2).sum()
        del view, tensor, total
    kinds = [kind for kind, _key, _nbytes in recorder.events]
    assert kinds.count("alloc") == kinds.count("free") == 4
    assert check_events(recorder.events) == []
    assert recorder.live_keys() == []


def test_check_events_names_a_broken_trace():
    """The checker the tests rely on reports a free of a dead key and a resize of an unknown
    one."""
    broken = [("alloc", 0, 512), ("free", 0, 0), ("free", 0, 0), ("resize", 7, 10)]
    assert check_events(broken) == [
        "event 2: free of key 0, not live",
        "event 3: resize of key 7, never allocated",
    ]


AGREEING = [
    pytest.param(
        dict(finetuning=finetuning, gradient_checkpointing=ckpt, autocast=autocast),
        id=f"{finetuning}-ckpt{int(ckpt)}-autocast{int(autocast)}",
    )
    for finetuning in ("full", "lora")
    for ckpt in (False, True)
    for autocast in (True, False)
]
OTHERS = [
    pytest.param(dict(finetuning="lora", attention="flash_attention_2"), id="lora-flash2"),
    pytest.param(dict(finetuning="full", attention="eager"), id="full-eager-bf16"),
    pytest.param(dict(finetuning="lora", lora_targets="q_proj,v_proj,lm_head"), id="lora-names"),
    pytest.param(dict(finetuning="full", grad_accum=2, stack="accelerate"), id="full-accum2"),
    pytest.param(dict(finetuning="full", weights_dtype="fp32"), id="full-fp32-autocast"),
    pytest.param(dict(finetuning="lora", weights_dtype="fp32"), id="lora-fp32-autocast"),
    # at the loss's backward only the LM head's bf16 weight copy is alive: the checkpointed
    # layers save none, and autocast's cache is emptied when the forward leaves autocast
    pytest.param(
        dict(finetuning="full", weights_dtype="fp32", gradient_checkpointing=True),
        id="full-fp32-autocast-ckpt",
    ),
    # fp32 eager attention keeps one score tensor a layer: the softmax's cast to fp32 is none
    pytest.param(
        dict(finetuning="full", weights_dtype="fp32", autocast=False, attention="eager"),
        id="full-fp32-eager",
    ),
]


@pytest.mark.parametrize("fields", AGREEING + OTHERS)
def test_the_replay_agrees_with_the_estimate(fields):
    """The replayed run holds at least the weights, reserves at least what it allocates, and
    its ``max_memory_allocated`` is within 3 % of zerofit's estimate of the same setup (bf16
    weights unless the case says otherwise; no GPU, so no cuBLAS workspace on either side)."""
    setup = tiny_setup(**{"weights_dtype": "bf16", **fields})
    assert replay_support(TINY, setup) is None
    run = replay_training_run(TINY, setup)
    estimate = estimate_memory(TINY, setup)
    weights = estimate.breakdown["params"] + estimate.breakdown.get("frozen_params", 0)
    assert run is not None and run.steps == 3 and not run.out_of_memory
    assert run.max_reserved >= run.max_allocated >= weights
    assert run.max_allocated == pytest.approx(estimate.peak_bytes, rel=0.03)


def test_a_gpu_adds_its_cublas_workspaces():
    """On an H100 each thread's handle takes cuBLAS's 32 MiB workspace at its first matmul: the
    forward's and the backward's (Llama's projections have no bias: no cuBLASLt one)."""
    without = replay_training_run(TINY, tiny_setup(weights_dtype="bf16"))
    on_h100 = replay_training_run(TINY, tiny_setup(weights_dtype="bf16", gpu="h100"))
    assert on_h100.max_allocated - without.max_allocated == 2 * 32 * 2**20


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (dict(finetuning="qlora"), "bitsandbytes' 4-bit weights cannot be faked"),
        (dict(stage=2), "DeepSpeed's ZeRO-2 engine is not replayed (stage 0 without it is)"),
        (dict(stage=0, stack="deepspeed"), "DeepSpeed's ZeRO-0 engine is not replayed"),
        (dict(world_size=2), "a run on 2 GPUs is not replayed (one GPU is)"),
        (dict(workload="dpo"), "the dpo workload is not replayed (sft is)"),
        (dict(padded=True), "padded batches run SDPA's memory-efficient kernel"),
        (
            dict(autocast=False, weights_dtype="fp32"),
            "sdpa in fp32 runs the memory-efficient kernel, not emulated",
        ),
        (dict(attention="flex_attention"), "attention flex_attention is not replayed"),
        (dict(optimizer="adamw_8bit"), "optimizer adamw_8bit is not replayed"),
    ],
)
def test_what_is_not_emulated_gets_a_reason(fields, reason):
    setup = tiny_setup(**fields)
    assert reason in replay_support(TINY, setup)
    assert replay_training_run(TINY, setup) is None


def test_a_gpu_too_small_runs_out_of_memory():
    """A capacity below what the run reserves sets ``out_of_memory`` (a recording of its own);
    an 80 GiB GPU changes nothing, and its replay is the uncapped one read from the cache."""
    setup = tiny_setup(weights_dtype="bf16")
    free = replay_training_run(TINY, setup)
    before = allocation_trace.recordings_made
    roomy = replay_training_run(TINY, setup, capacity=80 * 2**30)
    assert roomy == free and not roomy.out_of_memory
    assert allocation_trace.recordings_made == before
    small = replay_training_run(TINY, setup, capacity=free.max_allocated // 2)
    assert small.out_of_memory
    assert allocation_trace.recordings_made == before + 1


def test_a_capped_recording_also_stores_the_uncapped_run():
    """One recording serves both: after a capped call the uncapped one records nothing."""
    setup = tiny_setup(weights_dtype="bf16", seq_len=128)
    capped = replay_training_run(TINY, setup, capacity=2**20)
    before = allocation_trace.recordings_made
    uncapped = replay_training_run(TINY, setup)
    assert allocation_trace.recordings_made == before
    assert capped.out_of_memory and not uncapped.out_of_memory
    assert uncapped.max_reserved > 2**20


def test_a_second_call_reads_the_cache(monkeypatch):
    """The same model and setup replay once: the second call records nothing and returns the
    same run; another setup records again."""
    setup = tiny_setup(finetuning="lora")
    before = allocation_trace.recordings_made
    first = replay_training_run(TINY, setup)
    assert allocation_trace.recordings_made == before + 1
    assert replay_training_run(TINY, setup) == first
    assert allocation_trace.recordings_made == before + 1
    replay_training_run(TINY, dataclasses.replace(setup, seq_len=128))
    assert allocation_trace.recordings_made == before + 2


def test_a_model_that_cannot_be_built_gives_none():
    """A config transformers cannot build is no error: the replay is None, and cached so."""
    broken = dataclasses.replace(TINY, config_json='{"model_type": "no_such_model"}')
    setup = tiny_setup()
    before = allocation_trace.recordings_made
    assert replay_training_run(broken, setup) is None
    assert replay_training_run(broken, setup) is None
    assert allocation_trace.recordings_made == before + 1
