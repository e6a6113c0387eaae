"""Seconds per optimizer step for one training configuration: the training FLOPs of a model's
shape (``flops.py``) and the time DeepSpeed's step spends computing, communicating, offloading and
stepping the optimizer (``step_time.py``).

Imports memory, models, hardware and errors; never planning, configs, launch, wizard or cli.
"""
