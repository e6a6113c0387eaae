"""check: every problem at once with path + fix; verdicts from the installed libraries; fuzz.

.venv/bin/python -m pytest tests/configs/test_check.py -q
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerofit.cli.main import main
from zerofit.configs.check import check_accelerate, check_deepspeed, check_files
from zerofit.errors import ZerofitError

GOOD_DS = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}
GOOD_YAML = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "DEEPSPEED",
    "num_machines": 1,
    "num_processes": 8,
    "machine_rank": 0,
    "deepspeed_config": {"deepspeed_config_file": "ds.json"},
}


def paths(problems):
    return sorted(p.path for p in problems)


# ---------------------------------------------------------------- behaviour
def test_clean_pair_has_no_problems():
    texts = {"ds.json": json.dumps(GOOD_DS), "acc.yaml": yaml.safe_dump(GOOD_YAML)}
    assert check_files(texts, exists=lambda p: True) == []


def test_reports_every_problem_at_once_with_fixes():
    ds = {
        "train_batch_size": 10,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": "1.0",
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": 2,
            "overlap_com": True,
            "offload_param": {"device": "cpu"},
            "offload_optimizer": {"device": "nvme"},
        },
    }
    acc = dict(
        GOOD_YAML,
        num_processes=6,
        num_machines=4,
        mixed_precision="bf16",
        main_process_ip="10.0.0.1",
        main_process_port=29500,
        num_procs=2,
    )
    problems = check_files(
        {"ds.json": json.dumps(ds), "acc.yaml": yaml.safe_dump(acc)},
        gpu_bf16=False,
        exists=lambda p: False,
    )
    by_path = {p.path: p for p in problems}
    assert by_path["ds.json:zero_optimization.overlap_com"].fix == "did you mean 'overlap_comm'?"
    assert "needs ZeRO stage 3" in by_path["ds.json:zero_optimization.offload_param"].message
    assert "nvme_path" in by_path["ds.json:zero_optimization.offload_optimizer.nvme_path"].fix
    assert "is not a number" in by_path["ds.json:gradient_clipping"].message
    assert "no bf16" in by_path["ds.json:bf16.enabled"].message
    assert "did you mean 'num_processes'?" == by_path["acc.yaml:num_procs"].fix
    assert "TOTAL" in by_path["acc.yaml:num_processes"].fix
    assert "refuses mixed_precision" in by_path["acc.yaml:mixed_precision"].message
    assert "does not exist" in by_path["acc.yaml:deepspeed_config.deepspeed_config_file"].message
    assert "pdsh" in by_path["acc.yaml:deepspeed_config.deepspeed_multinode_launcher"].message
    for p in problems:
        assert re.match(r"^\S+: .+ \(fix: .+\)$", p.render())


def test_batch_arithmetic_uses_world_from_yaml():
    ds = dict(GOOD_DS, train_batch_size=12)  # 2 x 1 x 8 = 16
    problems = check_files({"ds.json": json.dumps(ds), "acc.yaml": yaml.safe_dump(GOOD_YAML)})
    assert [p.fix for p in problems] == ["set train_batch_size to 16"]
    alone = check_deepspeed(dict(GOOD_DS, train_batch_size=15))  # not a multiple of 2 x 1
    assert paths(alone) == ["ds_config.json:train_batch_size"]


def test_auto_warns_unless_trainer_and_errors_where_nobody_fills_it():
    ds = dict(GOOD_DS, train_batch_size="auto", zero_optimization={"stage": "auto"})
    warn = check_deepspeed(ds)
    assert {p.path: p.severity for p in warn} == {
        "ds_config.json:train_batch_size": "warning",
        "ds_config.json:zero_optimization.stage": "error",
    }
    errors = [p for p in check_deepspeed(ds, trainer=True) if p.severity == "error"]
    assert (
        paths(errors) == ["ds_config.json:zero_optimization.stage"]
        and "stage 0" in errors[0].message
    )


def test_zero3_init_flag_with_stage2_and_single_gpu_per_node_warning():
    acc = dict(
        GOOD_YAML, deepspeed_config={"deepspeed_config_file": "ds.json", "zero3_init_flag": True}
    )
    problems = check_files({"ds.json": json.dumps(GOOD_DS), "acc.yaml": yaml.safe_dump(acc)})
    assert [p.severity for p in problems] == ["warning"] and "zero3_init_flag" in problems[0].path
    multi = check_accelerate(
        dict(
            GOOD_YAML,
            num_machines=2,
            num_processes=2,
            main_process_ip="h",
            main_process_port=1,
            deepspeed_config={
                "deepspeed_config_file": "d.json",
                "deepspeed_multinode_launcher": "standard",
            },
        )
    )
    assert [p.severity for p in multi] == ["warning"]


def test_unreadable_files_are_problems_not_exceptions():
    got = check_files({"a.json": "{not json", "b.yaml": "- just a list", "c.json": "[]"})
    assert [p.severity for p in got] == ["unreadable"] * 3


# ---------------------------------------------------------------- fuzz
# Real keys of both files (and a few that are neither), for the fuzzers to draw from.
DS_KEYS = [
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "steps_per_print",
    "zero_optimization",
    "bf16",
    "fp16",
    "amp",
    "optimizer",
    "scheduler",
    "activation_checkpointing",
    "aio",
    "zero_allow_untested_optimizer",
    "communication_data_type",
]
ZERO_KEYS = [
    "stage",
    "overlap_comm",
    "contiguous_gradients",
    "reduce_bucket_size",
    "stage3_prefetch_bucket_size",
    "offload_param",
    "offload_optimizer",
    "sub_group_size",
    "cpu_offload",
    "mics_shard_size",
]
ACCELERATE_KEYS = [
    "compute_environment",
    "distributed_type",
    "mixed_precision",
    "num_processes",
    "num_machines",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "deepspeed_config",
    "fsdp_config",
    "gpu_ids",
    "use_cpu",
]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-10, 10**10)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(["auto", "cpu", "nvme", "none", "DEEPSPEED", "FSDP"]),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(
        st.sampled_from(
            DS_KEYS
            + ZERO_KEYS
            + ACCELERATE_KEYS
            + ["device", "nvme_path", "enabled", "deepspeed_config_file", "x"]
        ),
        children,
        max_size=5,
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(DS_KEYS + ACCELERATE_KEYS + ["junk"]),
        json_values,
        max_size=8,
    ),
    st.booleans(),
    st.sampled_from([None, True, False]),
)
def test_fuzz_dicts_never_raise(cfg, trainer, bf16):
    texts = {"f.json": json.dumps(cfg), "f.yaml": yaml.safe_dump(cfg)}
    for result in (
        check_files(texts, gpu_bf16=bf16, trainer=trainer, exists=lambda p: False),
        check_deepspeed(cfg),
        check_accelerate(cfg),
    ):
        assert isinstance(result, list)
        assert all(p.render() for p in result)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.sampled_from(["x.json", "x.yaml", "x.yml", "x.txt"]))
def test_fuzz_text_never_raises(text, name):
    assert isinstance(check_files({name: text}), list)


def _run_cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse --help
            code = exc.code or 0
    return code, out.getvalue() + err.getvalue()


FLAG_POOL = [
    "--stage",
    "0",
    "1",
    "3",
    "7",
    "--offload-optimizer",
    "cpu",
    "nvme",
    "--offload-param",
    "--gpu",
    "V100",
    "H100",
    "nope",
    "--precision",
    "bf16",
    "fp16",
    "--micro-batch",
    "-2",
    "4",
    "--nodes",
    "2",
    "--gpus-per-node",
    "x",
    "--flavour",
    "auto",
    "--json",
    "--force",
    "--defaults",
    "--trainer",
    "--nvme-path",
    "/nvme",
    "--global-batch",
    "--seq-len",
    "--answers",
    "missing.yaml",
    "--bogus",
    "--",
    "--model",
    "qwen2.5-72b",
    "/no/such/dir",
    "--workload",
    "grpo",
    "dpo",
    "--num-generations",
    "3",
    "--gradient-checkpointing",
    "--no-gradient-checkpointing",
    "--headroom",
    "1.5",
    "0.5",
]


# Each example plans a whole run (~0.1-0.3 s): 50 draws still meet every flag of the pool a few
# times under every command, and a failing draw is kept in hypothesis' example database.
@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.sampled_from(["config", "check", "estimate", "plan"]),
    st.lists(st.sampled_from(FLAG_POOL), max_size=8),
    st.booleans(),
)
def test_fuzz_cli_flags_exit_cleanly(tmp_path_factory, command, flags, with_file):
    d = tmp_path_factory.mktemp("cli")
    argv = [command]
    if command == "config":
        argv += ["--out", str(d / "out")]
    elif with_file:
        (d / "a.json").write_text(json.dumps(GOOD_DS))
        argv.append(str(d / "a.json"))
    code, text = _run_cli(argv + flags)
    assert code in (0, 1, 2), (argv + flags, code, text)
    assert "Traceback" not in text


# ------------------------------------------------------------- judged by the libraries themselves
def _yaml(**fields) -> str:
    return yaml.safe_dump(
        dict(
            {
                "compute_environment": "LOCAL_MACHINE",
                "distributed_type": "DEEPSPEED",
                "num_processes": 2,
            },
            **fields,
        )
    )


def test_accelerate_yaml_values_accelerate_would_crash_on():
    bad = _yaml(
        deepspeed_config={
            "zero_stage": 9,
            "offload_optimizer_device": "gpu",
            "zero3_init_flag": "maybe",
        }
    )
    got = {p.path: p for p in check_files({"a.yaml": bad})}
    assert set(got) == {
        "a.yaml:deepspeed_config.zero_stage",
        "a.yaml:deepspeed_config.offload_optimizer_device",
        "a.yaml:deepspeed_config.zero3_init_flag",
    }
    assert all(p.severity == "error" for p in got.values())
    fine = _yaml(
        deepspeed_config={
            "zero_stage": 3,
            "offload_optimizer_device": "cpu",
            "zero3_init_flag": "true",
        }
    )
    assert check_files({"a.yaml": fine}) == []


def test_fsdp_key_typos_are_found_with_the_right_spelling():
    cfg = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "num_processes": 2,
        "fsdp_config": {
            "fsdp_sharding_strategy": "FULL_SHARD",
            "fsdp_auto_wrap_polcy": "TRANSFORMER_BASED_WRAP",
            "state_dict_type": "SHARDED_STATE_DICT",
        },
    }  # un-prefixed keys are valid (fsdp_ added)
    got = check_files({"f.yaml": yaml.safe_dump(cfg)})
    assert [(p.path, p.fix) for p in got if p.severity == "error"] == [
        ("f.yaml:fsdp_config.fsdp_auto_wrap_polcy", "did you mean 'fsdp_auto_wrap_policy'?")
    ]


def test_removed_deprecated_and_unknown_deepspeed_keys():
    ds = dict(
        GOOD_DS,
        amp={"enabled": True},
        zero_optimization={
            "stage": 2,
            "mics_shard_size": 8,
            "cpu_offload": True,
            "overlap_com": True,
            "offload_optimizer": {"device": "gpu", "pin_mem": True},
        },
    )
    got = {p.path: p for p in check_deepspeed(ds, "d.json")}
    assert "Apex AMP" in got["d.json:amp"].message and got["d.json:amp"].fix == "remove it"
    assert "MiCS" in got["d.json:zero_optimization.mics_shard_size"].message
    assert (
        got["d.json:zero_optimization.cpu_offload"].severity == "warning"
    )  # deprecated alias, still read
    assert got["d.json:zero_optimization.overlap_com"].fix == "did you mean 'overlap_comm'?"
    assert (
        got["d.json:zero_optimization.offload_optimizer.pin_mem"].fix
        == "did you mean 'pin_memory'?"
    )
    assert "'gpu'" in got["d.json:zero_optimization.offload_optimizer.device"].message


def test_duplicate_json_keys_are_an_error():
    text = '{"train_batch_size": 8, "zero_optimization": {"stage": 2, "stage": 3}}'
    [problem] = check_files({"d.json": text})
    assert (
        problem.path == "d.json:stage"
        and "twice" in problem.message
        and problem.severity == "error"
    )


def test_valid_forms_deepspeed_accepts_pass():
    legacy = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "zero_optimization": True,
    }
    floats = dict(
        GOOD_DS,
        zero_optimization={"stage": 2, "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8},
    )
    zeropp = dict(
        GOOD_DS,
        zero_optimization={
            "stage": 3,
            "zero_hpz_partition_size": 8,
            "zero_quantized_weights": True,
            "zero_quantized_gradients": True,
        },
    )
    for ds in (legacy, floats, zeropp):
        assert check_deepspeed(ds) == [], ds


def test_whole_config_is_run_through_deepspeedconfig():
    ds = dict(GOOD_DS, bf16={"enabled": True}, fp16={"enabled": True})
    got = check_deepspeed(
        ds
    )  # our own rule names it; DeepSpeed's whole-config run is skipped after errors
    assert [p.path for p in got] == ["ds_config.json:fp16.enabled"]
    odd = dict(
        GOOD_DS, train_micro_batch_size_per_gpu=0, train_batch_size=0
    )  # DeepSpeed asserts micro > 0
    [problem] = check_deepspeed(odd)
    assert problem.message.startswith("DeepSpeed rejects it") and problem.path == "ds_config.json"


def test_auto_rules_per_client():
    ds = dict(
        GOOD_DS,
        train_batch_size="auto",
        optimizer={"type": "AdamW", "params": {"lr": "auto", "betas": "auto"}},
    )
    # under the Trainer the explicit values left in GOOD_DS must match its arguments: one
    # warning naming them
    [explicit] = check_deepspeed(ds, client="trainer")
    assert explicit.severity == "warning" and "--per_device_train_batch_size 2" in explicit.message
    assert paths(check_deepspeed(ds, client="accelerate")) == [
        "ds_config.json:optimizer.params.betas"
    ]
    assert paths(check_deepspeed(ds, client="deepspeed")) == [
        "ds_config.json:optimizer.params.betas",
        "ds_config.json:optimizer.params.lr",
        "ds_config.json:train_batch_size",
    ]
    [merged] = check_deepspeed(ds)
    assert merged.severity == "warning" and "3 values" in merged.message


def test_multinode_launcher_and_hostfile():
    base = dict(
        num_machines=2,
        num_processes=4,
        main_process_ip="10.0.0.1",
        main_process_port=29500,
        machine_rank=0,
    )

    def run(ds, exists=lambda p: True):
        return {
            p.path: p
            for p in check_files({"a.yaml": _yaml(deepspeed_config=ds, **base)}, exists=exists)
        }

    # pdsh with an existing hostfile: valid, one warning that says what it really needs
    got = run(
        {
            "deepspeed_config_file": "d.json",
            "deepspeed_multinode_launcher": "pdsh",
            "deepspeed_hostfile": "/job/hostfile",
        }
    )
    [warn] = got.values()
    assert (
        warn.severity == "warning"
        and "machine 0 only" in warn.message
        and "alone" not in warn.message
    )
    # a named hostfile that does not exist
    got = run(
        {"deepspeed_config_file": "d.json", "deepspeed_hostfile": "/no/hostfile"},
        exists=lambda p: p != "/no/hostfile",
    )
    assert got["a.yaml:deepspeed_config.deepspeed_hostfile"].severity == "error"
    # no hostfile at all: DeepSpeed's runner starts local ranks only
    got = run({"deepspeed_config_file": "d.json"})
    assert (
        "this machine only" in got["a.yaml:deepspeed_config.deepspeed_multinode_launcher"].message
    )
    assert (
        run({"deepspeed_config_file": "d.json", "deepspeed_multinode_launcher": "standard"}) == {}
    )
    bad = run({"deepspeed_config_file": "d.json", "deepspeed_multinode_launcher": "ssh"})
    assert "pdsh, standard" in bad["a.yaml:deepspeed_config.deepspeed_multinode_launcher"].fix


def test_engine_names_what_judged():
    import accelerate
    import deepspeed

    from zerofit.configs.check import engine

    assert engine() == f"DeepSpeed {deepspeed.__version__} + accelerate {accelerate.__version__}"


# ---------------------------------------------------------------- the verdicts are the libraries'
def test_wrong_typed_deepspeed_field_is_named_as_deepspeed_names_it():
    """DeepSpeedZeroConfig judges the value: its own field alias and pydantic message come back."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from pydantic import ValidationError

    zero = {"stage": 3, "stage3_prefetch_bucket_size": "big", "overlap_comm": True}
    with pytest.raises(ValidationError) as raised:
        DeepSpeedZeroConfig(**zero)
    [error] = raised.value.errors()
    [problem] = check_deepspeed(dict(GOOD_DS, zero_optimization=zero), "d.json")
    assert problem.path == "d.json:zero_optimization." + ".".join(map(str, error["loc"]))
    assert problem.path == "d.json:zero_optimization.stage3_prefetch_bucket_size"
    assert error["msg"] in problem.message and "DeepSpeed's check" in problem.message


