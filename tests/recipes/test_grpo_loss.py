"""GRPO maths of recipes/grpo.py against hand-computed numbers: advantages, clipping, KL,
normalisation.

Run: .venv/bin/python -m pytest tests/recipes/test_grpo_loss.py -q   (~5 s)
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "grpo.py"


def load_recipe():
    spec = importlib.util.spec_from_file_location("grpo_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["grpo_recipe"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


grpo = load_recipe()


def k3(r: float) -> float:
    """KL estimator exp(ref - logp) - (ref - logp) - 1 with ref = 0 and logp = log r."""
    return 1 / r + math.log(r) - 1


def test_group_advantages_scaled_by_group_std():
    # group 1: rewards 1, 0 -> mean 0.5, unbiased std sqrt(0.5); group 2: equal rewards -> no signal
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0]), num_generations=2)
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert adv.tolist() == pytest.approx([a, -a, 0.0, 0.0], abs=1e-6)


def test_group_advantages_unscaled_and_larger_groups():
    adv = grpo.group_advantages(
        torch.tensor([1.0, 2.0, 3.0, 6.0, 0.0, 0.0]), num_generations=3, scale=False
    )
    assert adv.tolist() == pytest.approx([-1.0, 0.0, 1.0, 4.0, -2.0, -2.0])


# Two completions of two tokens. old_logp = 0, so ratio = exp(logp).
#   seq 0, advantage +1: ratios 1.5 (clipped to 1.2: -1.2) and 0.5 (the low clip does not bind
#   for A > 0: -0.5)
#   seq 1, advantage -1: ratio 0.7 (clipped to 0.8: +0.8); its second token is padding (mask 0)
RATIOS = torch.tensor([[1.5, 0.5], [0.7, 1.1]])
MASK = torch.tensor([[1, 1], [1, 0]])
ADV = torch.tensor([1.0, -1.0])


def loss_of(loss_type: str, beta: float = 0.0, **kw):
    logp = RATIOS.log().requires_grad_(True)
    objective = grpo.Objective(eps_low=0.2, eps_high=0.2, beta=beta, loss_type=loss_type)
    loss, stats = grpo.grpo_loss(logp, torch.zeros(2, 2), ADV, MASK, objective=objective, **kw)
    loss.backward()
    return loss.item(), stats, logp.grad


def test_grpo_loss_per_sequence_with_clipping():
    loss, stats, grad = loss_of(loss_type="grpo")
    assert loss == pytest.approx(((-1.2 - 0.5) / 2 + 0.8 / 1) / 2)  # -0.025
    assert stats["clip_frac"] == pytest.approx(2 / 3)  # 2 of 3 real tokens clipped
    assert stats["kl"] == 0.0
    # clipped tokens and padding get no gradient; d(-r*A)/dlogp = -r*A, / 2 tokens / 2 sequences
    assert grad.flatten().tolist() == pytest.approx([0.0, -0.5 / 4, 0.0, 0.0])


def test_dapo_loss_per_token():
    loss, _, _ = loss_of(loss_type="dapo")
    assert loss == pytest.approx((-1.2 - 0.5 + 0.8) / 3)  # -0.3
    # normaliser given by the caller (the whole rollout)
    loss, _, _ = loss_of(loss_type="dapo", num_tokens=6)
    assert loss == pytest.approx(-0.9 / 6)


def test_kl_term_against_reference():
    loss, stats, grad = loss_of(loss_type="grpo", ref_logp=torch.zeros(2, 2), beta=0.1)
    expected = ((-1.2 + 0.1 * k3(1.5) - 0.5 + 0.1 * k3(0.5)) / 2 + (0.8 + 0.1 * k3(0.7))) / 2
    assert loss == pytest.approx(expected, abs=1e-6)  # about -0.01193 (float32)
    assert stats["kl"] == pytest.approx((k3(1.5) + k3(0.5) + k3(0.7)) / 3)
    # d k3 / d logp = 1 - 1/r: the KL pulls even clipped tokens back towards the reference
    assert grad[0, 0].item() == pytest.approx(0.1 * (1 - 1 / 1.5) / 4)


def test_ratio_one_gives_minus_mean_advantage():
    # num_iterations == 1: old_logp = logp.detach(), so ratio = 1 and loss = -mean(A)
    # (0 for normalised advantages)
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    loss, stats = grpo.grpo_loss(logp, logp.clone(), torch.tensor([2.0, -1.0]), torch.ones(2, 2))
    assert loss.item() == pytest.approx(-0.5) and stats["clip_frac"] == 0.0


def test_asymmetric_clip_bounds_by_name():
    """DAPO's clip-higher: eps_high 0.3 lets ratio 1.25 through for A > 0, eps_low 0.2 still
    clips ratio 0.7 for A < 0. The settings are keywords only: no positional bound to swap."""
    logp = torch.tensor([[1.25, 0.7]]).log()
    objective = grpo.Objective(eps_low=0.2, eps_high=0.3)
    _, stats = grpo.grpo_loss(
        logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), objective=objective
    )
    assert stats["clip_frac"] == 0.0  # 1.25 < 1.3, and 0.7 is not clipped for A > 0
    _, stats = grpo.grpo_loss(
        logp, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2), objective=objective
    )
    assert stats["clip_frac"] == 0.5  # A < 0: 0.7 < 1 - 0.2 is clipped, 1.25 is not
    with pytest.raises(TypeError):
        grpo.grpo_loss(logp, torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), None, 0.0, 0.2)
    args = grpo.parse_args(["--epsilon", "0.2", "--epsilon-high", "0.28", "--beta", "0.04"])
    assert grpo.Objective.from_args(args) == grpo.Objective(0.2, 0.28, 0.04, "grpo")


def test_unknown_loss_type_raises():
    with pytest.raises(ValueError, match="grpo or dapo"):
        grpo.grpo_loss(
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.ones(1),
            torch.ones(1, 1),
            objective=grpo.Objective(loss_type="bnpo"),
        )


def test_token_logprobs_matches_log_softmax():
    tok = grpo.common.build_tiny_tokenizer()
    model = grpo.common.build_tiny_model(tok, seed=1)
    ids = torch.tensor([[0, 5, 13, 6, 15, 7, 1], [3, 5, 13, 6, 15, 8, 1]])
    attn = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    got = grpo.token_logprobs(model, ids, attn, completion_len=2, temperature=1.0)
    with torch.no_grad():
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    want = logits.log_softmax(-1)[:, -3:-1].gather(2, ids[:, -2:, None]).squeeze(-1)
    assert got.shape == (2, 2)
    assert torch.allclose(got, want, atol=1e-5)


def test_completion_mask_includes_first_eos_only():
    comp = torch.tensor([[5, 1, 0, 0], [5, 6, 7, 8], [1, 0, 0, 0]])
    assert grpo.completion_mask(comp, eos_id=1).tolist() == [
        [1, 1, 0, 0],
        [1, 1, 1, 1],
        [1, 0, 0, 0],
    ]


def test_token_logprobs_builds_the_completions_logits_only():
    """The LM head runs over the last completion_len + 1 positions (logits_to_keep), not the
    prompt's: what memory/losses.py scored_tokens and speed/generation.py scored_logit_positions
    count for this recipe."""
    tok = grpo.common.build_tiny_tokenizer()
    model = grpo.common.build_tiny_model(tok, seed=1)
    rows = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: rows.append(args[0].shape[1])
    )
    ids = torch.tensor([[0, 5, 13, 6, 15, 7, 1]])
    grpo.token_logprobs(model, ids, torch.ones_like(ids), completion_len=2, temperature=1.0)
    hook.remove()
    assert rows == [3]
