"""GPU catalog (memory, precisions, interconnect) and local GPU detection."""

from __future__ import annotations

import functools
import shutil
import subprocess
from dataclasses import dataclass

from zerofit.errors import ZerofitError


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    memory_gib: float  # what torch.cuda.get_device_properties().total_memory reports, in GiB
    bf16: bool
    fp8: bool
    interconnect: str  # typical intra-node link: "nvlink" or "pcie"
    # dense 16-bit tensor-core peak (bf16; fp16 where the GPU has no bf16), no sparsity
    bf16_tflops: float
    # HBM (or GDDR) bandwidth, GB/s: bounds the GPU optimizer step (speed/step_time.py)
    hbm_gbps: float = 0.0
    # one direction of the GPU's intra-node link, GB/s (NVLink total / 2, or PCIe x16 per
    # direction): what a ring collective inside a node moves per GPU per second at best
    link_gbps: float = 0.0
    # the card's host link, PCIe generation at x16: what GPUs without NVLink talk over, and
    # what --interconnect pcie means for a card that usually has NVLink (pcie_link_gbps)
    pcie_gen: int = 4
    # one direction of the NVLink bridge a PCIe card can take (two cards joined), GB/s; 0: none
    bridge_gbps: float = 0.0


# One direction of a x16 link, GB/s, by PCIe generation (PCI-SIG: 8, 16, 32 GT/s per lane at
# 128b/130b: 15.75, 31.5, 63 GB/s), rounded as the vendors' datasheets print them (T4 "32 GB/s"
# both ways, A10 / L40S "64 GB/s", H100 PCIe "128 GB/s").
PCIE_X16_GBPS = {3: 16.0, 4: 32.0, 5: 64.0}


def pcie_link_gbps(gpu: GpuSpec) -> float:
    """One direction of ``gpu``'s PCIe x16 link: what a ring inside a node moves per GPU when
    the GPUs talk over PCIe (through the host bridge or a PCIe switch)."""
    return PCIE_X16_GBPS[gpu.pcie_gen]


