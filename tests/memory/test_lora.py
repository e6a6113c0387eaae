"""LoRA / QLoRA memory terms (memory/lora.py) against the real code on CPU: peft's adapters on a
random-init transformers Qwen2, bitsandbytes' NF4 quantization and 4-bit matmul, saved-tensor
hooks and torch's MemTracker (tests/memory_probe.py). Shapes are small and fp32 (bf16 is emulated
slowly on this CPU); every term within 3 %.

Run: .venv/bin/python -m pytest tests/memory/test_lora.py -q -s   (-s prints the numbers)
"""

from __future__ import annotations

import dataclasses

import pytest

from zerofit.errors import ZerofitError
from zerofit.memory import activations as act
from zerofit.memory import lora
from zerofit.memory.allocation_trace import peft_target_modules
from zerofit.memory.estimate import TrainSetup, estimate_memory

SHAPE = dict(
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=2000,
    tie_word_embeddings=False,
)
MICRO, SEQ = 2, 64


def _spec():
    from zerofit.models.resolve import spec_from_config

    return spec_from_config({**SHAPE, "model_type": "qwen2"}, "probe")


def _model(**shape):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "qwen2", attn_implementation="sdpa", use_cache=False, **{**SHAPE, **shape}
    )
    return AutoModelForCausalLM.from_config(config).train()


def _peft(model, rank: int, targets, dropout: float):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(
        model, LoraConfig(r=rank, target_modules=targets, lora_dropout=dropout)
    )


@pytest.mark.parametrize(
    "targets, peft_targets",
    [("all-linear", "all-linear"), ("attention", ["q_proj", "k_proj", "v_proj", "o_proj"]),
     ("q_proj,v_proj", ["q_proj", "v_proj"]), ("v_proj,lm_head", ["v_proj", "lm_head"])],
)
def test_adapter_count_is_peft_trainable_count(targets, peft_targets):
    """r x (in + out) per targeted module is what peft makes trainable; all-linear leaves the LM
    head out (tuners_utils._maybe_include_all_linear_layers)."""
    model = _peft(_model(), 8, peft_targets, 0.0)
    trainable, _ = model.get_nb_trainable_parameters()
    assert lora.adapter_params(_spec(), 8, targets) == trainable
    setup = TrainSetup(finetuning="lora", lora_rank=8, lora_targets=targets)
    assert lora.count_trainable_params(_spec(), setup) == trainable
    assert lora.count_trainable_params(_spec(), TrainSetup()) is None


def test_unknown_target_is_a_one_line_error():
    with pytest.raises(ZerofitError, match="lora_targets: 'foo_proj' is no linear layer"):
        lora.adapter_params(_spec(), 8, "foo_proj")


@pytest.mark.parametrize("shape", [(352, 128), (128, 352), (1000, 77)])
def test_nf4_bytes_are_what_bitsandbytes_stores(shape):
    """Params4bit quantized on CPU (NF4, double quantization, as QLoRA sets it): the packed
    values, the 8-bit absmax, the fp32 absmax of each 256 of them, codes and offset."""
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")

    weight = torch.randn(*shape)
    param = bnb.nn.Params4bit(
        weight, requires_grad=False, compress_statistics=True, quant_type="nf4"
    )._quantize("cpu")
    state = param.quant_state
    tensors = [param.data, state.absmax, state.code, state.offset, state.state2.absmax]
    tensors.append(state.state2.code)
    stored = sum(t.numel() * t.element_size() for t in tensors)
    print(f"{shape}: stored {stored:,} predicted {lora.nf4_tensor_bytes(weight.numel()):,}")
    assert lora.nf4_tensor_bytes(weight.numel()) == pytest.approx(stored, rel=0.03)


