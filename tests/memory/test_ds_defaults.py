"""DeepSpeed's ZeRO defaults come from DeepSpeedZeroConfig itself, cached per DeepSpeed version.

.venv/bin/python -m pytest tests/memory/test_ds_defaults.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zerofit.errors import ZerofitError
from zerofit.memory import ds_defaults
from zerofit.memory.ds_defaults import (
    ZERO_BUCKET_FIELDS,
    deepspeed_default_buckets,
    ds_bucket_sizes,
    import_deepspeed,
)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty zerofit cache and no in-process copy of the defaults."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ds_defaults._deepspeed_default_buckets.cache_clear()
    yield tmp_path / "zerofit" / "deepspeed_defaults.json"
    ds_defaults._deepspeed_default_buckets.cache_clear()


def test_defaults_are_deepspeedzeroconfig_s_own(fresh_cache):
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    parsed = DeepSpeedZeroConfig()
    got = deepspeed_default_buckets()
    assert got == {key: getattr(parsed, attr) for key, attr in ZERO_BUCKET_FIELDS.items()}
    # the JSON spelling of each key is a field name or alias DeepSpeed itself accepts
    fields = DeepSpeedZeroConfig.model_fields
    for key, attr in ZERO_BUCKET_FIELDS.items():
        assert key in fields or fields[attr].alias == key
    assert ds_defaults.DEEPSPEED_DEFAULT_BUCKETS == got


def test_a_stale_cache_entry_is_read_again_from_deepspeed(fresh_cache):
    import deepspeed

    key = f"deepspeed {deepspeed.__version__}"
    fresh_cache.parent.mkdir(parents=True)
    fresh_cache.write_text(json.dumps({key: {"reduce_bucket_size": "five"}}))
    got = deepspeed_default_buckets()
    assert got["reduce_bucket_size"] == 500_000_000
    assert json.loads(fresh_cache.read_text())[key] == got


def test_a_warm_cache_plans_without_importing_deepspeed(fresh_cache):
    """Planning stays arithmetic: once cached, the defaults cost no DeepSpeed (or torch) import."""
    deepspeed_default_buckets()
    code = (
        "import sys; from zerofit.memory.ds_defaults import ds_bucket_sizes;"
        "print(ds_bucket_sizes(4096, 2)['reduce_bucket_size'],"
        " [m for m in ('deepspeed', 'torch') if m in sys.modules])"
    )
    env = {"XDG_CACHE_HOME": str(fresh_cache.parents[1]), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.split() == ["500000000", "[]"]


def test_bucket_sizes_zerofit_writes():
    defaults = deepspeed_default_buckets()
    assert ds_bucket_sizes(4096, 2) == {
        "reduce_bucket_size": defaults["reduce_bucket_size"],
        "allgather_bucket_size": defaults["allgather_bucket_size"],
    }
    stage3 = ds_bucket_sizes(4096, 3)
    assert stage3["reduce_bucket_size"] == 4096**2
    assert stage3["stage3_max_live_parameters"] == defaults["stage3_max_live_parameters"]
    assert ds_bucket_sizes(4096, 0) == {}


def test_a_broken_deepspeed_is_one_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # what a failed import leaves behind
    with pytest.raises(ZerofitError) as raised:
        import_deepspeed("deepspeed.runtime.zero.config")
    assert raised.value.field == "deepspeed" and "cannot be imported" in raised.value.problem
    assert "pip install" in raised.value.fix
