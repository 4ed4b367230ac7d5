"""Tools around a cache: benchmarks, diagnosis, verification, conversion, synthetic data, reports."""
