"""recipes/dpo.py without training: the sigmoid DPO loss, rewards and margins against
hand-computed numbers, sequence log-probs, the concatenated batch and data-format errors.

Run: .venv/bin/python -m pytest tests/recipes/test_dpo.py -q   (~10 s)
"""

from __future__ import annotations

import math

import pytest
import torch
from recipe_runs import load_recipe

dpo = load_recipe("dpo")


def test_sigmoid_loss_rewards_and_margin_by_hand():
    # pair 0: policy moved towards chosen: (-1 - -2) - (-5 - -4) = 2 -> beta x 2 = 0.2
    # pair 1: policy moved the wrong way: (-3 - -2) - (-1 - -1) = -1 -> beta x -1 = -0.1
    policy_chosen, policy_rejected = torch.tensor([-1.0, -3.0]), torch.tensor([-5.0, -1.0])
    ref_chosen, ref_rejected = torch.tensor([-2.0, -2.0]), torch.tensor([-4.0, -1.0])
    loss, chosen, rejected = dpo.dpo_loss(
        policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta=0.1
    )
    # -log sigmoid(z) = log(1 + exp(-z))
    by_hand = (math.log1p(math.exp(-0.2)) + math.log1p(math.exp(0.1))) / 2
    assert loss.item() == pytest.approx(by_hand)
    assert chosen.tolist() == pytest.approx([0.1, -0.1])
    assert rejected.tolist() == pytest.approx([-0.1, 0.0])
    margins = (chosen - rejected).tolist()
    assert margins == pytest.approx([0.2, -0.1])
    assert (chosen > rejected).tolist() == [True, False]  # reward accuracy 1/2


def test_policy_equal_to_reference_gives_log_2():
    x = torch.tensor([-3.0, -7.0])
    loss, chosen, rejected = dpo.dpo_loss(x, x + 1, x, x + 1, beta=0.5)
    assert loss.item() == pytest.approx(math.log(2)) and chosen.abs().sum() == 0


def test_gradient_raises_chosen_and_lowers_rejected():
    chosen = torch.tensor([-2.0], requires_grad=True)
    rejected = torch.tensor([-2.0], requires_grad=True)
    ref = torch.tensor([-2.0])
    loss, _, _ = dpo.dpo_loss(chosen, rejected, ref, ref, beta=0.1)
    loss.backward()
    assert chosen.grad.item() == pytest.approx(-0.05)  # d/dz softplus(-z) at 0, times beta
    assert rejected.grad.item() == pytest.approx(0.05)


def test_concatenated_batch_and_sequence_logprobs():
    tok = dpo.common.build_tiny_tokenizer()
    args = dpo.parse_args([])
    pair = dpo.tokenize_pair(tok, {"prompt": "3+4=", "chosen": "7", "rejected": "3+4"}, args)
    batch = dpo.collate_pairs([pair], tok.pad_token_id, "cpu")
    assert tok.decode(batch["input_ids"][0]) == "3+4=7<eos><pad><pad>"  # chosen first ...
    assert tok.decode(batch["input_ids"][1]) == "3+4=3+4<eos>"  # ... then rejected
    assert batch["answer_mask"].tolist() == [[0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1]]
    model = dpo.common.build_tiny_model(tok, seed=1)
    with torch.no_grad():
        got = dpo.sequence_logprobs(model, batch)
        logits = model(input_ids=batch["input_ids"][:1, :6]).logits
    answer = logits[0, 3].log_softmax(-1)[pair["chosen"][0]]  # position 3 predicts "7"
    by_hand = answer + logits[0, 4].log_softmax(-1)[tok.eos_token_id]
    assert got[0].item() == pytest.approx(by_hand.item(), abs=1e-5)  # padding adds nothing


def test_bad_rows_name_the_field(capsys):
    dpo.parse_args([])
    with pytest.raises(SystemExit):
        dpo.common.check_rows(
            [{"prompt": "a", "chosen": "b"}], ("prompt", "chosen", "rejected"), "p.jsonl"
        )
    err = capsys.readouterr().err.strip()
    assert err.startswith("dpo.py: rejected: p.jsonl row 1 has no `rejected`")


def test_beta_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        dpo.parse_args(["--beta", "0"])
    assert capsys.readouterr().err.startswith("dpo.py: beta: 0.0 must be > 0")
