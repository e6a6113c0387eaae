"""STUB: `zerofit doctor` (to be replaced by its owner)."""


def register(sub) -> None:
    p = sub.add_parser("doctor", help="(not implemented yet)")
    p.set_defaults(func=lambda args: print("not implemented") or 2)
