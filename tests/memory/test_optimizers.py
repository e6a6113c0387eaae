"""Optimizer step temporaries per implementation: the estimator's term vs what torch's AdamW really
allocates (MemTracker on CPU; the temporaries do not depend on the device).

Run: .venv/bin/python -m pytest tests/memory/test_optimizers.py -q   (~3 s)
"""

from __future__ import annotations

import pytest
from memory_probe import tracked_peak

from zerofit.memory.optimizers import resolve_optimizer, step_temporary_bytes

# flat ZeRO-1/2 partition (one tensor), and a model-like list of tensors (foreach groups them)
SHAPES = {
    "flat_partition": [(3_000_000,)],
    "many_tensors": [(1000, 1200), (1200,), (700, 1000), (1000,)],
}
KWARGS = {
    "adamw_torch": {"foreach": True},
    "adamw_torch_fused": {"fused": True},
    "adamw_forloop": {"foreach": False},
}


def _measured_step_temporaries(impl: str, shapes, dtype=None) -> tuple[int, int, int]:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, dtype=dtype)) for s in shapes]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, **KWARGS[impl])
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()  # step 1 creates exp_avg / exp_avg_sq
    peak, after, _ = tracked_peak(opt.step, *params, opt)
    elements = sum(p.numel() for p in params)
    return peak - after, elements, max(p.numel() for p in params)


@pytest.mark.parametrize("layout", sorted(SHAPES))
@pytest.mark.parametrize("impl", sorted(KWARGS))
def test_step_temporaries_match_torch(impl, layout):
    measured, elements, largest = _measured_step_temporaries(impl, SHAPES[layout])
    predicted = step_temporary_bytes(impl, elements, largest)
    print(f"{impl:18} {layout:15} measured {measured:>11,} predicted {predicted:>11,}")
    if predicted == 0:
        assert measured <= 0.03 * 4 * elements  # nothing beyond a few scalars
    else:
        assert measured == pytest.approx(predicted, rel=0.03)


@pytest.mark.parametrize(
    "stack, optimizer, offload, block, expected",
    [
        ("hf", None, "none", False, "adamw_torch_fused"),  # TrainingArguments.optim default
        ("hf", None, "none", True, "ds_fused_adam"),  # JSON optimizer block -> DummyOptim
        ("accelerate", None, "none", False, "adamw_torch"),  # torch.optim.AdamW(params): foreach
        ("deepspeed", None, "none", False, "ds_fused_adam"),
        ("hf", None, "cpu", False, "ds_cpu_adam"),  # offload: DeepSpeed's CPU Adam
        (
            "accelerate",
            "adamw_torch",
            "cpu",
            False,
            "adamw_torch",
        ),  # zero_force_ds_cpu_optimizer=false
        ("hf", "adamw_forloop", "none", False, "adamw_forloop"),
    ],
)
def test_stack_to_optimizer(stack, optimizer, offload, block, expected):
    assert resolve_optimizer(stack, optimizer, offload, block) == expected


def test_hf_trainer_default_is_what_transformers_says():
    transformers = pytest.importorskip("transformers")
    from zerofit.memory.optimizers import HF_TRAINER_DEFAULT_OPTIM

    assert transformers.TrainingArguments.optim == HF_TRAINER_DEFAULT_OPTIM


def test_bf16_weights_step_with_bf16_states_and_temporaries():
    """Without DeepSpeed the optimizer steps the weights themselves: with bf16 weights AdamW's
    exp_avg / exp_avg_sq (``zeros_like(param)``) and the foreach temporary are bf16
    (memory/states.py plain_resident_states: 2 x w per parameter, plain_step_buffers: w)."""
    torch = pytest.importorskip("torch")
    shapes = SHAPES["many_tensors"]
    measured, elements, largest = _measured_step_temporaries("adamw_torch", shapes, torch.bfloat16)
    assert measured == pytest.approx(
        step_temporary_bytes("adamw_torch", elements, largest, 2), rel=0.03
    )
    params = [torch.nn.Parameter(torch.randn(s, dtype=torch.bfloat16)) for s in shapes]
    opt = torch.optim.AdamW(params, foreach=True)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    state_bytes = sum(v.nbytes for s in opt.state.values() for v in s.values() if v.dim() > 0)
    assert state_bytes == 2 * 2 * elements


def test_legacy_foreach_adamw_explains_a_public_traceback():
    """b-swift411 (ms-swift #411): Mistral-7B, bf16 weights, one A100-80GB without DeepSpeed,
    OOM inside ``_multi_tensor_adamw`` on ``denom = torch._foreach_add(exp_avg_sq_sqrt, eps)``
    with 76.61 GiB allocated + 0.11 GiB requested. Weights, grads and bf16 Adam states plus the
    square roots (one temporary, today's torch) stay below that floor; the older form's second
    list (``adamw_torch_legacy``) crosses it, as the traceback says."""
    from conftest import REPO

    from zerofit.memory.estimate import TrainSetup, estimate_memory
    from zerofit.models.resolve import resolve_model

    mistral = resolve_model(str(REPO / "tests/data/public_report_models/mistral-7b-v0.1.json"))
    floor = 76.61 + 0.11

    def step_gib(optimizer):
        setup = TrainSetup(
            stage=0,
            stack="hf",
            weights_dtype="bf16",
            optimizer=optimizer,
            seq_len=4096,
            gradient_checkpointing=True,
            attention="flash_attention_2",
        )
        return estimate_memory(mistral, setup).phases["step"] / 1024**3

    assert step_gib("adamw_torch") < floor < step_gib("adamw_torch_legacy")
    assert step_temporary_bytes("adamw_torch_legacy", 10, 10) == 2 * step_temporary_bytes(
        "adamw_torch", 10, 10
    )
