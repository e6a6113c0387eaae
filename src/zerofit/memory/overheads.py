"""GPU memory a training process holds outside ``torch.cuda.max_memory_allocated()``, and the
cuBLAS workspaces, which it holds inside it.

- **cuBLAS workspaces** (inside the caching allocator, so inside ``max_memory_allocated``):
  PyTorch gives each cuBLAS handle and stream its own workspace, taken from the caching
  allocator (``aten/src/ATen/cuda/CublasHandlePool.cpp``: ``setWorkspaceForHandle`` /
  ``getNewWorkspace`` call ``CUDACachingAllocator::get()->allocate``; allocating it there, not
  letting cuBLAS ``cudaMallocAsync`` outside, is deliberate, see the comment in
  ``getCurrentCUDABlasHandle``). Its size is ``CUBLAS_WORKSPACE_CONFIG``, by default
  ``:4096:8`` (32 MiB) on Hopper and Blackwell and ``:4096:2:16:8`` (8.125 MiB) elsewhere
  (``parseChosenWorkspaceSize``: compute capability major 9 only in torch before pytorch/pytorch
  PR 175344 of February 2026, then 9, 10 and 12, PR 189312 adding 11; the older rule gives a
  Blackwell GPU 8.125 MiB, 48 MiB less than counted here over two threads), plus a separate
  cuBLASLt workspace per handle and stream (``getCUDABlasLtWorkspace``,
  ``CUBLASLT_WORKSPACE_SIZE`` default 1024 KiB: the measured torch's; the cuBLAS one serves
  cuBLASLt too under ``TORCH_CUBLASLT_UNIFIED_WORKSPACE``, which later torch turns on by default,
  PR 168175, 1 MiB less per thread). Handles are per thread, and a training step
  multiplies on two: the forward on the caller's thread, the backward on autograd's device
  thread. Two times 33 MiB is the 69,206,016 bytes every H100 process of
  benchmarks/gpu_lora_memory.py kept allocated after its first step
  (tests/data/gpu_lora_memory_h100_stacks.jsonl, ``start_allocated``), and what the nine H100
  calibration points were under without it (tests/memory/test_estimate.py: 0.063-0.066 GiB,
  one 0.090). ``cublas_workspace_bytes`` gives it by the GPU's compute capability
  (hardware.COMPUTE_CAPABILITY), and the estimate counts it in every phase
  (``cublas_workspace``); a step that runs on no CUDA GPU has none: a CPU rank (what the CPU
  probes run; ``TrainSetup.gpu`` None) or an AMD GPU, whose ROCm build sizes hipBLAS's and
  hipBLASLt's workspaces otherwise (not measured; the safety margin covers them). The
  CUDA-context term below is measured beyond ``max_memory_reserved``, so it does not count these
  workspaces a second time.

- **CUDA context**: driver/runtime state and kernel images. Measured on the calibration H100
  (tests/data/mem_h100_qwen2.5-0.5b.jsonl, torch 2.11 + CUDA 13, DeepSpeed 0.19.8): 0.514 GiB
  before the model existed (``device_used_before_model_gib``), but much more once a DeepSpeed
  step has run: ``device_used_end_gib - peak_reserved_gib`` (what the process holds beyond
  everything the caching allocator ever reserved) is 1.301-1.311 GiB on every ZeRO-2 point and
  1.683 GiB on both ZeRO-3 points (world size 1). The growth was not broken down; with CUDA's
  lazy module loading (``CUDA_MODULE_LOADING=LAZY``, PyTorch's default since 2.0) it is what
  the first use of each kernel and library adds: the kernel images of forward, backward and the
  optimizer, NCCL's communicator state (DeepSpeed initialises a process group even for one
  rank), library handles. Each point is a lower bound of that memory (the allocator's
  reservation at the end is at most its peak), and the smallest gap per stage is what a
  DeepSpeed run gets; NCCL's per-peer buffers of larger worlds come on top (below). A run
  without DeepSpeed keeps the before-model number, the only one measured for it (the GPU-only
  test in tests/memory/test_overheads.py checks that it and the margin cover a plain step).
  Public OOM messages that state the process's non-PyTorch memory check both
  (benchmarks/outside_allocator.py).
- **Allocator fragmentation**: PyTorch's caching allocator (``c10/cuda/CUDACachingAllocator.cpp``)
  rounds each request above 1 MiB into a block of a 20 MiB segment (1-10 MiB requests) or into
  its own segment rounded up to 2 MiB (``kRoundLarge``); a freed block stays cached and is split
  for later, smaller requests. When ``cudaMalloc`` fails it first frees every wholly unused cached
  segment and retries (``release_cached_blocks``), so a fully free segment never causes an OOM
  (that is why ``max_memory_reserved`` overstates what is needed). What does cost memory is the
  unused part of segments that still hold live blocks: up to 2 MiB of rounding per live large
  tensor, and, in the worst case, one free range as big as the largest short-lived tensor of the
  phases before the peak, whose segment was split for smaller tensors that are still alive at
  the peak. Both are counted here; the calibration points check
  that this stays below the measured ``peak_reserved - peak_alloc``.
- **Fragmentation over a long run** is not in the verdict: a single step's terms cannot show it.
  Shapes that change from step to step (batches padded to their longest row) leave free ranges
  inside segments that still hold live blocks. A PyTorch OOM message states that memory ("reserved
  by PyTorch but unallocated") after the allocator has released every wholly free segment, so it
  is the fragmentation at the moment of the OOM. The 24 training runs of the public OOM messages
  in tests/data/oom_messages_outside_allocator.jsonl lost a median of 1.25 GiB to it (up to 17.6).
  ``estimate`` says so when a fit leaves less than that to spare (``tight_fit_note``).
- **NCCL buffers** (NCCL docs, "Environment Variables": ``NCCL_BUFFSIZE`` default 4 MiB, one
  buffer per channel and connection; LL and LL128 protocols add their own fixed buffers, from
  ``src/include/device.h``: LL 8 lines x 512 threads x 8 steps x 16 B = 512 KiB, LL128 120 x 640 x
  8 x 8 B = 4.69 MiB). A ring receives from one peer per channel inside a node; across nodes the
  network transport keeps send and receive buffers and the tree adds up to three more peers.
- **vLLM colocated** (TRL GRPO ``vllm_mode="colocate"``): vLLM takes
  ``gpu_memory_utilization`` x the GPU's memory for its weights and KV cache.
"""

