"""The fuzz test's cases and worker (run by tests/python/fuzz/test_fuzz.py in subprocesses)."""
