"""Pixels in, pixels out: decoding and image operations on numpy arrays, and the recipes that chain them.

Knows nothing of caches, builds or training; everything above builds on it.
"""