def test_top_level_keys_are_the_ones_deepspeedconfig_reads():
    """Keys DeepSpeed reads but no hand table listed pass; one it never reads is a warning."""
    from zerofit.configs.check.deepspeed_file import top_level_reads

    reads = top_level_reads()
    assert {"gradient_allreduce_op", "sequence_parallel_size", "optimizer", "aio"} <= set(reads)
    assert reads["gradient_clipping"] == 1.0  # the default DeepSpeed falls back to
    ds = dict(GOOD_DS, gradient_allreduce_op="sum", sequence_parallel_size=1)
    assert check_deepspeed(ds) == []
    [typo] = check_deepspeed(dict(GOOD_DS, gradient_clip=1.0))
    assert typo.severity == "warning" and typo.fix == "did you mean 'gradient_clipping'?"
    [wrong] = check_deepspeed(dict(GOOD_DS, wall_clock_breakdown="yes"))
    assert wrong.message == "'yes' is not true or false"  # DeepSpeed's default is a bool


def test_accelerate_enums_and_launchers_come_from_accelerate():
    from accelerate.utils import DistributedType, PrecisionType
    from accelerate.utils.constants import DEEPSPEED_MULTINODE_LAUNCHERS

    bad = dict(GOOD_YAML, distributed_type="DEEP_SPEED", mixed_precision="fp12")
    got = {p.path: p for p in check_accelerate(bad, "a.yaml")}
    assert got["a.yaml:distributed_type"].fix == "use one of " + ", ".join(
        d.value for d in DistributedType
    )
    assert got["a.yaml:mixed_precision"].fix == "use one of " + ", ".join(
        p.value for p in PrecisionType
    )
    # counts are typed by ClusterConfig's annotations (num_processes: int)
    [count] = check_accelerate(dict(GOOD_YAML, num_processes="eight"), "a.yaml")
    assert (count.path, count.message) == ("a.yaml:num_processes", "'eight' is not a whole number")
    for launcher in DEEPSPEED_MULTINODE_LAUNCHERS:
        ds = {"deepspeed_config_file": "d.json", "deepspeed_multinode_launcher": launcher}
        assert "not a DeepSpeed multi-node launcher" not in str(
            check_accelerate(dict(GOOD_YAML, deepspeed_config=ds))
        )


