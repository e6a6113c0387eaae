"""Multi-node launch: a LaunchSpec from accelerate YAMLs and flags, each node's command, scripts.

Imports only zerofit.errors.
"""
