"""Which versions of a trainer library the adapters work with, and the one line for any other.

The adapters rest on parts of a library that its major versions may change (how Lightning injects
samplers and saves a loader's state, how Accelerate rebuilds a loader): each says the range it was
written and tested for, and a version outside it is refused in one line naming the extra that
installs a supported one (as the adapter refuses the library missing).
"""

from __future__ import annotations

import re

from ..errors import UsageError

__all__ = ["SUPPORTED", "check_version", "version_tuple"]

#: Each library's import name -> (the lowest version supported, the first one not).
SUPPORTED = {
    "lightning": ((2, 2), (3, 0)),
    "accelerate": ((1, 0), (2, 0)),
}


def version_tuple(version: str) -> tuple[int, int] | None:
    """``"2.6.1"`` -> ``(2, 6)``; None for a version that does not start with two numbers."""
    match = re.match(r"\s*(\d+)\.(\d+)", str(version))
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_version(name: str, version: str, install: str) -> None:
    """Refuse, in one line ending with ``install`` (the command that gets a supported version), a
    version of library ``name`` outside the adapter's ``SUPPORTED`` range."""
    lowest, beyond = SUPPORTED[name]
    found = version_tuple(version)
    if found is None or not lowest <= found < beyond:
        raise UsageError(
            f"cachekit's {name} adapter needs {name} from {lowest[0]}.{lowest[1]} to before "
            f"{beyond[0]}.{beyond[1]}, found {version}: {install}"
        )
