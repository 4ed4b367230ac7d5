"""``python -m cachekit.cli``: the ``cachekit`` command."""

from . import main

main()
