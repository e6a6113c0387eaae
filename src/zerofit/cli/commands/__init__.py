"""Subcommands: one module each, exposing register(subparsers)."""
