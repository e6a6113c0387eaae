"""Fixtures of the real cluster engines (real_cluster.py) for every test in tests/launch."""

from real_cluster import slurm_cluster, ssh_hosts, tool_path  # noqa: F401  (pytest fixtures)
