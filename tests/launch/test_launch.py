"""zerofit.launch.commands / cluster_config / render and `zerofit launch`: exact commands per
dialect, the validation rules, and the rendered scripts executed by bash against recording
stand-ins for accelerate, torchrun, deepspeed, srun and scontrol (so quoting is proven, not
eyeballed). No training here:
tests/launch/test_multinode.py runs the scripts for real.

Run: .venv/bin/python -m pytest tests/launch/test_launch.py -q   (~3 s)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from zerofit.cli.main import main
from zerofit.errors import ZerofitError
from zerofit.launch.cluster_config import build_accelerate_env, build_spec, validate_cluster_configs
from zerofit.launch.commands import (
    LaunchSpec,
    build_accelerate_cmd,
    build_deepspeed_cmd,
    build_rank_env,
    build_torchrun_cmd,
    validate_spec,
)
from zerofit.launch.render import render_hostfile, render_launch_files

HOSTILE = "it's $(touch pwned); `id` \"x\""
DS_CFG = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "DEEPSPEED",
    "machine_rank": 0,
    "deepspeed_config": {
        "deepspeed_config_file": "ds_config.json",
        "deepspeed_multinode_launcher": "standard",
        "zero3_init_flag": False,
    },
    "main_process_ip": "10.0.0.1",
    "main_process_port": 29500,
    "num_machines": 2,
    "num_processes": 16,
}


def spec(**kw) -> LaunchSpec:
    base = dict(
        nodes=2,
        procs_per_node=8,
        main_addr="10.0.0.1",
        main_port=29500,
        script="train.py",
        script_args=("--lr", "1e-5"),
        config_files=("acc.yaml",),
        use_deepspeed=True,
    )
    return validate_spec(LaunchSpec(**{**base, **kw}))


# --- command lists -------------------------------------------------------------------------------
def test_accelerate_cmd_node1() -> None:
    assert build_accelerate_cmd(spec(), 1) == [
        "accelerate",
        "launch",
        "--config_file",
        "acc.yaml",
        "--num_machines",
        "2",
        "--machine_rank",
        "1",
        "--main_process_ip",
        "10.0.0.1",
        "--main_process_port",
        "29500",
        "--num_processes",
        "16",
        "--deepspeed_multinode_launcher",
        "standard",
        "--rdzv_backend",
        "static",
        "--rdzv_conf",
        "timeout=600",
        "train.py",
        "--lr",
        "1e-5",
    ]


def test_accelerate_cmd_c10d_uses_join_timeout_and_per_node_config() -> None:
    s = spec(rdzv_backend="c10d", timeout=120, config_files=("n0.yaml", "n1.yaml"))
    cmd = build_accelerate_cmd(s, 1)
    assert cmd[cmd.index("--config_file") + 1] == "n1.yaml"
    assert cmd[cmd.index("--rdzv_conf") + 1] == "join_timeout=120"


def test_torchrun_c10d_and_static() -> None:
    assert build_torchrun_cmd(spec(job_id="run7"), 1) == [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "8",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "10.0.0.1:29500",
        "--rdzv_id",
        "run7",
        "--rdzv_conf",
        "join_timeout=600",
        "train.py",
        "--lr",
        "1e-5",
    ]
    assert build_torchrun_cmd(spec(), 1, static=True)[:11] == [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "8",
        "--node_rank",
        "1",
        "--master_addr",
        "10.0.0.1",
        "--master_port",
        "29500",
    ]
    ipv6 = build_torchrun_cmd(spec(main_addr="fd00::1"), 0)
    assert ipv6[ipv6.index("--rdzv_endpoint") + 1] == "[fd00::1]:29500"


def test_rank_env_counts_ranks_across_nodes() -> None:
    env = build_rank_env(spec(nodes=3, procs_per_node=4), node_rank=1, local_rank=3)
    assert env == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "12",
        "NODE_RANK": "1",
        "RANK": "7",
        "LOCAL_RANK": "3",
        "LOCAL_WORLD_SIZE": "4",
    }


def test_accelerate_env_with_json_file_skips_what_accelerate_ignores() -> None:
    cfg = dict(DS_CFG, deepspeed_config=dict(DS_CFG["deepspeed_config"], zero_stage=2))
    assert build_accelerate_env(cfg) == {
        "ACCELERATE_USE_DEEPSPEED": "true",
        "ACCELERATE_DEEPSPEED_CONFIG_FILE": "ds_config.json",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT": "false",
    }
    inline = dict(
        DS_CFG,
        mixed_precision="bf16",
        deepspeed_config={"zero_stage": 3, "offload_param_device": "cpu"},
    )
    assert build_accelerate_env(inline) == {
        "ACCELERATE_USE_DEEPSPEED": "true",
        "ACCELERATE_MIXED_PRECISION": "bf16",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "cpu",
    }
    assert build_accelerate_env({"distributed_type": "MULTI_GPU"}) == {}


# --- validation ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, field",
    [
        ({"main_port": 0}, "main_port"),
        ({"main_port": 65536}, "main_port"),
        ({"nodes": 0}, "nodes"),
        ({"main_addr": "10.0.0.1; rm -rf /"}, "main_addr"),
        ({"main_addr": "-bad.host"}, "main_addr"),
        ({"style": "mpirun"}, "style"),
        ({"job_id": "a b"}, "job_id"),
        ({"script": ""}, "script"),
        ({"hostnames": ("a", "a")}, "hosts"),
        ({"hostnames": ("a",)}, "hosts"),
        ({"hostnames": ("a", "b c")}, "hosts"),
        ({"config_files": ("a", "b", "c")}, "config"),
        ({"log_dir": "my logs"}, "log_dir"),
        ({"style": "accelerate", "config_files": ()}, "config"),
    ],
)
def test_validate_spec_rejects(change: dict, field: str) -> None:
    with pytest.raises(ZerofitError) as err:
        spec(**change)
    assert err.value.field == field
    assert "\n" not in err.value.render()


def test_cluster_configs_must_agree_and_rank_from_zero() -> None:
    n0, n1 = dict(DS_CFG), dict(DS_CFG, machine_rank=1)
    assert validate_cluster_configs([n0, n1])["num_processes"] == 16
    with pytest.raises(ZerofitError, match="main_process_ip: differs"):
        validate_cluster_configs([n0, dict(n1, main_process_ip="10.0.0.2")])
    with pytest.raises(ZerofitError, match=r"ranks \[0, 0\] are not unique"):
        validate_cluster_configs([n0, dict(n1, machine_rank=0)])
    with pytest.raises(ZerofitError, match="rank order"):
        validate_cluster_configs([n1, n0])
    with pytest.raises(ZerofitError, match="not divisible"):
        validate_cluster_configs([dict(DS_CFG, num_processes=15)])


def test_build_spec_merges_config_and_flags() -> None:
    s, warns = build_spec([DS_CFG], ("acc.yaml",), script="train.py", main_port=30000)
    assert (s.nodes, s.procs_per_node, s.main_addr, s.main_port, s.style) == (
        2,
        8,
        "10.0.0.1",
        30000,
        "accelerate",
    )
    assert warns == ["main port: using 30000 from the command line, not 29500 from accelerate.yaml"]
    with pytest.raises(ZerofitError, match="gpus_per_node: 16 disagrees"):
        build_spec([DS_CFG], ("acc.yaml",), script="t.py", procs_per_node=16)
    pdsh = dict(
        DS_CFG,
        deepspeed_config={
            "deepspeed_config_file": "ds.json",
            "deepspeed_multinode_launcher": "pdsh",
        },
    )
    _, warns = build_spec([pdsh], ("acc.yaml",), script="t.py")
    assert "deepspeed_multinode_launcher: pdsh" in warns[0] and "standard" in warns[0]
    with pytest.raises(ZerofitError, match="mixed_precision next to deepspeed_config_file"):
        build_spec([dict(DS_CFG, mixed_precision="no")], ("acc.yaml",), script="t.py")
    _, warns = build_spec([dict(DS_CFG, main_process_ip="127.0.0.1")], ("acc.yaml",), script="t.py")
    assert warns == [
        "main address 127.0.0.1 is loopback: only a single machine can reach it (fine for a local "
        "test); pass --main-addr with node 0's address on the shared network"
    ]
    with pytest.raises(ZerofitError, match="main_addr: is needed for 2 nodes"):
        build_spec(style="torchrun", nodes=2, procs_per_node=1, script="t.py")


# --- rendered scripts, executed against recording stand-ins --------------------------------------
RECORDER = """#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
env = {{k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE",
       "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_DEEPSPEED", "SLURM_NODEID", "DS_ENV_FILE",
       "ZF_SETUP", "NCCL_SOCKET_IFNAME")}}