# Memory is what torch can use: cudaMemGetInfo's total, which torch.cuda.get_device_properties()
# .total_memory and every OOM message print ("GPU 0 has a total capacity of X GiB"), not the
# marketing GB and not nvidia-smi's total (which includes what the driver reserves). It varies by
# about 0.2 GiB with the driver; the catalog keeps the lowest value seen in public OOM messages:
# A100 80GB "79.15 GiB total capacity" (A800: the same HBM2e part), H100 80GB "total capacity of
# 79.11 GiB" (vllm-project/vllm#27508), A100 40GB 39.39, V100 16GB 15.77, V100 32GB 31.75.
# Order matters for detection: specific names first.
# Peak TFLOPs, HBM GB/s and link GB/s are the vendors' datasheets, per family: NVIDIA B200
# (DGX B200 / HGX B200 datasheet, per GPU: 2.25 PF dense bf16, 8 TB/s, NVLink 5 1.8 TB/s);
# H100 / H200 / H800 / H20 (H100 Tensor Core GPU datasheet: SXM 989 TF, 3.35 TB/s, NVLink 900 GB/s;
# PCIe 756 TF, 2 TB/s, PCIe Gen5 128 GB/s; NVL 835 TF, 3.9 TB/s, NVLink bridge 600 GB/s; H200
# datasheet 4.8 TB/s; H800 NVLink 400 GB/s; H20 148 TF, 4.0 TB/s, NVLink 900 GB/s); A100 / A800
# (A100 datasheet: 312 TF, 80GB SXM 2,039 GB/s, 40GB 1,555 GB/s, NVLink 600 GB/s; A800 NVLink
# 400 GB/s); Ada / Ampere PCIe cards (L40S, L4, L20, A10, A40, RTX A6000, GeForce 4090/3090
# datasheets: memory bandwidth as printed, PCIe Gen4 x16 64 GB/s both ways); V100 SXM2 (V100
# datasheet: 125 TF fp16, 900 GB/s, NVLink 300 GB/s); T4 (65 TF fp16, 320 GB/s, PCIe Gen3);
# AMD MI250X (3.2 TB/s and 800 GB/s of Infinity Fabric links per OAM, half of each per GCD)
# and MI300X (1,307 TF bf16 dense, 5.3 TB/s, 7 Infinity Fabric links, 896 GB/s in all).
# link_gbps is one direction: half of the bidirectional figure the datasheets print.
# PCIe generation: Gen5 on Hopper, Blackwell and MI300X, Gen3 on Volta and Turing (V100, T4,
# TITAN RTX, RTX 2080 Ti), Gen4 otherwise (the same datasheets). NVLink bridges of PCIe cards:
# RTX A6000 / A40 / GeForce RTX 3090 112.5 GB/s (their datasheets), TITAN RTX and RTX 2080 Ti
# 100 GB/s (NVIDIA's TITAN RTX page and Turing architecture whitepaper), both ways.
# Turing GeForce / TITAN (NVIDIA Turing GPU architecture whitepaper, appendix A: TITAN RTX
# 130.5 TF fp16 tensor with fp32 accumulate, 672 GB/s GDDR6; RTX 2080 Ti 53.8 TF with fp32
# accumulate, which GeForce halves, 616 GB/s); memory as torch reports it in OOM messages:
# TITAN RTX "23.65 GiB total capacity", RTX 2080 Ti "10.76 GiB total capacity".
CATALOG: dict[str, GpuSpec] = {
    g.key: g
    for g in [
        GpuSpec("B200", "NVIDIA B200 180GB", 178.4, True, True, "nvlink", 2250, 8000, 900, 5),
        GpuSpec("H200", "NVIDIA H200 141GB", 139.8, True, True, "nvlink", 989, 4800, 450, 5),
        GpuSpec("H100-NVL", "NVIDIA H100 NVL 94GB", 93.6, True, True, "nvlink", 835, 3900, 300, 5),
        GpuSpec("H100-PCIE", "NVIDIA H100 PCIe 80GB", 79.11, True, True, "pcie", 756, 2000, 64, 5),
        GpuSpec("H100-SXM", "NVIDIA H100 SXM 80GB", 79.11, True, True, "nvlink", 989, 3350, 450, 5),
        GpuSpec("A100-80GB", "NVIDIA A100 80GB", 79.15, True, False, "nvlink", 312, 2039, 300),
        GpuSpec("A100-40GB", "NVIDIA A100 40GB", 39.39, True, False, "nvlink", 312, 1555, 300),
        GpuSpec("L40S", "NVIDIA L40S 48GB", 44.4, True, True, "pcie", 362, 864, 32),
        GpuSpec(
            "A6000", "NVIDIA RTX A6000 48GB", 47.4, True, False, "pcie", 155, 768, 32, 4, 56.25
        ),
        GpuSpec("A10", "NVIDIA A10 24GB", 22.0, True, False, "pcie", 125, 600, 32),
        GpuSpec("L4", "NVIDIA L4 24GB", 22.0, True, True, "pcie", 121, 300, 32),
        GpuSpec("RTX4090", "NVIDIA GeForce RTX 4090 24GB", 23.6, True, True, "pcie", 165, 1008, 32),
        GpuSpec(
            "RTX3090", "NVIDIA GeForce RTX 3090 24GB", 23.6, True, False, "pcie", 71, 936, 32,
            bridge_gbps=56.25,
        ),
        GpuSpec("V100-32GB", "NVIDIA V100 32GB", 31.75, False, False, "nvlink", 125, 900, 150, 3),
        GpuSpec("V100-16GB", "NVIDIA V100 16GB", 15.77, False, False, "nvlink", 125, 900, 150, 3),
        GpuSpec("T4", "NVIDIA T4 16GB", 14.6, False, False, "pcie", 65, 320, 16, 3),
        # Added later, kept after the first entries so menus keep their order. China-market
        # Hopper/Ampere parts (vendor datasheets: H800/A800 80 GB, H20 96 GB HBM3), 48 GB GDDR6
        # cards.
        GpuSpec("H800", "NVIDIA H800 80GB", 79.11, True, True, "nvlink", 989, 3350, 200, 5),
        GpuSpec("H20", "NVIDIA H20 96GB", 95.6, True, True, "nvlink", 148, 4000, 450, 5),
        GpuSpec("A800", "NVIDIA A800 80GB", 79.15, True, False, "nvlink", 312, 2039, 200),
        GpuSpec("A40", "NVIDIA A40 48GB", 44.4, True, False, "pcie", 150, 696, 32, 4, 56.25),
        GpuSpec("L20", "NVIDIA L20 48GB", 44.4, True, True, "pcie", 120, 864, 32),
        # AMD Instinct (ROCm; DeepSpeed runs on RCCL). "nvlink" here means the xGMI/Infinity Fabric
        # mesh. MI250X: one OAM is two GCDs, each its own 64 GB device to torch.
        GpuSpec(
            "MI250X",
            "AMD Instinct MI250X (one GCD, 64GB)",
            64.0,
            True,
            False,
            "nvlink",
            191,
            1638,
            200,
        ),
        GpuSpec(
            "MI300X", "AMD Instinct MI300X 192GB", 191.5, True, True, "nvlink", 1307, 5300, 448, 5
        ),
        # Turing cards many public runs used (fp16 only, no bf16)
        GpuSpec(
            "TITAN-RTX", "NVIDIA TITAN RTX 24GB", 23.65, False, False, "pcie", 130.5, 672, 16, 3, 50
        ),
        GpuSpec(
            "RTX2080TI", "NVIDIA GeForce RTX 2080 Ti 11GB", 10.76, False, False, "pcie", 53.8, 616,
            16, pcie_gen=3, bridge_gbps=50,
        ),
    ]
}

