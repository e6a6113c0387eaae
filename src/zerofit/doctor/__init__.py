"""`zerofit doctor`: gather a node's facts, check them, report; the port handshake; the timed
TCP transfer between nodes (`--measure-bandwidth`).

Imports nothing else from zerofit; only cli imports it.
"""
