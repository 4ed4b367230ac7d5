"""The contract every source kind keeps: discover -> records -> samples.

A source kind is one module under ``cachekit/build/sources/`` (or anywhere, for a kind added from
outside) and one row of ``layouts.LAYOUTS``. Three steps, each run by a fixed caller:

1. ``discover(request) -> Source`` (the module's function, ``SourceKind``), called once in the
   build's process by ``build.findsource.find_source`` (a build, ``bench``'s raw rows) or
   ``discovery.discover`` (a folder) after ``layouts.detect`` chose the module's row. ``request`` is a
   ``layouts.Request``: the RAW (a path, URL or pattern, or the user's Python object), the build's
   ``--annotations`` and ``--labels`` and the other options (``request.config``, a ``BuildConfig``).
   It returns the ``Source``: one row per input, in the order the build stores them (``paths``,
   ``labels``, ``sizes``, ``mtimes``, per-input raw ``targets``, ``fields``, ``classes``), what was
   left out with its reason (``ignored``, ``dropped``), ``layout`` (its row's name) and ``reader``.
   It reads small things (listings, annotation files, columns), never pixels; a problem the user can
   fix is one ``UsageError`` line.
2. records: ``Source.reader`` (``records.RecordReader``, or None when every input is a file under
   ``Source.root``, which the shard job reads itself). It is pickled into each shard job; in the
   worker, ``shardjob`` calls ``reader.open(storage_options, max_bytes)`` once, which gives
   ``read(rel, target) -> bytes | Record``: the input named ``rel`` (a row's path) as its encoded
   bytes (its target the row's, known at discovery) or a ``records.Record`` (pixels or bytes, the
   target and class read with them). The user's code raising is ``records.SourceRaised`` (a skip);
   an I/O error is ``OSError`` (retried, then a skip). ``sequential`` says whether the rows are
   cheapest read in their order (``run`` then cuts shards in that order); ``stream`` (optional,
   False when absent) that the source is read once in the build's process (``streamrun``).
3. samples: the shard job (``shardjob``) decodes each record's image, runs the recipe and turns its
   raw target into the stored fields (``sampletargets``); a source module takes no part in it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .inputtable import Source
from .layouts import Request

__all__ = ["SourceKind"]


@runtime_checkable
class SourceKind(Protocol):
    """A source module: ``discover`` (step 1 above). Modules satisfy it with a module-level function."""

    def discover(self, request: Request) -> Source:
        """The ``Source`` of ``request.raw`` (called in the build's process, once, by ``discovery``)."""
        ...
