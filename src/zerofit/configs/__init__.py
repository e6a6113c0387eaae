"""Plan -> {filename: text}: the DeepSpeed JSON and accelerate YAML builders, presets, `check`.

Imports planning, memory, hardware and errors; never launch, wizard or cli.
"""