@pytest.mark.parametrize("library", ["deepspeed", "accelerate"])
def test_a_broken_install_is_one_clear_error(library, monkeypatch, tmp_path, capsys):
    """No second validator: a library that cannot be imported stops check with one line."""
    import sys

    good = tmp_path / "ds.json"
    good.write_text(json.dumps(GOOD_DS))
    acc = tmp_path / "a.yaml"
    acc.write_text(yaml.safe_dump(dict(GOOD_YAML, deepspeed_config={})))
    monkeypatch.setitem(sys.modules, library, None)  # what a failed import leaves behind
    with pytest.raises(ZerofitError) as raised:
        check_files({"ds.json": json.dumps(GOOD_DS), "a.yaml": yaml.safe_dump(GOOD_YAML)})
    assert raised.value.field == library and "cannot be imported" in raised.value.problem
    assert main(["check", str(good), str(acc)]) == 2
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert out.strip().splitlines() == ["zerofit: error: " + raised.value.render()]


# ---------------------------------------------------------------- reported bugs
@pytest.mark.parametrize("target", ["other.yaml", "a.yaml"])
def test_deepspeed_config_file_naming_a_yaml_is_an_error(target):
    """accelerate json.loads the file a YAML names, whatever its name: a YAML there fails."""
    other = yaml.safe_dump(dict(GOOD_YAML, num_processes=4))
    acc = yaml.safe_dump(dict(GOOD_YAML, deepspeed_config={"deepspeed_config_file": target}))
    got = check_files({"a.yaml": acc, "other.yaml": other}, exists=lambda p: True)
    [problem] = [p for p in got if p.path == "a.yaml:deepspeed_config.deepspeed_config_file"]
    assert problem.severity == "error" and "json.load" in problem.message
    assert target in problem.message and "DeepSpeed JSON" in problem.fix
    assert ("itself" in problem.message) == (target == "a.yaml")


