"""Answers -> Plan: the user's answers, the planner's search, its decisions and their reasons;
and the estimate report of one fixed configuration, with the verdict wording they share.

Imports memory, models, hardware and errors; never configs, launch, wizard or cli.
"""