@pytest.mark.parametrize("shape", [(352, 128), (1000, 77)])
def test_the_quantization_state_lies_outside_the_parameter_zero3_partitions(shape):
    """QLoRA under ZeRO-3 stores the 4-bit weight in the compute dtype
    (``bnb_4bit_quant_storage``): the parameter's storage, all that DeepSpeed partitions
    (``param.data``), holds the packed values only; absmax, codes and offset are tensors of
    ``quant_state`` that every rank keeps whole (lora.frozen_base_bytes)."""
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")

    weight = torch.randn(*shape)
    param = bnb.nn.Params4bit(
        weight,
        requires_grad=False,
        compress_statistics=True,
        quant_type="nf4",
        quant_storage=torch.bfloat16,
    )._quantize("cpu")
    assert param.dtype == torch.bfloat16
    packed = param.untyped_storage().nbytes()
    state = param.quant_state
    kept = [state.absmax, state.code, state.offset, state.state2.absmax, state.state2.code]
    kept_bytes = sum(t.numel() * t.element_size() for t in kept)
    assert all(t.untyped_storage().data_ptr() != param.data_ptr() for t in kept)
    assert packed == -(-weight.numel() // 2)
    assert lora.nf4_state_bytes(weight.numel(), 1) == pytest.approx(kept_bytes, rel=0.03)


def test_qlora_base_counts_quantized_layers_and_16_bit_rest():
    """A whole model loaded by transformers with BitsAndBytesConfig is not possible offline on
    CPU, so the base's split is checked on peft's own wrapping: the Linear4bit modules
    replace exactly the decoder's linear layers (the count lora.quantized_elements takes)."""
    model = _model()
    spec = _spec()
    linear = {
        name: module.weight.numel()
        for name, module in model.named_modules()
        if module.__class__.__name__ == "Linear" and "lm_head" not in name
    }
    elements, tensors = lora.quantized_elements(spec)
    assert (elements, tensors) == (sum(linear.values()), len(linear))


def _storage_tracker():
    """The probe's StorageTracker (tests/scripts/zero_phase_probe.py): every storage an aten op
    creates, rounded to the CUDA allocator's 512 B blocks."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "zero_phase_probe.py"
    spec = importlib.util.spec_from_file_location("zero_phase_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.StorageTracker()


def _saved_bytes(model, ids) -> int:
    from memory_probe import saved_tensor_bytes

    return saved_tensor_bytes(model, lambda: model(input_ids=ids))


def _quant_state_tensors(model) -> list:
    """A 4-bit weight's quantization state tensors (absmax, codes, offset): they live outside the
    parameter's storage."""
    tensors = []
    for param in model.parameters():
        state = getattr(param, "quant_state", None)
        if state is not None:
            tensors += [state.absmax, state.code, state.offset, state.state2.absmax]
            tensors.append(state.state2.code)
    return tensors


def _second_step_peak(model, ids) -> int:
    """A plain training loop's second step (forward + loss, backward, foreach AdamW) of a peft
    model, measured by the storage tracker from what the first step left (weights, quantization
    state, Adam states). MemTracker hooks every parameter and refuses frozen ones, hence the
    storage tracker."""
    torch = pytest.importorskip("torch")
    from memory_probe import fp32_kernels_for_emulated_bf16

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the first step creates the Adam states
    tracker = _storage_tracker()
    states = [t for state in optimizer.state.values() for t in state.values()]
    tracker.track_existing([*model.parameters(), *states, *_quant_state_tensors(model)])
    with fp32_kernels_for_emulated_bf16(), tracker:
        step()
    return tracker.peak


def probe_setup(targets: str, dropout: float, input_grads: bool, **more) -> TrainSetup:
    """The fp32 rank-8 LoRA setup of a saved-bytes probe; input grads come with checkpointing,
    which is what turns them on."""
    return TrainSetup(
        finetuning="lora",
        lora_rank=8,
        lora_targets=targets,
        lora_dropout=dropout,
        gradient_checkpointing=input_grads,
        precision="fp32",
        **more,
    )


@pytest.mark.parametrize("dropout", [0.0, 0.05])
@pytest.mark.parametrize("input_grads", [False, True])
@pytest.mark.parametrize("targets", ["all-linear", "attention", "q_proj,v_proj,down_proj"])
def test_saved_activations_with_adapters(dropout, input_grads, targets):
    """What autograd saves in a forward of the peft model (saved-tensor hooks): the full
    formula plus lora.adapter_layer_delta_per_token per layer, the final norm's and LM head's
    (adapter_final_delta_per_token) and, when the first layer's input needs no grad, its norm's
    fp32 copy. CPU dropout keeps a scaled noise tensor in the input's dtype, not CUDA's
    boolean mask: the delta is taken with that mask size."""
    torch = pytest.importorskip("torch")
    model = _peft(_model(), 8, peft_target_modules(targets), dropout)
    if input_grads:
        model.enable_input_require_grads()
    ids = torch.randint(0, SHAPE["vocab_size"], (MICRO, SEQ))
    measured = _saved_bytes(model, ids)

    spec, tokens = _spec(), MICRO * SEQ
    setup = probe_setup(targets, dropout, input_grads)
    batch = act.LayerBatch(MICRO, SEQ, "sdpa", 4)
    full = act.stored_activation_bytes(spec, 4, batch, False)
    layer = lora.adapter_layer_delta_per_token(spec, setup, 4, 4, mask_bytes=4)
    final = lora.adapter_final_delta_per_token(spec, setup, 4, 4, "hf")
    first = lora.first_layer_saving_per_token(spec, setup, mask_bytes=4)
    predicted = full + (spec.num_layers * layer + final - first) * tokens
    print(f"{targets} dropout {dropout} input grads {input_grads}: measured {measured:,} "
          f"predicted {predicted:,} ({predicted / measured - 1:+.2%})")
    assert predicted == pytest.approx(measured, rel=0.03)


# (targets, dropout, input grads): per-module dropout copies and shared norm outputs, a group
# left untargeted (attention: the MLP's inputs), and the first layer without input grads
ZERO3_CASES = [
    ("all-linear", 0.05, False),
    ("all-linear", 0.0, True),
    ("attention", 0.05, True),
    ("q_proj,v_proj,down_proj", 0.0, False),
]


@pytest.fixture(scope="module")
def zero3_saved():
    """tests/scripts/zero3_lora_saved_probe.py run once for ZERO3_CASES (one process, one rank
    over gloo): the saved bytes of each peft model's forward, plain and under ZeRO-3."""
    pytest.importorskip("deepspeed")
    cases = []
    for targets, dropout, input_grads in ZERO3_CASES:
        case = {"targets": peft_target_modules(targets), "dropout": dropout}
        cases.append(dict(case, input_grads=input_grads))
    spec = {"shape": SHAPE, "micro": MICRO, "seq": SEQ, "cases": cases}
    return run_probe_script("zero3_lora_saved_probe.py", spec)


def run_probe_script(name: str, spec: dict) -> dict:
    """Run tests/scripts/``name`` with ``spec`` as its JSON argument, as one DeepSpeed rank on
    the CPU over gloo in a process of its own, and return the ``results`` of its last line."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from conftest import find_free_port

    root = Path(__file__).resolve().parents[2]
    env = dict(
        os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", MASTER_PORT=str(find_free_port())
    )
    done = subprocess.run(
        [sys.executable, str(root / "tests" / "scripts" / name), json.dumps(spec)],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["results"]


@pytest.mark.parametrize("index", range(len(ZERO3_CASES)))
def test_zero3_frozen_linears_save_their_inputs(zero3_saved, index):
    """DeepSpeed ZeRO-3 (the real engine on one CPU rank) replaces F.linear with
    zero3_linear_wrap, whose LinearFunctionForZeroStage3 saves every base layer's input: the
    forward saves lora.zero3_base_input_per_token per layer (the norms' outputs where no
    lora_A saves them, down_proj's input; o_proj's shares the attention kernel's output), the
    LM head's input, less the first layer's q/k/v input when that layer needs no input grad,
    beyond what the same model saves with torch's own linear; and in all what the adapter
    formulas predict for stage 3, within 3 %."""
    targets, dropout, input_grads = ZERO3_CASES[index]
    result = zero3_saved[index]
    assert result["wrapped"], "zero.Init left torch's own F.linear in place"
    spec, tokens = _spec(), MICRO * SEQ
    setup = probe_setup(targets, dropout, input_grads, stage=3, stack="deepspeed")
    plain_setup = dataclasses.replace(setup, stage=2)
    layer_term = lora.zero3_base_input_per_token(spec, setup, 4, 4)
    head = 4 * SHAPE["hidden_size"]
    first = lora.zero3_first_layer_saving_per_token(spec, setup)
    predicted_increase = (spec.num_layers * layer_term + head - first) * tokens
    increase = result["zero3"] - result["plain"]
    batch = act.LayerBatch(MICRO, SEQ, "sdpa", 4)
    full = act.stored_activation_bytes(spec, 4, batch, False)

    def adapter_total(chosen) -> int:
        layer = lora.adapter_layer_delta_per_token(spec, chosen, 4, 4, mask_bytes=4)
        final = lora.adapter_final_delta_per_token(spec, chosen, 4, 4, "hf")
        first_layer = lora.first_layer_saving_per_token(spec, chosen, mask_bytes=4)
        return full + (spec.num_layers * layer + final - first_layer) * tokens

    print(f"ZeRO-3 {targets} dropout {dropout} input grads {input_grads}: plain "
          f"{result['plain']:,} zero3 {result['zero3']:,}; increase {increase:,} predicted "
          f"{predicted_increase:,}; total predicted {adapter_total(setup):,} "
          f"({adapter_total(setup) / result['zero3'] - 1:+.2%})")
    assert predicted_increase == pytest.approx(increase, rel=0.03)
    assert adapter_total(setup) == pytest.approx(result["zero3"], rel=0.03)
    assert adapter_total(plain_setup) == pytest.approx(result["plain"], rel=0.03)


def test_4bit_layers_save_no_input_under_zero3s_linear():
    """bitsandbytes' Linear4bit multiplies through matmul_4bit (MatMul4Bit keeps only the
    packed weight), not F.linear: with DeepSpeed's zero3_linear_wrap in place of F.linear it
    saves no input, where a frozen 16-bit nn.Linear saves its input (lora.py:
    zero3_base_input_per_token adds nothing for QLoRA's layers, only its 16-bit LM head)."""
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.linear import zero3_linear_wrap

    fan_in, fan_out, tokens = 256, 512, 300
    layer = bnb.nn.Linear4bit(fan_in, fan_out, bias=False, compute_dtype=torch.float32)
    layer.weight = bnb.nn.Params4bit(
        torch.randn(fan_out, fan_in), requires_grad=False, quant_type="nf4"
    )._quantize("cpu")
    frozen = torch.nn.Linear(fan_in, fan_out, bias=False).requires_grad_(False)
    x = torch.randn(tokens, fan_in, requires_grad=True)
    weights = {layer.weight.untyped_storage().data_ptr(), frozen.weight.data_ptr()}

    def saved_input_bytes(module) -> int:
        saved = []

        def pack(tensor):
            if tensor.untyped_storage().data_ptr() not in weights:
                saved.append(tensor.numel() * tensor.element_size())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            module(x)
        return sum(saved)

    torch_linear = torch.nn.functional.linear
    torch.nn.functional.linear = zero3_linear_wrap
    try:
        four_bit, sixteen_bit = saved_input_bytes(layer), saved_input_bytes(frozen)
    finally:
        torch.nn.functional.linear = torch_linear
    assert (four_bit, sixteen_bit) == (0, x.numel() * 4)


def test_dequantized_weight_is_the_4bit_matmuls_temporary():
    """bitsandbytes' Linear4bit forward and input-gradient matmul on CPU (MemTracker): beyond
    the input's grad, one dequantized weight (and its fp32 absmax) is alive."""
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")

    fan_in, fan_out, tokens = 352, 128, 512
    layer = bnb.nn.Linear4bit(
        fan_in, fan_out, bias=False, compute_dtype=torch.float32, compress_statistics=True,
        quant_type="nf4",
    )
    layer.weight = bnb.nn.Params4bit(
        torch.randn(fan_out, fan_in), requires_grad=False, compress_statistics=True,
        quant_type="nf4",
    )._quantize("cpu")
    x = torch.randn(tokens, fan_in, requires_grad=True)

    tracker = _storage_tracker()  # MemTracker hooks the module's params, which need no grad
    tracker.track_existing([x])  # the 4-bit weight existed before: not counted
    with tracker:
        layer(x).sum().backward()
    peak = tracker.peak
    spec = dataclasses.replace(_spec(), hidden_size=fan_out, intermediate_size=fan_in)
    setup = TrainSetup(finetuning="qlora", precision="fp32")
    # the peak is in backward: the input's grad beside the dequantized weight (the output is
    # freed by then, and the grad of ``sum()`` is an expanded scalar)
    io = tokens * fan_in * 4
    largest = max(a * b for a, b in lora.layer_linear_shapes(spec).values())
    assert largest == fan_in * fan_out
    predicted = lora.dequantized_weight_bytes(spec, setup, 4) + io
    measured = peak - x.numel() * 4
    print(f"4-bit matmul: measured {measured:,} predicted {predicted:,}")
    assert predicted == pytest.approx(measured, rel=0.03)


# an activation-bound shape (tests/memory/test_estimate.py PLAIN_SHAPES["backward"])
STEP_SHAPE = dict(
    hidden_size=256,
    intermediate_size=1408,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=500,
)


def plain_lora_step_setup(
    micro: int, seq: int, checkpointing: bool, dtype: str, **more
) -> TrainSetup:
    """A plain loop's stage-0 LoRA setup (foreach AdamW, weights loaded in ``dtype``, no
    dropout), as the whole-step probes run it."""
    return TrainSetup(
        stage=0,
        stack="accelerate",
        precision=dtype,
        weights_dtype=dtype,
        micro_batch=micro,
        seq_len=seq,
        gradient_checkpointing=checkpointing,
        optimizer="adamw_torch",
        finetuning="lora",
        lora_dropout=0.0,
        **more,
    )


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_whole_lora_step_matches_torch(checkpointing):
    """A plain training loop's second step (forward + loss, backward, foreach AdamW) of a peft
    LoRA model (all-linear, r 16, no dropout: CPU dropout's mask differs from CUDA's) in fp32,
    measured by the storage tracker: the estimate's peak within 3 %."""
    torch = pytest.importorskip("torch")
    from zerofit.models.resolve import spec_from_config

    micro, seq = 2, 192
    model = _peft(_model(**STEP_SHAPE), 16, "all-linear", 0.0)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    measured = _second_step_peak(model, torch.randint(0, STEP_SHAPE["vocab_size"], (micro, seq)))
    spec = spec_from_config({**SHAPE, **STEP_SHAPE, "model_type": "qwen2"}, "probe")
    setup = plain_lora_step_setup(micro, seq, checkpointing, "fp32")
    est = estimate_memory(spec, setup)
    full = estimate_memory(spec, dataclasses.replace(setup, finetuning="full"))
    error = est.peak_bytes / measured - 1
    print(f"LoRA step ckpt={checkpointing}: measured {measured:,} predicted {est.peak_bytes:,} "
          f"({est.phase}, {error:+.2%}); full fine-tune {full.peak_bytes:,}")
    assert est.peak_bytes == pytest.approx(measured, rel=0.03)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("targets", ["all-linear", "q_proj,v_proj"])
def test_a_plain_bf16_lora_step_without_autocast_matches_torch(targets, checkpointing):
    """A plain loop without autocast on weights loaded in bf16, peft's fp32 adapters kept
    (``get_peft_model``'s default): ``lora_A`` saves an fp32 copy of each targeted module's
    input and ``lora_B`` an fp32 intermediate (``TrainSetup(autocast=False)``). q/v targets
    leave ``down_proj`` frozen: its backward then holds three intermediate-width grads. The
    second step's peak within 3 % of the estimate; the autocast estimate is far lower."""
    torch = pytest.importorskip("torch")
    from memory_probe import fp32_kernels_for_emulated_bf16

    from zerofit.models.resolve import spec_from_config

    micro, seq = 2, 192
    model = _model(**STEP_SHAPE).to(torch.bfloat16)
    model = _peft(model, 16, peft_target_modules(targets), 0.0)
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    ids = torch.randint(0, STEP_SHAPE["vocab_size"], (micro, seq))
    with fp32_kernels_for_emulated_bf16():
        measured = _second_step_peak(model, ids)
    spec = spec_from_config({**SHAPE, **STEP_SHAPE, "model_type": "qwen2"}, "probe")
    setup = plain_lora_step_setup(
        micro, seq, checkpointing, "bf16", autocast=False, lora_targets=targets
    )
    est = estimate_memory(spec, setup)
    under_autocast = estimate_memory(spec, dataclasses.replace(setup, autocast=True))
    error = est.peak_bytes / measured - 1
    print(f"bf16 LoRA {targets} ckpt={checkpointing}, no autocast: measured {measured:,} "
          f"predicted {est.peak_bytes:,} ({est.phase}, {error:+.2%}); with autocast "
          f"{under_autocast.peak_bytes / measured - 1:+.2%}")
    assert est.peak_bytes == pytest.approx(measured, rel=0.03)
    assert under_autocast.peak_bytes < est.peak_bytes


def test_trl_sft_trainer_lora_step_matches_the_estimate(tmp_path, step_model_dir):
    """``SFTTrainer.train()`` of TRL 1.16 for two steps with a ``peft_config`` (all-linear, r 16,
    no dropout: CPU dropout keeps a noise tensor where CUDA keeps a boolean mask) and TRL's own
    defaults otherwise: the model loaded by path in fp32, bf16 autocast, gradient checkpointing
    with ``enable_input_require_grads``, fp32 adapters, the fused LM head, rows padded to the
    longest of each batch. The estimate (stage 0, hf stack, weights fp32, loss trl_fused) is
    within 3 % of the measured peak once the head's CPU fallback tiles are set aside, as for the
    full fine-tune (tests/memory/test_real_clients.py)."""
    pytest.importorskip("trl")
    from peft import LoraConfig
    from test_real_clients import (
        _measured_peak,
        _trl_defaults,
        _trl_trainer,
        _two_quiet_cpu_steps,
        _words,
    )
    from trl import SFTConfig, SFTTrainer

    from zerofit.models.resolve import spec_from_config

    seq, micro = 256, 2
    shape = {**SHAPE, **STEP_SHAPE}
    model_dir = step_model_dir
    rows = [{"text": _words(seq + 64 if k % 2 == 0 else 150 + 20 * k, k)} for k in range(2 * micro)]
    args = SFTConfig(**_two_quiet_cpu_steps(tmp_path / "out", micro), max_length=seq)
    peft_config = LoraConfig(r=16, target_modules="all-linear", lora_dropout=0.0)
    trainer = _trl_trainer(SFTTrainer, model_dir, args, rows, peft_config=peft_config)
    assert args.gradient_checkpointing and args.bf16
    measured = _measured_peak(trainer, trainer.model)

    setup = dataclasses.replace(
        _trl_defaults("sft", micro, seq), finetuning="lora", lora_rank=16, lora_dropout=0.0
    )
    est = estimate_memory(spec_from_config({**shape, "model_type": "qwen2"}, "probe"), setup)
    tiles = _frozen_head_fallback_tiles(micro * seq - micro, shape["vocab_size"], est)
    error = est.peak_bytes / (measured - tiles) - 1
    assert est.loss_path == "trl_fused"
    print(f"SFTTrainer LoRA: measured {measured:,}, CPU fallback tiles {tiles:,}; predicted "
          f"{est.peak_bytes:,} ({est.phase}, {error:+.2%})")
    assert est.peak_bytes == pytest.approx(measured - tiles, rel=0.03)


def _frozen_head_fallback_tiles(tokens: int, vocab: int, est) -> int:
    """Bytes TRL's fused head holds on a CPU beyond what the estimate counts for it (a frozen
    head): its torch fallback (``_forward_tile`` / ``_backward_tile``) works on whole fp32
    ``[N, V]`` tiles that the Triton kernel of a GPU keeps in registers. Measured by running the
    head alone, forward and backward, with a frozen weight: its peak minus the estimate's loss
    term (the hidden states' gathered copy, the matmul buffer, per-token statistics and the fp32
    input-grad accumulator with its cast)."""
    import torch
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    from zerofit.memory.losses import TRL_VOCAB_CHUNK

    hidden = STEP_SHAPE["hidden_size"]
    states = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, hidden, dtype=torch.bfloat16)
    targets = torch.randint(0, vocab, (tokens,))
    tracker = _storage_tracker()
    tracker.track_existing([states, weight])
    with tracker:
        outputs = ChunkedLogProbFunction.apply(
            states, weight, None, targets, 1.0, TRL_VOCAB_CHUNK, None, 1.0,
            ("log_probs", "entropy", "is_top1"),
        )
        outputs[0].sum().backward()
    return tracker.peak - est.breakdown["logits"]


def _seven_b(**changes) -> TrainSetup:
    return TrainSetup(
        stack="hf", world_size=4, gpus_per_node=4, gradient_checkpointing=True, **changes
    )


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_partitions_the_adapters_and_only_stage_3_the_base(stage):
    """ZeRO-1/2 partition the trainable states only: the frozen base is a full replica on every
    GPU; ZeRO-3 shards it. The adapters' master and Adam states are their partition."""
    from memory_shapes import QWEN25_7B

    setup = _seven_b(stage=stage, finetuning="lora")
    est = estimate_memory(QWEN25_7B, setup)
    base = QWEN25_7B.params * 2
    trainable = lora.adapter_params(QWEN25_7B, 16, "all-linear")
    resident = lora.adapter_resident_states(QWEN25_7B, setup, 2, {})
    assert resident["frozen_params"] == (base if stage < 3 else -(-base // 4))
    assert resident["master_fp32"] == -(-trainable // 4) * 4
    assert resident["optimizer_states"] == -(-trainable // 4) * 8
    assert est.peak_bytes < estimate_memory(QWEN25_7B, _seven_b(stage=stage)).peak_bytes


def test_qlora_base_is_sharded_under_zero3_only_with_matching_storage():
    from memory_shapes import QWEN25_7B

    sharded = _seven_b(stage=3, finetuning="qlora")
    whole = dataclasses.replace(sharded, quant_storage="uint8")
    full_base = lora.frozen_base_bytes(QWEN25_7B, whole, 2)
    # 6.53B quantized weights at ~0.51 byte, 1.09B embedding and head weights in bf16
    assert 5.4e9 < full_base < 5.7e9
    # ZeRO-3 partitions the packed values and the 16-bit rest; the quantization state stays
    # whole on every rank
    quantized, tensors = lora.quantized_elements(QWEN25_7B)
    state = lora.nf4_state_bytes(quantized, tensors)
    assert lora.frozen_base_bytes(QWEN25_7B, sharded, 2) == -(-(full_base - state) // 4) + state
    offloaded = dataclasses.replace(sharded, offload_param="cpu")
    assert lora.frozen_base_bytes(QWEN25_7B, offloaded, 2) == state


def test_zero3_gathers_the_16_bit_lm_head_and_packed_4bit_layers():
    """ZeRO-3's gather arithmetic runs on the parameters DeepSpeed holds: the LM head and the
    embedding whole in bf16 (get_keys_to_not_convert), each Linear4bit weight as its packed
    bf16 elements (a quarter of its count), the adapters with their layer. The prefetch bucket
    counts those elements, so it is not divided by four (it was, before: one rank's 16-bit
    figure scaled down whole)."""
    from memory_shapes import QWEN25_7B

    from zerofit.memory.states import stage3_live_params

    setup = _seven_b(stage=3, finetuning="qlora")
    buckets = setup.bucket_sizes(QWEN25_7B.hidden_size)
    held = lora.zero3_parameter_model(QWEN25_7B, setup, 2)
    quantized, _ = lora.quantized_elements(QWEN25_7B)
    assert held.params == QWEN25_7B.params - quantized + quantized // 4
    trainable = lora.adapter_params(QWEN25_7B, 16, "all-linear")
    with_adapters = dataclasses.replace(held, params=held.params + trainable)
    live = lora.zero3_live_param_bytes(QWEN25_7B, setup, 2, buckets)
    assert live == stage3_live_params(with_adapters, setup, 2, buckets)
    head = QWEN25_7B.vocab_size * QWEN25_7B.hidden_size * 2
    assert head < live < stage3_live_params(QWEN25_7B, setup, 2, buckets)
    assert estimate_memory(QWEN25_7B, setup).phases["forward"] >= live


def test_packed_elements_are_what_bitsandbytes_stores_in_the_compute_dtype():
    """A 4-bit weight stored in bf16 (bnb_4bit_quant_storage) is a parameter of n / 4
    elements: what DeepSpeed partitions, gathers and offloads (lora.packed_elements)."""
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")

    for storage, width in ((torch.bfloat16, 2), (torch.uint8, 1)):
        weight = torch.randn(352, 128)
        param = bnb.nn.Params4bit(
            weight, requires_grad=False, quant_type="nf4", quant_storage=storage
        )._quantize("cpu")
        assert param.numel() == lora.packed_elements(weight.numel(), width)


QLORA_OFFLOAD_SHAPE = dict(SHAPE)


@pytest.fixture(scope="module")
def zero3_qlora_offload():
    """tests/scripts/zero3_qlora_offload_probe.py: a real ZeRO-3 engine, parameters offloaded,
    on a transformers-loaded QLoRA model (one rank over gloo), per quant storage."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("bitsandbytes")
    return run_probe_script("zero3_qlora_offload_probe.py", QLORA_OFFLOAD_SHAPE)


def test_offloaded_qlora_partitions_are_the_packed_base_exactly(zero3_qlora_offload):
    """The real engine's CPU partitions (sum of ds_tensor.numel() * element_size()) are what
    the host term counts before pinned rounding, to the byte: the 4-bit weights packed, the
    embedding, LM head, norms and biases in bf16, the adapters in the optimizer's flat buffer.
    A uint8 storage offloads the same bytes (DeepSpeed partitions it too); the quantization
    state, no parameter, stays where it was loaded."""
    from zerofit.memory import pinned

    spec = _spec()
    setup = TrainSetup(
        stack="deepspeed", stage=3, world_size=1, finetuning="qlora", lora_rank=8,
        offload_param="cpu",
    )
    held = lora.zero3_parameter_model(spec, setup, 2)
    adapters = lora.adapter_tensor_sizes(spec, 8, "all-linear")
    expected = pinned.zero3_partition_bytes(held, 1, 2, adapters)
    quantized, _ = lora.quantized_elements(spec)
    for storage, width in (("bfloat16", 2), ("uint8", 1)):
        real = zero3_qlora_offload[storage]
        print(storage, real, "estimate", expected)
        assert real["devices"] == ["cpu"] and real["quant_state_devices"] == ["cpu"]
        assert real["packed_linear_elements"] == lora.packed_elements(quantized, width)
        assert real["frozen_bytes"] + real["trainable_bytes"] == expected
        assert real["flat_buffer_bytes"] == [sum(adapters) * 2] == [real["trainable_bytes"]]
    unpinned = dataclasses.replace(setup, pin_param_offload=False)
    flat = pinned.pinned_bytes(sum(adapters) * 2)
    assert lora.adapter_host_bytes_per_rank(spec, unpinned, 2) == (
        expected - sum(adapters) * 2 + flat
    )


def test_70b_qlora_offload_host_ram_is_the_packed_base_not_a_16_bit_one():
    """Llama-3.1-70B QLoRA on 2 GPUs, ZeRO-3 with optimizer and parameters on the CPU: each
    rank offloads half the packed base (~19 GB), not half a 16-bit one (~70 GB); the frozen
    base makes no flat buffer (it is in no optimizer param group), so nothing of it is
    counted twice. The node's need was 406 GiB pinned (135 unpinned) before."""
    from memory_shapes import LLAMA31_70B

    setup = TrainSetup(
        stack="hf", stage=3, world_size=2, gpus_per_node=2, finetuning="qlora",
        offload_optimizer="cpu", offload_param="cpu", gradient_checkpointing=True,
    )
    held = lora.zero3_parameter_model(LLAMA31_70B, setup, 2)
    per_rank_base = held.params * 2 / 2
    assert 18e9 < per_rank_base < 20e9
    host = estimate_memory(LLAMA31_70B, setup).cpu_bytes
    unpinned = estimate_memory(LLAMA31_70B, setup.with_pinning(False)).cpu_bytes
    assert 2 * per_rank_base < unpinned < host < 50 * 1024**3
    uint8 = dataclasses.replace(setup, quant_storage="uint8")
    assert estimate_memory(LLAMA31_70B, uint8).cpu_bytes == host


def test_qlora_under_zero3_loads_the_whole_4bit_base_on_every_gpu():
    """transformers builds a quantized model outside zero.Init and bitsandbytes puts it whole
    on the current GPU: before deepspeed.initialize partitions it, every GPU holds the whole
    4-bit base. Llama-3.1-70B's is ~37 GiB, more than an RTX 4090, offload or not; ZeRO-2
    holds it through training anyway (no separate moment)."""
    from memory_shapes import LLAMA31_70B

    setup = TrainSetup(
        stack="hf", gpu="RTX4090", stage=3, world_size=2, gpus_per_node=2,
        finetuning="qlora", offload_optimizer="cpu", offload_param="cpu",
        gradient_checkpointing=True,
    )
    est = estimate_memory(LLAMA31_70B, setup)
    whole = lora.frozen_base_bytes(LLAMA31_70B, dataclasses.replace(setup, stage=2), 2)
    assert est.phase == "load"
    assert est.breakdown["frozen_params"] == whole
    assert 36 * 1024**3 < est.peak_bytes and not est.fits(24.0)
    zero2 = dataclasses.replace(setup, stage=2, offload_param="none")
    assert "load" not in estimate_memory(LLAMA31_70B, zero2).phases


def test_adapter_dpo_reference_is_the_base_with_adapters_disabled():
    """TRL given a PEFT model and no ref_model: no second copy of the weights, but the
    reference forward and its logits still run."""
    from memory_shapes import QWEN25_7B

    full = estimate_memory(QWEN25_7B, _seven_b(stage=2, workload="dpo"))
    adapters = estimate_memory(QWEN25_7B, _seven_b(stage=2, workload="dpo", finetuning="lora"))
    assert "reference" in adapters.phases and "reference" in full.phases
    assert full.breakdown.get("reference_model") or full.phases["reference"]
    resident = lora.adapter_resident_states(QWEN25_7B, _seven_b(stage=2), 2, {})
    assert "reference_model" not in resident


def test_full_fine_tune_estimates_are_unchanged_by_the_adapter_fields():
    """The adapter fields are ignored for finetuning full (defaults keep every estimate)."""
    from memory_shapes import QWEN25_7B

    plain = estimate_memory(QWEN25_7B, _seven_b(stage=2))
    other = estimate_memory(QWEN25_7B, _seven_b(stage=2, lora_rank=64, lora_dropout=0.0))
    assert plain == other


def test_offloaded_optimizer_holds_only_the_adapters_on_the_host():
    from memory_shapes import QWEN25_7B

    setup = _seven_b(stage=2, offload_optimizer="cpu", finetuning="lora")
    lora_host = estimate_memory(QWEN25_7B, setup).cpu_bytes
    full_host = estimate_memory(QWEN25_7B, dataclasses.replace(setup, finetuning="full")).cpu_bytes
    assert 0 < lora_host < full_host / 50


def _qlora_model(model_dir):
    """The step shape's saved model loaded by transformers with QLoRA's BitsAndBytesConfig (NF4,
    double quantization) on the CPU, fp32 compute, as bitsandbytes 0.50 allows."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from conftest import load_nf4_model

    return load_nf4_model(model_dir, torch.float32)


def _param_bytes(model) -> int:
    """Every parameter's bytes, with a 4-bit weight's quantization state."""
    tensors = [*model.parameters(), *_quant_state_tensors(model)]
    return sum(t.numel() * t.element_size() for t in tensors)


# a long micro batch (activation grads outweigh the dequantized weight) and a short one (the
# dequantized down_proj weight sets the backward's peak)
@pytest.mark.parametrize("micro, seq", [(2, 192), (1, 32)])
def test_a_whole_qlora_step_matches_torch(step_model_dir, micro, seq):
    """transformers' own 4-bit loading (Linear4bit in every decoder linear layer, the embedding,
    norms and LM head unquantized) holds exactly lora.frozen_base_bytes; a plain loop's second
    step of peft adapters on it (all-linear, r 16, no dropout, gradient checkpointing with input
    grads, as TRL's trainers and recipes/lora.py set it) is within 3 % of the estimate."""
    torch = pytest.importorskip("torch")
    from zerofit.models.resolve import spec_from_config

    base = _qlora_model(step_model_dir)
    spec = spec_from_config({**SHAPE, **STEP_SHAPE, "model_type": "qwen2"}, "probe")
    setup = TrainSetup(
        stage=0,
        stack="accelerate",
        precision="fp32",
        weights_dtype="fp32",
        micro_batch=micro,
        seq_len=seq,
        gradient_checkpointing=True,
        optimizer="adamw_torch",
        finetuning="qlora",
        lora_dropout=0.0,
    )
    assert _param_bytes(base) == lora.frozen_base_bytes(spec, setup, 4)
    model = _peft(base, 16, "all-linear", 0.0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    measured = _second_step_peak(model, torch.randint(0, STEP_SHAPE["vocab_size"], (micro, seq)))
    est = estimate_memory(spec, setup)
    error = est.peak_bytes / measured - 1
    print(f"QLoRA step: measured {measured:,} predicted {est.peak_bytes:,} ({est.phase}, "
          f"{error:+.2%}) {est.breakdown}")
    assert est.peak_bytes == pytest.approx(measured, rel=0.03)


@pytest.fixture(scope="module")
def step_model_dir(tmp_path_factory):
    """The step shape's Qwen2 (fp32 weights) and a word-level tokenizer in a directory, saved once
    for this file: what TRL's trainers load by path, and the QLoRA step's base."""
    torch = pytest.importorskip("torch")
    from conftest import write_tiny_model_dir
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = {**SHAPE, **STEP_SHAPE}
    folder = tmp_path_factory.mktemp("lora_step") / "model"
    model_dir = write_tiny_model_dir(folder, vocab_size=shape["vocab_size"])
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", attn_implementation="sdpa", use_cache=False, **shape)
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    return model_dir


def test_trl_dpo_trainer_lora_step_matches_the_estimate(tmp_path, step_model_dir):
    """``DPOTrainer.train()`` of TRL 1.16 for two steps with a ``peft_config`` and no reference
    model: TRL's reference is the policy with its adapters disabled (``ref_model`` stays None),
    so no second copy of the weights; its defaults otherwise (fp32 load, bf16 autocast,
    checkpointing, the fused LM head, padded pairs). Within 3 % of the estimate once the fused
    head's CPU fallback tiles are set aside, as for SFT."""
    pytest.importorskip("trl")
    from peft import LoraConfig
    from test_real_clients import (
        _measured_peak,
        _trl_defaults,
        _trl_trainer,
        _two_quiet_cpu_steps,
        _words,
    )
    from trl import DPOConfig, DPOTrainer

    from zerofit.models.resolve import spec_from_config

    seq, micro = 128, 2
    rows = []
    for k in range(4 * micro):
        prompt = 32 if k % 2 == 0 else 20
        chosen = seq - prompt if k % 4 == 0 else 60
        rows.append(
            {
                "prompt": _words(prompt, k),
                "chosen": " " + _words(chosen, k + 1),
                "rejected": " " + _words(40 + k, k + 2),
            }
        )
    args = DPOConfig(**_two_quiet_cpu_steps(tmp_path / "out", micro), max_length=seq)
    peft_config = LoraConfig(r=16, target_modules="all-linear", lora_dropout=0.0)
    trainer = _trl_trainer(DPOTrainer, step_model_dir, args, rows, peft_config=peft_config)
    assert trainer.ref_model is None and args.gradient_checkpointing
    measured = _measured_peak(trainer, trainer.model)

    setup = dataclasses.replace(
        _trl_defaults("dpo", micro, seq), finetuning="lora", lora_rank=16, lora_dropout=0.0
    )
    spec = spec_from_config({**SHAPE, **STEP_SHAPE, "model_type": "qwen2"}, "probe")
    est = estimate_memory(spec, setup)
    # the peak is the policy head's backward, whose CPU fallback tiles a GPU does not allocate
    tiles = _frozen_head_fallback_tiles(2 * micro * (seq - 1), STEP_SHAPE["vocab_size"], est)
    error = est.peak_bytes / (measured - tiles) - 1
    print(f"DPOTrainer LoRA: measured {measured:,}, CPU fallback tiles {tiles:,}; predicted "
          f"{est.peak_bytes:,} ({est.phase}, {error:+.2%})")
    assert "reference_model" not in est.breakdown and "reference" in est.phases
    assert est.peak_bytes == pytest.approx(measured - tiles, rel=0.03)


def test_plan_names_lora_and_qlora_when_a_full_fine_tune_does_not_fit():
    """A 7B on 2 x 24 GB: the full fine-tune does not fit without offload, so the plan's note
    names what LoRA and QLoRA give (planning/reasons.adapters_hint); planning LoRA itself fits,
    and a 70B QLoRA plan on 2 x 80 GB fits too. Each plan is the planner's own search, in
    well under a second once imported."""
    import time

    from zerofit.planning.answers import Answers
    from zerofit.planning.plan import plan
    from zerofit.planning.reasons import adapters_hint

    answers = Answers(model="qwen2.5-7b", gpu="RTX4090", gpus_per_node=2, host_ram_gib=64.0)
    full = plan(answers)
    hint = adapters_hint(full)
    assert hint and "LoRA fits: ZeRO-" in hint and "QLoRA fits: ZeRO-" in hint
    started = time.perf_counter()
    lora_plan = plan(answers.replace(finetuning="lora"))
    seventy = plan(
        Answers(model="llama-3.1-70b", gpu="H100-SXM", gpus_per_node=2, finetuning="qlora")
    )
    seconds = time.perf_counter() - started
    print(f"\n{hint}\ntwo adapter plans in {seconds:.2f} s")
    assert lora_plan.fits and seventy.fits and adapters_hint(lora_plan) is None


def test_peft_default_targets_are_what_peft_adapts_without_target_modules():
    """``--lora-targets peft-default`` is ``LoraConfig(target_modules=None)``: the same adapters
    as the modules peft picks (counted on the real peft model), and a one-line error for an
    architecture peft has no default for."""
    pytest.importorskip("peft")
    model = _peft(_model(), 8, None, 0.0)
    peft_count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert lora.peft_default_targets(_spec()) == "q_proj,v_proj"
    assert lora.adapter_params(_spec(), 8, "peft-default") == peft_count
    lora.check_lora_targets("peft-default")
    olmo2 = dataclasses.replace(_spec(), architecture="olmo2")
    with pytest.raises(ZerofitError, match="lora_targets: peft has no default targets"):
        lora.targeted_modules(olmo2, "peft-default")


MOE_SHAPE = dict(
    hidden_size=1024,
    intermediate_size=2048,
    moe_intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=64,
    num_experts_per_tok=8,
    vocab_size=1000,
)


def test_all_linear_adapts_the_fused_experts_as_peft_does():
    """transformers 5 keeps an MoE layer's experts as two 3D parameters; peft turns all-linear
    into target_parameters for them (gate_up_proj at twice the rank): the adapters zerofit
    counts are peft's own, on a real peft model of a small Qwen3-MoE."""
    pytest.importorskip("peft")
    from transformers import AutoConfig, AutoModelForCausalLM

    from zerofit.models.resolve import spec_from_config

    shape = dict(MOE_SHAPE, hidden_size=64, intermediate_size=128, moe_intermediate_size=32)
    shape.update(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8)
    config = AutoConfig.for_model("qwen3_moe", use_cache=False, **shape)
    model = _peft(AutoModelForCausalLM.from_config(config), 4, "all-linear", 0.0)
    peft_count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    spec = spec_from_config({**shape, "model_type": "qwen3_moe"}, "moe")
    assert lora.adapter_params(spec, 4, "all-linear") == peft_count
    assert lora.expert_adapter_tensor_sizes(spec, 4, "attention") == []


def _moe_setup(**changes) -> TrainSetup:
    """The HF stack's bf16 LoRA step on one GPU (no dropout: peft refuses it on fused
    experts), micro 1 x 512 tokens."""
    fields = dict(
        stage=0,
        stack="hf",
        precision="bf16",
        weights_dtype="bf16",
        micro_batch=1,
        seq_len=512,
        optimizer="adamw_torch_fused",
        finetuning="lora",
        lora_dropout=0.0,
    )
    return TrainSetup(**{**fields, **changes})


@pytest.mark.replay
def test_frozen_experts_save_no_inputs_as_the_replayed_run_does():
    """LoRA on the attention alone leaves an MoE layer's experts frozen: their gathered inputs
    and gated products are saved by nothing (transformers' grouped_mm experts), against the
    allocation replay of the real run within 1 % (it was 5-6 % over on Qwen3-30B-A3B and
    Mixtral). Twelve layers: with two, one layer's backward temporaries, which the estimate
    prices with the dense MLP's width, weigh as much as the saved tensors."""
    pytest.importorskip("peft")
    from zerofit.memory.allocation_trace import replay_training_run
    from zerofit.models.resolve import spec_from_config

    shape = {**MOE_SHAPE, "num_hidden_layers": 12, "model_type": "qwen3_moe"}
    spec = spec_from_config(shape, "moe")
    setup = _moe_setup(lora_targets="q_proj,v_proj", seq_len=2048)
    run = replay_training_run(spec, setup)
    est = estimate_memory(spec, setup)
    assert lora.frozen_experts_saving_per_token(spec, setup, 2) == 8 * 2 * (1024 + 512)
    assert est.peak_bytes == pytest.approx(run.max_allocated, rel=0.01)


def test_dropout_on_fused_experts_is_refused_as_peft_refuses_it():
    """peft's ParamWrapper raises on lora_dropout != 0: the estimate names the field and the
    fix in one line instead of pricing a run that cannot start."""
    from zerofit.models.resolve import spec_from_config

    spec = spec_from_config({**MOE_SHAPE, "model_type": "qwen3_moe"}, "moe")
    with pytest.raises(ZerofitError, match="lora_dropout: peft adapts moe's fused experts"):
        estimate_memory(spec, _moe_setup(lora_dropout=0.05))
    estimate_memory(spec, _moe_setup(lora_dropout=0.05, lora_targets="attention"))


@pytest.mark.replay
@pytest.mark.parametrize("checkpointing", [False, True])
def test_fused_experts_keep_their_folded_weight_as_the_replayed_run_does(checkpointing):
    """peft folds the adapters into each layer's whole expert weights on every forward and the
    grouped matmuls keep them: the estimate's peak against the allocation replay of the real
    transformers + peft run on fake tensors (memory/allocation_trace.py) at a shape where the
    folded weights (201 MB a layer) outweigh the activations. Checkpointing is over by the
    adapters' gradients of the first layer, which the estimate holds at the end of backward."""
    pytest.importorskip("peft")
    from zerofit.memory.allocation_trace import replay_training_run
    from zerofit.models.resolve import spec_from_config

    spec = spec_from_config({**MOE_SHAPE, "model_type": "qwen3_moe"}, "moe")
    setup = _moe_setup(gradient_checkpointing=checkpointing)
    run = replay_training_run(spec, setup)
    est = estimate_memory(spec, setup)
    error = est.peak_bytes / run.max_allocated - 1
    print(f"MoE LoRA ckpt={checkpointing}: replay {run.max_allocated:,} estimate "
          f"{est.peak_bytes:,} ({error:+.2%})")
    assert lora.fused_expert_weight_bytes(spec, setup, 2) == 3 * 64 * 512 * 1024 * 2
    if checkpointing:
        assert 0 <= error <= 0.05
    else:
        assert est.peak_bytes == pytest.approx(run.max_allocated, rel=0.01)