from __future__ import annotations

from zerofit.hardware import compute_capability

GIB = 1024**3
MIB = 1024**2
CUDA_CONTEXT_BYTES = int(0.5 * GIB)  # before the model: 0.514 GiB measured
# after DeepSpeed training steps (device_used_end - peak_reserved, smallest per stage)
CUDA_CONTEXT_IN_DEEPSPEED_TRAINING_GIB = {"zero0-2": 1.301, "zero3": 1.683}
ROUND_LARGE = 2 * MIB  # kRoundLarge: segment granularity above 10 MiB
NCCL_BUFFSIZE = 4 * MIB  # NCCL_BUFFSIZE default
NCCL_LL_BUFFSIZE = 8 * 512 * 8 * 16
NCCL_LL128_BUFFSIZE = 120 * 640 * 8 * 8
# Channels NCCL opens (its topology search): up to 16 rings over NVLink/NVSwitch, a few on PCIe.
NCCL_CHANNELS = {"nvlink": 16, "pcie": 4}
# Margin over the sum of every modelled term: cuDNN's workspaces, NCCL's NVLS/registration
# buffers on NVSwitch systems, an AMD GPU's hipBLAS workspaces, library version drift.
DEFAULT_SAFETY_MARGIN_GIB = 1.0
# CublasHandlePool.cpp parseChosenWorkspaceSize: CUBLAS_WORKSPACE_CONFIG's default per handle and
# stream, ":4096:8" on the compute capabilities below, ":4096:2:16:8" elsewhere;
# parseCUDABlasLtWorkspaceSize: 1024 KiB
CUBLAS_WORKSPACE_32MIB_MAJORS = (9, 10, 11, 12)  # Hopper, Blackwell (B200, Thor, RTX 50)
CUBLAS_WORKSPACE_32MIB = 4096 * 8 * 1024
CUBLAS_WORKSPACE_OTHER = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLASLT_WORKSPACE = 1024 * 1024
# the threads a training step multiplies on: the forward's (the caller's) and autograd's device
# thread for the backward (each gets its own cuBLAS handle from the per-thread pool)
CUBLAS_TRAINING_THREADS = 2
# "reserved by PyTorch but unallocated" in the OOM messages of 24 public training runs, median
# (tests/data/oom_messages_outside_allocator.jsonl; tests/memory/test_overheads.py derives it)
FRAGMENTATION_AT_OOM_MEDIAN_GIB = 1.25


