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


def saved_tensor_bytes(model, run) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``run()`` executes,
    ``model``'s weights excluded (each storage once, however many views of it are saved)."""
    from torch.autograd.graph import saved_tensors_hooks

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(saved.values())
