"""The on-disk contract: the manifest, the shard formats, encoded samples, atomic commits, locks,
and where a cache lives (a local folder or an fsspec URL).

Knows nothing of builds, training or tools; both the write side (``build``) and the read side
(``feed``) go through it.
"""
