"""zerofit.launch.render: the templates ship with the package, render strictly, and no value given
to `zerofit launch` runs as a command in any of the six styles (payloads in every argument, env
value, path and host; the scripts run by bash against the recording stand-ins of test_launch.py).

Run: .venv/bin/python -m pytest tests/launch/test_render.py -q   (~15 s: one wheel build)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO
from test_launch import make_fake_tools, records

from zerofit.errors import ZerofitError
from zerofit.launch.commands import STYLES, LaunchSpec, validate_spec
from zerofit.launch.render import render_launch_files, render_template, template_environment

TEMPLATES = sorted(
    p.name for p in (REPO / "src" / "zerofit" / "launch" / "templates").glob("*.j2")
)
# Each piece would run `touch pwned` if the shell evaluated it once more than it should.
PAYLOAD = "it's \"q\" $(touch pwned) `touch pwned`; touch pwned #"


def test_templates_are_found_through_importlib_resources() -> None:
    from importlib.resources import files

    shipped = files("zerofit.launch").joinpath("templates")
    assert sorted(p.name for p in shipped.iterdir() if p.name.endswith(".j2")) == TEMPLATES
    assert {"node.sh.j2", "job.sbatch.j2", "deepspeed_launch.sh.j2"} <= set(TEMPLATES)


def test_wheel_ships_the_templates(tmp_path: Path) -> None:
    """pyproject's package-data puts the templates in the wheel (built from a copy of the tree,
    so the checkout's build/ and egg-info stay untouched)."""
    src = tmp_path / "src"
    shutil.copytree(
        REPO / "src" / "zerofit",
        src / "zerofit",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    code = "import setuptools.build_meta as b, sys; print(b.build_wheel(sys.argv[1]))"
    built = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "dist")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.split()[-1]
    names = zipfile.ZipFile(tmp_path / "dist" / built).namelist()
    assert sorted(n.rsplit("/", 1)[1] for n in names if n.endswith(".j2")) == TEMPLATES
    metadata = next(n for n in names if n.endswith("METADATA"))
    requires = zipfile.ZipFile(tmp_path / "dist" / built).read(metadata).decode()
    assert "Requires-Dist: jinja2" in requires  # render.py imports it: declared, not borrowed


def test_a_missing_template_value_fails_instead_of_rendering_empty() -> None:
    import jinja2

    spec = validate_spec(
        LaunchSpec(
            nodes=1, procs_per_node=1, main_addr="::1", main_port=1, script="t.py", style="env"
        )
    )
    with pytest.raises(jinja2.UndefinedError, match="rank"):
        render_template("node.sh.j2", spec, command=["torchrun", "t.py"])
    assert template_environment().autoescape is False  # HTML escaping would corrupt `&&`, `<`


def hostile_spec(style: str, tmp_path: Path, workdir: Path) -> LaunchSpec:
    """A spec with the payload in every value a style lets through validation."""
    python = tmp_path / "py dir $(touch pwned)" / "fakepy"
    python.parent.mkdir(exist_ok=True)
    shutil.copy(tmp_path / "bin" / "fakepy", python)
    pdsh = style == "deepspeed"  # DeepSpeed's runner cannot carry $ ` " \ (refused, tested below)
    env_value = "two words; touch pwned #" if pdsh else PAYLOAD
    return validate_spec(
        LaunchSpec(
            nodes=2,
            procs_per_node=2,
            main_addr="127.0.0.1",
            main_port=29500,
            style=style,
            script=f"my dir/{PAYLOAD}.py",
            script_args=(PAYLOAD, "--output-dir", f"ckpt {PAYLOAD}\ntouch pwned", "--x=" + PAYLOAD),
            config_files=(f"cfg {PAYLOAD}.yaml",),
            accelerate_env=(("ACCELERATE_NOTE", env_value),),
            extra_env=(("NOTE", env_value),),
            python=str(python),
            workdir=str(workdir),
            hostnames=("h0", "h1") if pdsh else (),
            requeue=style == "slurm",
            resume_args=("--resume-from", PAYLOAD),
            doctor=style == "slurm",  # its `python -m zerofit doctor` step runs the stand-in
        )
    )


