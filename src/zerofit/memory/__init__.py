"""The memory model: per-GPU bytes of a training step (states, activations, the estimate).

Pure arithmetic over a model shape; imports nothing else from zerofit (no builders, no planner).
"""