def test_deepspeed_config_file_with_a_yaml_name_is_checked_as_deepspeed_json():
    ds = dict(GOOD_DS, zero_optimization={"stage": 2, "overlap_com": True})
    acc = yaml.safe_dump(dict(GOOD_YAML, deepspeed_config={"deepspeed_config_file": "ds.yaml"}))
    got = check_files({"a.yaml": acc, "ds.yaml": json.dumps(ds)}, exists=lambda p: True)
    assert paths(got) == ["ds.yaml:zero_optimization.overlap_com"]


def test_cli_reads_a_referenced_yaml_and_refuses_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.yaml").write_text("zero_optimization:\n  stage: 2\n")
    (tmp_path / "a.yaml").write_text(
        yaml.safe_dump(dict(GOOD_YAML, deepspeed_config={"deepspeed_config_file": "ds.yaml"}))
    )
    assert main(["check", "a.yaml"]) == 1
    assert "a.yaml:deepspeed_config.deepspeed_config_file: ds.yaml is not a DeepSpeed JSON" in (
        capsys.readouterr().out
    )


def test_fsdp_is_a_notice_that_zerofit_does_not_model_it():
    fsdp = dict(GOOD_YAML, distributed_type="FSDP", fsdp_config={"fsdp_sharding_strategy": 1})
    fsdp.pop("deepspeed_config")
    [notice] = check_files({"f.yaml": yaml.safe_dump(fsdp)})
    assert notice.path == "f.yaml:distributed_type" and notice.severity == "warning"
    assert "FSDP" in notice.message and "zerofit estimate" in notice.message


