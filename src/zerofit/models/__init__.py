"""Model shapes and exact parameter counts: the built-in table, config.json files, hub ids.

Imports only the shared top level (zerofit.errors, zerofit.cache).
"""
