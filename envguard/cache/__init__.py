"""Archives of torch's and triton's compile caches (``envguard cache``).

- :mod:`envguard.cache.manifest`: the archive manifest, and reading a store of archives;
- :mod:`envguard.cache.store`: the caches' states, saving and restoring archives;
- :mod:`envguard.cache.tar`: tar files of a cache tree, written and extracted safely.
"""
