"""What every op family shares and nothing family-specific: the CPU key of stored results,
one atomic on-disk store and one fingerprint, timing and one progress bar, the cache registry
``sj.clear_caches()`` walks, and the tuner registry ``sj.tune`` / ``sj.explain`` dispatch
through. Imports no family (tests/python/core/test_layout.py checks it)."""
