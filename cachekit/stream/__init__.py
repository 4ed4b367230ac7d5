"""The node shard cache for caches on object storage: verified copies, eviction, downloads ahead, link sharing, pins."""
