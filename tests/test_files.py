"""write_files: atomic, refuses to overwrite without force, writes nothing when any target exists.

.venv/bin/python -m pytest tests/test_files.py -q
"""

from __future__ import annotations

import os
from unittest import mock

import pytest

from zerofit.errors import ZerofitError
from zerofit.files import refuse_existing, write_files


def test_creates_directory_and_writes_all(tmp_path):
    out = tmp_path / "a" / "b"
    paths = write_files(out, {"x.json": "{}\n", "sub/y.yaml": "k: v\n"})
    assert [p.name for p in paths] == ["x.json", "y.yaml"]
    assert (out / "x.json").read_text() == "{}\n" and (
        out / "sub" / "y.yaml"
    ).read_text() == "k: v\n"
    assert oct((out / "x.json").stat().st_mode & 0o777) == "0o644"
    assert sorted(os.listdir(out)) == ["sub", "x.json"]  # no temp files left behind


def test_refuses_existing_without_force_and_writes_nothing(tmp_path):
    (tmp_path / "b.yaml").write_text("old")
    with pytest.raises(ZerofitError) as err:
        write_files(tmp_path, {"a.json": "new", "b.yaml": "new"})
    assert err.value.field == "--out" and "--force" in err.value.fix
    assert not (tmp_path / "a.json").exists() and (tmp_path / "b.yaml").read_text() == "old"


def test_force_overwrites(tmp_path):
    (tmp_path / "a.json").write_text("old")
    write_files(tmp_path, {"a.json": "new"}, force=True)
    assert (tmp_path / "a.json").read_text() == "new"


def test_failure_midway_leaves_directory_untouched(tmp_path):
    (tmp_path / "a.json").write_text("old")
    real = os.replace
    calls = []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    with mock.patch("zerofit.files.os.replace", side_effect=flaky), pytest.raises(OSError):
        write_files(tmp_path, {"a.json": "new", "b.json": "new"}, force=True)
    assert (tmp_path / "a.json").read_text() == "old" and not (tmp_path / "b.json").exists()
    assert sorted(os.listdir(tmp_path)) == ["a.json"]


@pytest.mark.parametrize("name", ["../evil", "/abs/path", ""])
def test_rejects_names_outside_the_directory(tmp_path, name):
    with pytest.raises(ZerofitError):
        write_files(tmp_path, {name: "x"})


def test_refuse_existing_names_the_callers_flag_and_alternative(tmp_path):
    """Every writer (config --out, doctor --facts-out, --save-default) words its refusals with its
    own flag and where else to write: a directory always, an existing file without force."""
    (tmp_path / "facts.json").write_text("{}")
    with pytest.raises(ZerofitError) as err:
        refuse_existing([tmp_path / "facts.json"], False, "facts-out", "choose another file")
    assert (err.value.field, err.value.fix) == (
        "facts-out",
        "pass --force to overwrite, or choose another file",
    )
    refuse_existing([tmp_path / "facts.json"], True, "facts-out", "choose another file")
    with pytest.raises(ZerofitError, match="is a directory") as err:
        refuse_existing([tmp_path], True, "facts-out", "choose another file")
    assert err.value.fix == "remove it or choose another file"


def test_a_name_taken_while_writing_is_refused_with_the_callers_flag(tmp_path):
    """The race check (a file created between the check and the write) names the caller's flag,
    not --out, and leaves the other writer's file alone."""
    target = tmp_path / "facts.json"
    real_link = os.link

    def someone_else_first(src, dst):
        target.write_text("theirs")
        return real_link(src, dst)

    with mock.patch("zerofit.files.os.link", someone_else_first):
        with pytest.raises(ZerofitError) as err:
            write_files(tmp_path, {"facts.json": "ours"}, False, "facts-out", "choose another file")
    assert err.value.field == "facts-out" and "created by someone else" in err.value.problem
    assert target.read_text() == "theirs"
    assert sorted(os.listdir(tmp_path)) == ["facts.json"]  # no temp file left


def test_out_is_a_file(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ZerofitError, match="not a directory"):
        write_files(tmp_path / "f", {"a": "b"})


def test_concurrent_writers_never_overwrite_each_other(tmp_path):
    """Many processes write the same names at once without --force: exactly one wins, the rest
    fail with the one-line error, and the files on disk are all the winner's."""
    import subprocess
    import sys

    code = (
        "import sys; from zerofit.files import write_files; from zerofit.errors import "
        "ZerofitError\ntry:\n    write_files(sys.argv[1], {'a.json': sys.argv[2], "
        "'b.yaml': sys.argv[2]})\n    print('wrote')\nexcept ZerofitError as e:\n"
        "    print('refused')\n"
    )
    for attempt in range(5):
        out = tmp_path / f"run{attempt}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(out), f"writer{i}"],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(6)
        ]
        results = [p.communicate(timeout=60)[0].strip() for p in procs]
        winners = [i for i, r in enumerate(results) if r == "wrote"]
        assert len(winners) == 1, results
        assert set(results) <= {"wrote", "refused"}
        texts = {(out / "a.json").read_text(), (out / "b.yaml").read_text()}
        assert texts == {f"writer{winners[0]}"}
        assert sorted(os.listdir(out)) == ["a.json", "b.yaml"]
