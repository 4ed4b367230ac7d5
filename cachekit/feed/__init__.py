"""The read side: the dataset over a cache, the sampler, the loader and its batch buffers."""
