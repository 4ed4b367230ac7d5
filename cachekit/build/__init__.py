"""The write side: discover inputs, cut them into shard jobs, run the jobs, commit the manifest last."""
