"""zerofit: fit accelerate + DeepSpeed configs to your model, GPUs and workload."""

__version__ = "0.1.0"
