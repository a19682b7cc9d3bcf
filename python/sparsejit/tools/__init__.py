"""Tools around the library, not part of it: the benchmark harness (``python -m
sparsejit.tools.bench``), real-data loaders and generators (``tools.data``), roofline helpers
(``tools.roofline``) and the GCN demo (``python -m sparsejit.tools.demo``)."""
