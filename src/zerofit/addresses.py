"""The main node's address, checked one way for every command that takes it (config, launch)."""

from __future__ import annotations

import ipaddress
import re

from zerofit.errors import ZerofitError

# RFC 1123 hostname: dot-separated labels of letters, digits and inner '-', 253 characters at most
_HOSTNAME = re.compile(
    r"(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def check_address(field: str, value: str) -> str:
    """``value`` if it is an IP address or an RFC 1123 hostname, else ZerofitError.

    ``fullmatch``, not ``match`` with ``$``: ``$`` also matches before a trailing newline, and a
    newline in an address breaks the YAML and the shell scripts it is written into.
    """
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not isinstance(value, str) or not _HOSTNAME.fullmatch(value):
        raise ZerofitError(
            field,
            f"{value!r} is not an IP address or hostname",
            "use e.g. 10.0.0.1 or node001 (letters, digits, '-', '.')",
        )
    return value