def cuda_context_bytes(stage: int, deepspeed: bool) -> int:
    """What the process holds outside the caching allocator once training runs (see the module
    docstring): the in-training measurement for a DeepSpeed engine of this stage, the
    before-model context for a run without DeepSpeed."""
    if not deepspeed:
        return CUDA_CONTEXT_BYTES
    key = "zero3" if stage == 3 else "zero0-2"
    return int(CUDA_CONTEXT_IN_DEEPSPEED_TRAINING_GIB[key] * GIB)


def cublas_workspace_bytes(gpu: str | None, threads: int = CUBLAS_TRAINING_THREADS) -> int:
    """The cuBLAS and cuBLASLt workspaces a training process keeps allocated from its first
    step on, inside ``max_memory_allocated`` (see the module docstring): one pair per thread
    that multiplies, 33 MiB each on Hopper and Blackwell, 9.125 MiB on older GPUs. 0 where the
    step runs on no CUDA GPU: ``gpu`` None (a CPU rank) or a catalog GPU without a CUDA compute
    capability (AMD, ROCm)."""
    capability = compute_capability(gpu) if gpu else None
    if capability is None:
        return 0
    large = capability[0] in CUBLAS_WORKSPACE_32MIB_MAJORS
    cublas = CUBLAS_WORKSPACE_32MIB if large else CUBLAS_WORKSPACE_OTHER
    return threads * (cublas + CUBLASLT_WORKSPACE)


def tensors_live_at_peak(model, checkpointing: bool) -> int:
    """Large tensors alive at the peak: saved activations per layer (two RMSNorms x 3, q/k/v/out
    and the logsumexp, four MLP tensors; one input per layer under checkpointing) plus the flat
    state buffers and the loss path (about 20)."""
    per_layer = 1 if checkpointing else 15
    return model.num_layers * per_layer + 20


def allocator_fragmentation_bytes(model, checkpointing: bool, largest_transient: int) -> int:
    """Unusable bytes inside live segments: rounding of each live tensor, plus one free range the
    size of the largest transient request (see the module docstring)."""
    return tensors_live_at_peak(model, checkpointing) * ROUND_LARGE + largest_transient


def nccl_buffer_bytes(world_size: int, gpus_per_node: int, interconnect: str = "nvlink") -> int:
    """Per-rank NCCL communicator buffers for the data-parallel communicator (0 on one GPU)."""
    if world_size <= 1:
        return 0
    per_connection = NCCL_BUFFSIZE + NCCL_LL_BUFFSIZE + NCCL_LL128_BUFFSIZE
    nodes = max(1, world_size // max(1, gpus_per_node))
    channels = NCCL_CHANNELS.get(interconnect, NCCL_CHANNELS["pcie"])
    if nodes == 1:
        connections = 1  # ring: receive from the previous rank
    else:
        connections = 2 + 3  # network ring send + receive, tree parent + 2 children
    return channels * connections * per_connection


def is_tight(spare_gib: float) -> bool:
    """A fit leaves less than the median fragmentation public training runs showed when they ran
    out of memory (see the module docstring)."""
    return spare_gib < FRAGMENTATION_AT_OOM_MEDIAN_GIB


def tight_fit_note(spare_gib: float) -> str | None:
    """A caution for a tight fit (``is_tight``), with what keeps fragmentation down; None when
    the spare memory is above that. Advice only: the verdict does not change."""
    if not is_tight(spare_gib):
        return None
    return (
        f"note: only {spare_gib:.1f} GiB to spare; public OOM messages of training runs show a "
        f"median {FRAGMENTATION_AT_OOM_MEDIAN_GIB} GiB lost to fragmentation after many steps of "
        "changing shapes. Fixed-length batches (packing) or "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (not with vLLM's sleep mode) keep it "
        "down"
    )
