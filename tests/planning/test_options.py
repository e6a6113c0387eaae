"""The planner's options: the full grid (DeepSpeed's rules on where offload may go) and what the
user's overrides leave of it.

Run: .venv/bin/python -m pytest tests/planning/test_options.py -q   (~1 s)
"""

from __future__ import annotations

import pytest

from zerofit.errors import ZerofitError
from zerofit.planning.answers import Answers
from zerofit.planning.options import TrainingOption, all_options, allowed_options


def test_the_grid_offloads_only_where_deepspeed_can():
    """16 options: stage 0 has nothing to offload (no ZeRO optimizer), the optimizer moves to
    the CPU from stage 1, parameters only under stage 3 (DeepSpeed ignores offload_param below
    it); each with and without checkpointing."""
    grid = all_options()
    assert len(grid) == len(set(grid)) == 16
    assert all(o.offload_optimizer == "none" for o in grid if o.stage == 0)
    assert all(o.offload_param == "none" for o in grid if o.stage < 3)
    assert TrainingOption(3, "cpu", "cpu", True) in grid
    assert [o.offloaded for o in grid].count(True) == 8  # stage 1, 2: one offload; 3: two
    # no overrides: every option is allowed
    assert allowed_options(Answers()) == grid


def test_overrides_narrow_the_grid():
    stage3 = allowed_options(Answers(stage=3, gradient_checkpointing=True))
    assert stage3 == (
        TrainingOption(3, "none", "none", True),
        TrainingOption(3, "cpu", "none", True),
        TrainingOption(3, "cpu", "cpu", True),
    )
    # parameters offloaded: DeepSpeed offloads the optimizer with them unless told otherwise
    params = allowed_options(Answers(offload_param="cpu"))
    assert {o.stage for o in params} == {3}
    assert all((o.offload_optimizer, o.offload_param) == ("cpu", "cpu") for o in params)
    kept_on_gpu = allowed_options(Answers(offload_param="cpu", offload_optimizer="none"))
    assert {(o.offload_optimizer, o.offload_param) for o in kept_on_gpu} == {("none", "cpu")}
    # an optimizer offload rules out stage 0
    assert {o.stage for o in allowed_options(Answers(offload_optimizer="cpu"))} == {1, 2, 3}


def test_an_offload_the_stage_cannot_run_names_the_fix():
    with pytest.raises(ZerofitError, match="offload_param.*stage 3"):
        allowed_options(Answers(stage=2, offload_param="cpu"))


def test_zero_plus_is_searched_at_stage_3_across_nodes_only():
    """One node: the 16 options of today, none with ZeRO++. Two nodes: each stage-3 option with
    the parameters on the GPU comes also with hpZ and with hpZ/qwZ/qgZ (8 more); offloaded
    parameters never (hpZ's secondary shard would live on the host)."""
    assert all(o.zero_plus == "none" for o in all_options())
    assert allowed_options(Answers(gpus_per_node=8)) == all_options()
    two_nodes = allowed_options(Answers(gpus_per_node=8, num_nodes=2))
    assert two_nodes == all_options(num_nodes=2) and len(two_nodes) == 24
    with_plus = [o for o in two_nodes if o.zero_plus != "none"]
    assert len(with_plus) == 8
    assert {(o.stage, o.offload_param) for o in with_plus} == {(3, "none")}
    assert {o.zero_plus for o in with_plus} == {"hpz", "hpz+qwz+qgz"}
    assert TrainingOption(3, "cpu", "none", True, "hpz+qwz+qgz").zero_plus_label == (
        " + hpZ/qwZ/qgZ"
    )
    assert TrainingOption(3).zero_plus_label == ""
    # the user's overrides narrow it the same way
    stage3 = allowed_options(Answers(gpus_per_node=8, num_nodes=2, stage=3, offload_param="cpu"))
    assert {o.zero_plus for o in stage3} == {"none"}
