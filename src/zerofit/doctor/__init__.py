"""`zerofit doctor`: gather a node's facts, check them, report; the port handshake; the timed
TCP transfer between nodes (`--measure-bandwidth`).

Imports no other zerofit folder (only the shared `cluster_facts`); only cli imports it.
"""
