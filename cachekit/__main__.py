"""``python -m cachekit``: the ``cachekit`` command."""

from .cli import main

main()