ALIASES = {
    "H100": "H100-SXM",
    "H100-80GB": "H100-SXM",
    "A100": "A100-80GB",
    "V100": "V100-32GB",
    "4090": "RTX4090",
    "3090": "RTX3090",
    "TITANRTX": "TITAN-RTX",
    "2080TI": "RTX2080TI",
    "2080-TI": "RTX2080TI",
    "RTX-2080-TI": "RTX2080TI",
    "RTX2080-TI": "RTX2080TI",
}

# nvidia-smi product names -> catalog key; more specific patterns first.
_DETECT = [
    (("titan rtx",), "TITAN-RTX"),
    (("2080", "ti"), "RTX2080TI"),
    (("b200",), "B200"),
    (("h200",), "H200"),
    (("h800",), "H800"),
    (("h20",), "H20"),
    (("a800",), "A800"),
    (("mi300x",), "MI300X"),
    (("mi250",), "MI250X"),
    (("l20",), "L20"),
    (("a40",), "A40"),
    (("h100", "nvl"), "H100-NVL"),
    (("h100", "pcie"), "H100-PCIE"),
    (("h100",), "H100-SXM"),
    (("a100", "80"), "A100-80GB"),
    (("a100",), "A100-40GB"),
    (("l40s",), "L40S"),
    (("a6000",), "A6000"),
    (("a10",), "A10"),
    (("l4",), "L4"),
    (("4090",), "RTX4090"),
    (("3090",), "RTX3090"),
    (("v100", "32"), "V100-32GB"),
    (("v100",), "V100-16GB"),
    (("t4",), "T4"),
]


# Hopper GPUs by catalog name: FlashAttention-3 runs only on them (flash-attn's hopper/
# package builds for sm90 alone), and the speed model times it only there.
HOPPER_KEYS = ("H100", "H200", "H800", "H20")


def is_hopper(name: str) -> bool:
    """True for a Hopper GPU's catalog or device name (H100, H200, H800, H20)."""
    return name.upper().startswith(HOPPER_KEYS)


# CUDA compute capability (major, minor) of each NVIDIA catalog GPU, as NVIDIA's "CUDA GPUs"
# table lists it: Blackwell B200 10.0; Hopper 9.0; Ada 8.9; Ampere A100 / A800 8.0, its GA10x
# cards 8.6; Turing 7.5; Volta 7.0. What torch reads as ``get_device_properties().major/minor``
# and sizes per-architecture defaults by (memory/overheads.py: cuBLAS's workspace). The AMD
# entries run ROCm and have none.
COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "B200": (10, 0),
    **{key: (9, 0) for key in ("H200", "H100-NVL", "H100-PCIE", "H100-SXM", "H800", "H20")},
    **{key: (8, 0) for key in ("A100-80GB", "A100-40GB", "A800")},
    **{key: (8, 9) for key in ("L40S", "L4", "RTX4090", "L20")},
    **{key: (8, 6) for key in ("A6000", "A10", "RTX3090", "A40")},
    **{key: (7, 5) for key in ("T4", "TITAN-RTX", "RTX2080TI")},
    **{key: (7, 0) for key in ("V100-32GB", "V100-16GB")},
}


def compute_capability(name: str) -> tuple[int, int] | None:
    """The CUDA compute capability of the catalog GPU ``name`` (key or alias, as ``lookup``
    takes it); None for a GPU that does not run CUDA (AMD Instinct, under ROCm)."""
    return COMPUTE_CAPABILITY.get(lookup(name).key)


def lookup(name: str) -> GpuSpec:
    """Return the catalog entry for ``name`` (case-insensitive key or alias)."""
    key = name.strip().upper().replace(" ", "-")
    key = ALIASES.get(key, key)
    for k, spec in CATALOG.items():
        if k.upper() == key:
            return spec
    import difflib

    names = [k.upper() for k in CATALOG] + list(ALIASES)
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ZerofitError("gpu", f"unknown GPU {name!r}", hint + "use one of " + ", ".join(CATALOG))


def match_gpu_name(product: str) -> str | None:
    """Map an nvidia-smi product name (e.g. 'NVIDIA H100 80GB HBM3') to a catalog key."""
    low = product.lower()
    for words, key in _DETECT:
        if all(w in low for w in words):
            return key
    return None


def detect_local_gpus() -> tuple[str | None, int]:
    """Return (catalog key or None, GPU count) from nvidia-smi; (None, 0) without one."""
    if not shutil.which("nvidia-smi"):
        return None, 0
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, 0
    names = [n.strip() for n in out.splitlines() if n.strip()]
    return (match_gpu_name(names[0]) if names else None), len(names)


@functools.lru_cache(maxsize=None)
def detect_host_ram_gib(meminfo: str = "/proc/meminfo") -> float | None:
    """This node's RAM in GiB (``MemTotal`` of /proc/meminfo), or None where it cannot be read."""
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1024**2  # the value is in kB (KiB)
    except (OSError, ValueError, IndexError):
        return None
    return None