with open(os.path.join(os.environ["RECORD_DIR"], f"{{name}}-{{os.getpid()}}.json"), "w") as fh:
    json.dump({{"argv": sys.argv[1:], "env": env, "cwd": os.getcwd()}}, fh)
"""
FAKE_SRUN = """#!/usr/bin/env bash
# stand-in for srun: skip its options, run the command once per node with its SLURM_NODEID
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
for i in $(seq 0 $((SLURM_NNODES - 1))); do SLURM_NODEID=$i SLURMD_NODENAME=fake$i "$@" & done
status=0
for _ in $(seq 0 $((SLURM_NNODES - 1))); do wait -n || status=$?; done
exit $status
"""


@pytest.fixture
def fakebin(tmp_path: Path) -> tuple[dict, Path]:
    return make_fake_tools(tmp_path)


def make_fake_tools(tmp_path: Path) -> tuple[dict, Path]:
    """Recording stand-ins in tmp_path/bin: (an environment with them first on PATH, where each
    run leaves its argv, environment and working directory as JSON)."""
    bin_dir, rec = tmp_path / "bin", tmp_path / "rec"
    bin_dir.mkdir()
    rec.mkdir()
    for name in ("accelerate", "torchrun", "deepspeed", "fakepy"):
        (bin_dir / name).write_text(RECORDER.format(python=sys.executable))
    (bin_dir / "srun").write_text(FAKE_SRUN)
    # many lines, so `head -n1` closes the pipe early (SIGPIPE) as with a real large allocation
    (bin_dir / "scontrol").write_text(
        "#!/usr/bin/env bash\nfor i in $(seq 17 5000); do echo gpu-a$i; done\n"
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", RECORD_DIR=str(rec))
    return env, rec


def run_files(files: dict[str, str], name: str, tmp_path: Path, env: dict) -> None:
    script = tmp_path / name
    script.write_text(files[name])
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, check=True, timeout=30)


def records(rec: Path, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(rec.glob(f"{name}-*.json"))]


@pytest.mark.parametrize(
    "style, tool",
    [("accelerate", "accelerate"), ("torchrun", "torchrun"), ("torchrun-static", "torchrun")],
)
def test_node_scripts_pass_hostile_values_verbatim(style, tool, fakebin, tmp_path) -> None:
    env, rec = fakebin
    files = render_launch_files(
        spec(style=style, script="my dir/train.py", script_args=("--tag", HOSTILE))
    )
    assert sorted(files) == ["node0.sh", "node1.sh"]
    run_files(files, "node1.sh", tmp_path, env)
    (got,) = records(rec, tool)
    assert got["argv"][-3:] == ["my dir/train.py", "--tag", HOSTILE]
    assert not (tmp_path / "pwned").exists()
    if style == "accelerate":
        assert got["argv"][got["argv"].index("--machine_rank") + 1] == "1"
    if style == "torchrun":
        assert got["env"]["ACCELERATE_USE_DEEPSPEED"] is None  # spec built by hand: no config env
    assert "# export NCCL_SOCKET_IFNAME=eth0" in files["node1.sh"]


def test_env_style_starts_one_process_per_local_rank(fakebin, tmp_path) -> None:
    env, rec = fakebin
    s = spec(
        style="env",
        procs_per_node=3,
        python=str(tmp_path / "bin" / "fakepy"),
        script_args=(HOSTILE,),
        accelerate_env=(("ACCELERATE_USE_DEEPSPEED", "true"),),
    )
    run_files(render_launch_files(s), "node1.sh", tmp_path, env)
    got = records(rec, "fakepy")
    assert sorted((r["env"]["RANK"], r["env"]["LOCAL_RANK"]) for r in got) == [
        ("3", "0"),
        ("4", "1"),
        ("5", "2"),
    ]
    assert {r["env"]["WORLD_SIZE"] for r in got} == {"6"} and {
        r["env"]["NODE_RANK"] for r in got
    } == {"1"}
    assert all(
        r["argv"] == ["train.py", HOSTILE] and r["env"]["ACCELERATE_USE_DEEPSPEED"] == "true"
        for r in got
    )


def test_env_style_propagates_a_failed_rank(tmp_path) -> None:
    fail = tmp_path / "failpy"
    fail.write_text('#!/usr/bin/env bash\n[ "$LOCAL_RANK" = 1 ] && exit 7\nexec sleep 30\n')
    fail.chmod(0o755)
    script = tmp_path / "node0.sh"
    script.write_text(
        render_launch_files(spec(style="env", procs_per_node=2, python=str(fail)))["node0.sh"]
    )
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=20)
    assert res.returncode == 1
    assert "zerofit: node 0: a rank failed, stopped the rest" in res.stderr


def test_slurm_script_values_and_per_node_expansion(fakebin, tmp_path) -> None:
    env, rec = fakebin
    files = render_launch_files(
        spec(style="slurm", job_id="grpo7", script_args=("--tag", HOSTILE), doctor=False)
    )
    text = files["job.sbatch"]
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
    # the batch output lands in the working directory, which exists when the job starts
    assert sbatch == {
        "job-name": "grpo7",
        "nodes": "2",
        "ntasks-per-node": "1",
        "cpus-per-task": "64",
        "gres": "gpu:8",
        "time": "02:00:00",
        "output": "%x-%j.out",
        "open-mode": "append",
    }
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in text
    # srun no longer inherits --cpus-per-task from sbatch (22.05+)
    assert '--cpus-per-task="${SLURM_CPUS_PER_TASK:-64}"' in text
    assert "# <-- edit" in text
    run_files(
        files,
        "job.sbatch",
        tmp_path,
        dict(
            env,
            SLURM_NNODES="2",
            SLURM_JOB_NODELIST="gpu-a[17-18]",
            SLURM_JOB_ID="4242",
            SLURM_JOB_NAME="grpo7",
        ),
    )
    got = sorted(records(rec, "accelerate"), key=lambda r: r["env"]["SLURM_NODEID"])
    assert [r["argv"][r["argv"].index("--machine_rank") + 1] for r in got] == ["0", "1"]
    for r in got:
        argv = r["argv"]
        assert argv[argv.index("--main_process_ip") + 1] == "gpu-a17"
        assert argv[argv.index("--main_process_port") + 1] == "29500"
        assert argv[-3:] == ["train.py", "--tag", HOSTILE]
    assert (tmp_path / "logs").is_dir()


def test_slurm_refuses_a_mismatched_allocation(tmp_path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render_launch_files(spec(style="slurm"))["job.sbatch"])
    res = subprocess.run(
        ["bash", str(script)],
        env=dict(os.environ, SLURM_NNODES="3"),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert res.returncode == 2 and "allocation has 3 nodes, the config expects 2" in res.stderr


def test_deepspeed_hostfile_and_launch(fakebin, tmp_path) -> None:
    env, rec = fakebin
    s = spec(
        style="deepspeed",
        hostnames=("gpu-a17", "gpu-a18"),
        main_addr="gpu-a17",
        accelerate_env=(("ACCELERATE_USE_DEEPSPEED", "true"),),
    )
    files = render_launch_files(s)
    assert files["hostfile"] == "gpu-a17 slots=8\ngpu-a18 slots=8\n"
    assert files[".deepspeed_env"] == (
        "TORCH_NCCL_ASYNC_ERROR_HANDLING=1\nDEEPSPEED_TIMEOUT=10\n"
        "ACCELERATE_USE_DEEPSPEED=true\n"
    )
    run_files(files, "launch.sh", tmp_path, env)
    (got,) = records(rec, "deepspeed")
    assert got["argv"] == [
        "--hostfile",
        f"{tmp_path}/hostfile",
        "--num_nodes",
        "2",
        "--num_gpus",
        "8",
        "--master_addr",
        "gpu-a17",
        "--master_port",
        "29500",
        "--no_local_rank",
        "train.py",
        "--lr",
        "1e-5",
    ]
    assert got["env"]["DS_ENV_FILE"] == f"{tmp_path}/.deepspeed_env"
    assert render_hostfile(spec(style="deepspeed", nodes=2)).startswith(
        "node0 slots=8   # <-- edit"
    )


# --- the CLI ------------------------------------------------------------------------------------
def test_cli_writes_executable_scripts_and_refuses_overwrite(tmp_path, capsys) -> None:
    cfg = tmp_path / "accelerate.yaml"
    import yaml

    cfg.write_text(yaml.safe_dump(DS_CFG))
    out = tmp_path / "launch"
    argv = ["launch", "--config", str(cfg), "--out", str(out), "--", "train.py", "--lr", "1e-5"]
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["node0.sh", "node1.sh"]
    assert os.access(out / "node1.sh", os.X_OK)
    before = (out / "node0.sh").read_text()
    assert main(argv[:-3] + ["--main-port", "1234", "--", "t.py"]) == 2
    assert "already exist" in capsys.readouterr().err  # and nothing was half-written
    assert (out / "node0.sh").read_text() == before
    assert main(argv[:5] + ["--force", "--", "t.py"]) == 0
    assert "t.py" in (out / "node0.sh").read_text()


def test_cli_prints_without_out_and_reports_errors(tmp_path, capsys) -> None:
    two_nodes = ["launch", "--style", "torchrun", "--nodes", "2", "--gpus-per-node", "4"]
    assert main(two_nodes + ["--main-addr", "10.1.1.1", "--", "train.py"]) == 0
    printed = capsys.readouterr().out
    assert "# ===== node0.sh =====" in printed and "# ===== node1.sh =====" in printed
    assert "--rdzv_endpoint 10.1.1.1:29500" in printed
    assert main(two_nodes) == 2
    assert "script: no training script given" in capsys.readouterr().err
    bad_port = ["--main-addr", "10.1.1.1", "--main-port", "99999", "--", "t.py"]
    assert main(two_nodes + bad_port) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("zerofit: error: main_port: 99999 is out of range")
        and "Traceback" not in err
    )


# --- what reaches a remote host through DeepSpeed's pdsh runner ----------------------------------
PDSH_HOSTILE = [
    "arg $(touch {pwned})",
    "it's",
    "`touch {pwned}`",
    'say "hi" \\ $HOME',
    "a\tb",
    "--x=$(touch {pwned})",
    "",
    "*",
    "~",
    "plain",
]


def remote_words(user_args: list[str], tmp_path: Path) -> list[str]:
    """The words a remote shell sees: DeepSpeed's own PDSHRunner.parse_user_args, joined as pdsh
    joins them, evaluated by `sh -c` (what ssh runs on the other host)."""
    from types import SimpleNamespace

    from deepspeed.launcher.multinode_runner import PDSHRunner

    runner = PDSHRunner(SimpleNamespace(user_args=user_args, user_script="train.py"), "")
    line = "printf '%s\\n' " + " ".join(runner.user_arguments)
    out = subprocess.run(
        ["sh", "-c", line], capture_output=True, text=True, cwd=tmp_path, timeout=10
    )
    return out.stdout.split("\n")[:-1]


def test_pdsh_args_arrive_verbatim_and_run_nothing(tmp_path) -> None:
    pwned = tmp_path / "pwned"
    args = [a.format(pwned=pwned) for a in PDSH_HOSTILE]
    s = spec(
        style="deepspeed", hostnames=("a", "b"), script="my dir/train.py", script_args=tuple(args)
    )
    cmd = build_deepspeed_cmd(s)
    assert cmd[cmd.index("--no_local_rank") + 1] == "'my dir/train.py'"  # joined raw by DeepSpeed
    assert remote_words(cmd[cmd.index("--no_local_rank") + 2 :], tmp_path) == args
    assert not pwned.exists()
    # what DeepSpeed alone does with the same words: the remote shell runs the command substitution
    remote_words([args[0]], tmp_path)
    assert pwned.exists()


def test_deepspeed_env_holds_what_remote_ranks_need_and_refuses_what_it_cannot_carry(
    tmp_path,
) -> None:
    from types import SimpleNamespace

    from deepspeed.launcher.multinode_runner import PDSHRunner

    s = spec(
        style="deepspeed",
        hostnames=("a", "b"),
        extra_env=(("GLOO_SOCKET_IFNAME", "eth1"), ("NOTE", "two words, 100% ok")),
    )
    text = render_launch_files(s)[".deepspeed_env"]
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING=1\n" in text and "GLOO_SOCKET_IFNAME=eth1\n" in text
    runner = PDSHRunner(SimpleNamespace(user_args=[], user_script="t.py"), "")
    for line in text.splitlines():  # as deepspeed/launcher/runner.py main reads the file
        key, val = line.split("=", maxsplit=1)
        runner.add_export(key, val)
    exports = "".join(f"export {k}={v}; " for k, v in runner.exports.items())
    got = subprocess.run(
        ["sh", "-c", exports + 'printf "%s|%s" "$GLOO_SOCKET_IFNAME" "$NOTE"'],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout
    assert got == "eth1|two words, 100% ok"
    for bad in ("$(id)", "a`b`", 'x"y', "back\\slash", " padded"):
        with pytest.raises(ZerofitError, match=".deepspeed_env cannot carry"):
            spec(style="deepspeed", hostnames=("a", "b"), extra_env=(("X", bad),))


# --- the generated files work from any directory -------------------------------------------------
def test_generated_files_run_from_another_directory(fakebin, tmp_path, monkeypatch) -> None:
    env, rec = fakebin
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "cfg").mkdir(parents=True)
    elsewhere.mkdir()
    import yaml

    (project / "cfg" / "accelerate.yaml").write_text(yaml.safe_dump(DS_CFG))
    (project / "ds_config.json").write_text("{}")
    monkeypatch.chdir(project)
    for style in ("accelerate", "deepspeed"):
        assert (
            main(
                [
                    "launch",
                    "--config",
                    "cfg/accelerate.yaml",
                    "--style",
                    style,
                    "--hosts",
                    "h0,h1",
                    "--out",
                    style,
                    "--",
                    "train.py",
                    "--output-dir",
                    "run",
                ]
            )
            == 0
        )
    for script in ("accelerate/node1.sh", "deepspeed/launch.sh"):
        subprocess.run(
            ["bash", str(project / script)], env=env, cwd=elsewhere, check=True, timeout=30
        )
    (acc,), (ds,) = records(rec, "accelerate"), records(rec, "deepspeed")
    assert acc["cwd"] == ds["cwd"] == str(project)  # relative script, config and --output-dir hold
    assert acc["argv"][acc["argv"].index("--config_file") + 1] == "cfg/accelerate.yaml"
    assert ds["argv"][ds["argv"].index("--hostfile") + 1] == str(project / "deepspeed" / "hostfile")
    assert ds["env"]["DS_ENV_FILE"] == str(project / "deepspeed" / ".deepspeed_env")


# --- Slurm script traps --------------------------------------------------------------------------
def test_slurm_setup_hook_workdir_requeue_and_doctor(fakebin, tmp_path) -> None:
    env, rec = fakebin
    s = spec(
        style="slurm",
        workdir=str(tmp_path),
        setup="export ZF_SETUP=ran",
        requeue=True,
        signal_seconds=90,
        time_limit="45",
        cpus_per_node=12,
        doctor=False,
        script_args=("--output-dir", "run"),
    )
    text = render_launch_files(s)["job.sbatch"]
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=?(\S*)", text, re.M))
    assert (
        sbatch["chdir"] == str(tmp_path)
        and sbatch["time"] == "45"
        and sbatch["cpus-per-task"] == "12"
    )
    assert sbatch["requeue"] == "" and sbatch["signal"] == "B:USR1@90"
    assert "mkdir -p logs && sbatch" not in text  # the hint matches the paths the script uses
    assert text.index("export ZF_SETUP=ran") < text.index("srun")
    base = dict(
        env,
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="n[1-2]",
        SLURM_JOB_ID="7",
        SLURM_JOB_NAME="zerofit",
    )
    run_files({"job.sbatch": text}, "job.sbatch", tmp_path, base)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "latest").write_text(
        "checkpoint-4"
    )  # a checkpoint exists: the next start resumes
    run_files({"job.sbatch": text}, "job.sbatch", tmp_path, dict(base, SLURM_RESTART_COUNT="1"))
    got = records(rec, "accelerate")
    fresh = [r for r in got if "--resume-from" not in r["argv"]]
    resumed = [r for r in got if r["argv"][-2:] == ["--resume-from", "latest"]]
    assert len(fresh) == len(resumed) == 2
    assert all(r["env"]["ZF_SETUP"] == "ran" for r in got)
    doctor = render_launch_files(dataclasses.replace(s, doctor=True, config_files=("acc.yaml",)))[
        "job.sbatch"
    ]
    assert (
        '"${SRUN[@]}" python -m zerofit doctor --allocation "logs/doctor-$SLURM_JOB_ID"'
        ' --main-addr "$MAIN_ADDR" --main-port "$MAIN_PORT"'
    ) in doctor


def test_slurm_names_the_node_whose_task_failed(tmp_path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        FAKE_SRUN.replace(
            "#!/usr/bin/env bash",
            "#!/usr/bin/env bash\nexec >>" f"{tmp_path}/logs/zerofit-9-node1.log 2>&1",
        )
    )
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\necho n1\n")
    (bin_dir / "accelerate").write_text(
        '#!/usr/bin/env bash\n[ "$SLURM_NODEID" = 1 ] && exit 3\nexit 0\n'
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(render_launch_files(spec(style="slurm", doctor=False))["job.sbatch"])
    res = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
        env=dict(
            os.environ,
            PATH=f"{bin_dir}:{os.environ['PATH']}",
            SLURM_NNODES="2",
            SLURM_JOB_NODELIST="n[1-2]",
            SLURM_JOB_ID="9",
            SLURM_JOB_NAME="zerofit",
        ),
    )
    assert res.returncode == 3
    assert (
        "zerofit: node fake1 (rank 1) failed: its training command exited with status 3"
        in res.stderr
    )


def test_cli_slurm_flags_and_bad_values(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    base = ["launch", "--style", "slurm", "--nodes", "2", "--gpus-per-node", "4"]
    assert (
        main(
            base
            + ["--time", "1-00:00:00", "--env", "NCCL_DEBUG=INFO", "--ifname", "ib0", "--", "t.py"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "#SBATCH --time=1-00:00:00" in out and "export NCCL_DEBUG=INFO" in out
    assert "export GLOO_SOCKET_IFNAME=ib0" in out and f"#SBATCH --chdir={tmp_path}" in out
    for flags, field in (
        (["--time", "tomorrow"], "time"),
        (["--env", "NOEQUALS"], "env"),
        (["--env", "1X=2"], "env"),
        (["--setup", "a\nb"], "setup"),
    ):
        assert main(base + flags + ["--", "t.py"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"zerofit: error: {field}:") and len(err.strip().splitlines()) == 1


def test_launch_and_doctor_accept_the_config_commands_names_for_the_main_node(capsys) -> None:
    """`zerofit config` says --main-process-ip/-port (accelerate's names); launch and doctor say
    --main-addr/--main-port. Either spelling works in both."""
    from zerofit.cli.main import build_parser

    argv = ["launch", "--style", "torchrun", "--nodes", "2", "--gpus-per-node", "1"]
    names = ["--main-process-ip", "10.1.1.1", "--main-process-port", "1234"]
    assert main(argv + names + ["--", "t.py"]) == 0
    assert "--rdzv_endpoint 10.1.1.1:1234" in capsys.readouterr().out
    doctor = build_parser().parse_args(["doctor", *names])
    assert (doctor.main_addr, doctor.main_port) == ("10.1.1.1", 1234)


def test_a_preset_without_num_processes_takes_the_count_from_the_flag(capsys) -> None:
    """The shipped presets leave num_processes to the command line (any node size): `zerofit
    launch` takes it from --gpus-per-node and asks for it when missing."""
    from conftest import REPO

    preset = str(REPO / "deepspeed_configs" / "accelerate" / "zero2.yaml")
    assert main(["launch", "--config", preset, "--gpus-per-node", "4", "--", "t.py"]) == 0
    out = capsys.readouterr().out
    assert "--num_processes 4 \\" in out and "--num_machines 1 \\" in out
    assert main(["launch", "--config", preset, "--", "t.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "zerofit: error: gpus_per_node: accelerate.yaml leaves num_processes to the command line"
    )
