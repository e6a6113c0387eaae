"""The `zerofit` command: argument parsing (main.py) and one module per subcommand (commands/).

Thin shells over the packages below; it may import any of them, and nothing imports it.
"""