SLURM_ENV = {
    "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_ID": "7",
    "SLURM_JOB_NAME": "zerofit",
}
ENTRY = {"slurm": "job.sbatch", "deepspeed": "launch.sh"}
TOOL = {"accelerate": "accelerate", "slurm": "accelerate", "env": "fakepy"}  # else its style


@pytest.mark.parametrize("style", STYLES)
def test_no_value_runs_as_a_command_in_any_style(style, tmp_path) -> None:
    env, rec = make_fake_tools(tmp_path)
    safe = "work_dir" if style == "deepspeed" else "work dir $(touch pwned)"
    workdir = tmp_path / safe
    spec = hostile_spec(style, tmp_path, workdir)
    out_dir = tmp_path / ("ds" if style == "deepspeed" else "out")
    out_dir.mkdir()
    for name, text in render_launch_files(spec).items():
        (out_dir / name).write_text(text)
    entry = out_dir / ENTRY.get(style, "node1.sh")
    assert subprocess.run(["bash", "-n", str(entry)]).returncode == 0
    env = dict(env, **SLURM_ENV)

    # the working directory does not exist yet: the message names it, runs nothing
    failed = subprocess.run(
        ["bash", str(entry)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert failed.returncode == 2
    assert f"zerofit: cannot cd to {workdir} (it must exist" in failed.stderr

    workdir.mkdir()
    checkpoint = workdir / f"ckpt {PAYLOAD}\ntouch pwned"
    checkpoint.mkdir()
    (checkpoint / "latest").write_text("step-1")  # slurm: the start resumes, and says so
    ran = subprocess.run(
        ["bash", str(entry)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert ran.returncode == 0, ran.stderr
    assert not (tmp_path / "pwned").exists() and not (workdir / "pwned").exists()
    got = records(rec, TOOL.get(style, style.split("-")[0]))
    assert got and all(r["cwd"] == str(workdir) for r in got)
    resumed = list(spec.resume_args) if style == "slurm" else []
    if style != "deepspeed":  # its argv is pre-quoted for pdsh's second shell (test_launch.py)
        for r in got:
            assert r["argv"][-5 - len(resumed) :] == [spec.script, *spec.script_args, *resumed]
    if style == "slurm":
        assert f"resuming (--resume-from {PAYLOAD})" in ran.stdout
        (doctor,) = {tuple(r["argv"]) for r in records(rec, "fakepy")}
        assert doctor[doctor.index("--config") + 1] == spec.config_files[0]


@pytest.mark.parametrize("host", [PAYLOAD, "h1;touch pwned", "$(id)", "-oProxyCommand=x"])
def test_hostile_host_is_refused(host) -> None:
    with pytest.raises(ZerofitError) as err:
        validate_spec(
            LaunchSpec(
                nodes=2,
                procs_per_node=1,
                main_addr="h0",
                main_port=29500,
                script="t.py",
                style="deepspeed",
                hostnames=("h0", host),
            )
        )
    assert err.value.field == "hosts"
    with pytest.raises(ZerofitError, match="main_addr"):
        validate_spec(
            LaunchSpec(nodes=2, procs_per_node=1, main_addr=host, main_port=1, script="t.py")
        )


@pytest.mark.parametrize("style", STYLES)
def test_headers_count_in_words(style) -> None:
    """'1 process', '1 node', '8 processes': never '(es)' or '1 processes'."""
    import re

    def headers(nodes: int, procs: int) -> str:
        spec = LaunchSpec(
            nodes=nodes,
            procs_per_node=procs,
            main_addr="127.0.0.1",
            main_port=29500,
            script="t.py",
            style=style,
            config_files=("acc.yaml",) if style == "accelerate" else (),
        )
        return "".join(render_launch_files(spec).values())

    one = headers(1, 1)
    assert "(es)" not in one and not re.search(r"\b1 (processes|nodes|GPUs)\b", one)
    assert re.search(r"\b8 (processes|GPUs)\b", headers(2, 8))
    with pytest.raises(ZerofitError, match="1 host for 2 nodes"):
        validate_spec(
            LaunchSpec(
                nodes=2,
                procs_per_node=1,
                main_addr="h0",
                main_port=1,
                script="t.py",
                style="deepspeed",
                hostnames=("h0",),
            )
        )
