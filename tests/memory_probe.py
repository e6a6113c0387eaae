"""Measure what real torch code allocates on CPU, with torch's own MemTracker
(``torch/distributed/_tools/mem_tracker.py``: a TorchDispatchMode that follows every storage
created and freed). Memory of these ops is device-independent, so the bytes check the estimator's
terms without a GPU."""

from __future__ import annotations

CPU = "cpu"


def tracked_peak(fn, *external) -> tuple[int, int, dict]:
    """Run ``fn`` under MemTracker; return (peak total bytes, bytes alive after, peak by kind).
    ``external``: modules, optimizers and tensors that exist before ``fn`` (counted from the start).
    """
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(*external)
    with tracker:
        fn()
    dev = torch.device(CPU)
    peak = tracker.get_tracker_snapshot("peak")[dev]
    now = tracker.get_tracker_snapshot("current")[dev]
    return peak["Total"], now["Total"], {str(k).split(".")[-1]: v for k, v in peak.items()}
