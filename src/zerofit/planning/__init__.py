"""Answers -> Plan: the user's answers, the planner's search, its decisions and their reasons.

Imports memory, models, hardware and errors; never configs, launch, wizard or cli.
"""
