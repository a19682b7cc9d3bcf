"""The fuzz test's cases and worker (run by tests/python/test_fuzz.py in subprocesses)."""
