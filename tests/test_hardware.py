"""GPU catalog entries, names, close-name hints, and the host RAM read from /proc/meminfo.

Run: .venv/bin/python -m pytest tests/test_hardware.py -q   (<1 s)
"""

from __future__ import annotations

import pytest

from zerofit.errors import ZerofitError
from zerofit.hardware import (
    CATALOG,
    COMPUTE_CAPABILITY,
    GpuSpec,
    compute_capability,
    detect_host_ram_gib,
    lookup,
    match_gpu_name,
)


@pytest.mark.parametrize(
    "key, gib, bf16",
    [
        ("A800", 79.15, True),
        ("H800", 79.11, True),
        ("H20", 95.6, True),
        ("A40", 44.4, True),
        ("L20", 44.4, True),
        ("MI250X", 64.0, True),
        ("MI300X", 191.5, True),
        ("V100-32GB", 31.75, False),
    ],
)
def test_catalog_entries(key, gib, bf16):
    assert (lookup(key).memory_gib, lookup(key).bf16) == (gib, bf16)


@pytest.mark.parametrize(
    "product, key",
    [
        ("NVIDIA H20", "H20"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A800-SXM4-80GB", "A800"),
        ("NVIDIA H800", "H800"),
        ("AMD Instinct MI300X", "MI300X"),
        ("NVIDIA L20", "L20"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA L40S", "L40S"),
    ],
)
def test_detection_names(product, key):
    assert match_gpu_name(product) == key


def test_unknown_gpu_lists_close_names():
    with pytest.raises(ZerofitError, match="did you mean.*H100"):
        lookup("H10")
    assert len(CATALOG) >= 23


def test_host_ram_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       65790164 kB\nMemFree:        1000 kB\n")
    assert detect_host_ram_gib(str(meminfo)) == pytest.approx(65790164 / 1024**2)
    assert detect_host_ram_gib(str(tmp_path / "missing")) is None
    assert detect_host_ram_gib() is None or detect_host_ram_gib() > 0


def test_every_gpu_has_the_speed_models_datasheet_figures():
    """speed/step_time.py divides by these: every catalog entry has them, and they are ordered
    as the datasheets are (HBM3 over HBM2e over GDDR, NVLink over PCIe)."""
    for spec in CATALOG.values():
        assert spec.bf16_tflops > 0 and spec.hbm_gbps > 0 and spec.link_gbps > 0, spec.key
        if spec.interconnect == "pcie":
            assert spec.link_gbps <= 64, spec.key
    assert CATALOG["H100-SXM"].hbm_gbps > CATALOG["A100-80GB"].hbm_gbps > CATALOG["A10"].hbm_gbps
    assert CATALOG["H100-SXM"].link_gbps > CATALOG["H100-PCIE"].link_gbps
    assert CATALOG["A800"].link_gbps < CATALOG["A100-80GB"].link_gbps  # the export NVLink cap


def test_a_spec_without_the_speed_fields_still_constructs():
    spec = GpuSpec("X", "Some GPU", 10.0, True, False, "pcie", 100)
    assert (spec.hbm_gbps, spec.link_gbps) == (0.0, 0.0)


def test_the_cards_public_runs_train_on_are_all_in_the_catalog():
    """The cards public step-time measurements name, each with the speed model's figures."""
    for name in (
        "V100-16GB", "V100-32GB", "T4", "TITAN RTX", "RTX 2080 Ti", "3090", "4090", "A10",
        "A40", "L40S", "A100-40GB", "A100-80GB", "H100", "H200", "B200",
    ):  # fmt: skip
        spec = lookup(name)
        assert spec.bf16_tflops > 0 and spec.hbm_gbps > 0 and spec.link_gbps > 0, name
    assert not lookup("TITAN RTX").bf16 and not lookup("RTX 2080 Ti").bf16  # Turing: fp16 only
    assert match_gpu_name("NVIDIA TITAN RTX") == "TITAN-RTX"
    assert match_gpu_name("NVIDIA GeForce RTX 2080 Ti") == "RTX2080TI"


def test_a_pcie_cards_link_is_its_pcie_generation_at_x16():
    from zerofit.hardware import pcie_link_gbps

    for spec in CATALOG.values():
        if spec.interconnect == "pcie":
            assert spec.link_gbps == pcie_link_gbps(spec), spec.key
    assert pcie_link_gbps(CATALOG["H100-SXM"]) == 64  # Gen5
    assert pcie_link_gbps(CATALOG["A100-80GB"]) == 32  # Gen4
    assert pcie_link_gbps(CATALOG["V100-32GB"]) == 16  # Gen3


def test_every_nvidia_gpu_has_its_compute_capability_and_amd_none():
    """The memory model sizes cuBLAS's workspaces by the compute capability: every NVIDIA entry
    needs one (a new GPU too), the AMD entries run ROCm and have none."""
    nvidia = {key for key, spec in CATALOG.items() if spec.name.startswith("NVIDIA")}
    assert set(COMPUTE_CAPABILITY) == nvidia
    assert compute_capability("H100") == (9, 0) and compute_capability("B200") == (10, 0)
    assert compute_capability("a100") == (8, 0) and compute_capability("4090") == (8, 9)
    assert compute_capability("MI300X") is None
    with pytest.raises(ZerofitError):
        compute_capability("H1000")