def test_a_duplicate_key_does_not_hide_the_other_problems():
    text = (
        '{"train_batch_size": 8, "train_batch_size": 8, "zero_optimization": '
        '{"stage": 2, "offload_param": {"device": "cpu"}, "overlap_com": true}}'
    )
    got = {p.path: p for p in check_files({"d.json": text})}
    assert "twice" in got["d.json:train_batch_size"].message
    assert "needs ZeRO stage 3" in got["d.json:zero_optimization.offload_param"].message
    assert got["d.json:zero_optimization.overlap_com"].fix == "did you mean 'overlap_comm'?"


@pytest.mark.parametrize("name", ["deep.yaml", "deep.json"])
def test_deeply_nested_files_are_one_line(name, tmp_path, capsys):
    deep = tmp_path / name
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 if name.endswith("yaml") else "[" * 5000)
    assert main(["check", str(deep)]) == 1
    out = capsys.readouterr().out
    assert out.strip().splitlines()[0].startswith(f"{deep}: is not valid ")
    assert "Traceback" not in out and "RecursionError" not in out


def test_answers_file_is_recognised_by_its_keys_and_read_as_answers():
    from zerofit.configs.check import answers_files

    answers = "model: qwen2.5-0.5b\ngpu: A100-80GB\nflavor: explicit\nmain_process_port: 29500\n"
    # a misspelt answer (the flag's spelling) is still an answers file
    typo = "model: qwen2.5-0.5b\ngpu: H100-SXM\ngpus-per-node: 4\n"
    texts = {
        "answers.yaml": answers,
        "mine.yml": typo,
        "acc.yaml": yaml.safe_dump(GOOD_YAML),
        "ds.json": json.dumps(GOOD_DS),
    }
    assert answers_files(texts) == ["answers.yaml", "mine.yml"]
    problems = check_files(texts)
    assert [p.render() for p in problems] == [
        "mine.yml:gpus-per-node: is not a known answer (fix: did you mean gpus_per_node?)"
    ]
    # an accelerate key that is no answer makes it accelerate's, answers' keys reported there
    mixed = yaml.safe_dump({**GOOD_YAML, "gpu": "A100-80GB"})
    assert answers_files({"acc.yaml": mixed}) == []
    trl = "model_name_or_path: Qwen/Qwen2.5-0.5B\ngradient_checkpointing: true\nbf16: true\n"
    assert answers_files({"trl.yaml": trl}) == []  # one shared key does not make it answers
    assert "acc.yaml:gpu" in paths(check_files({"acc.yaml": mixed, "ds.json": json.dumps(GOOD_DS)}))
