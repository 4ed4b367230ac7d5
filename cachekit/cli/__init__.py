"""The ``cachekit`` command line: parses arguments, calls the library, prints. No logic of its own.

``app`` holds the command group and what every command shares; each other module adds commands.
"""

from . import build, cache, doctor, tools  # noqa: F401  (each registers its commands on ``main``)
from .app import main

__all__ = ["main"]
