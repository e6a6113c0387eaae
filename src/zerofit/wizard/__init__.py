"""The interactive wizard: the questions as data and the questionary shell that asks them.

Imports planning, models and hardware; only cli imports it.
"""
