"""`zerofit doctor`: gather a node's facts, check them, report; the port handshake.

Imports nothing else from zerofit; only cli imports it.
"""
