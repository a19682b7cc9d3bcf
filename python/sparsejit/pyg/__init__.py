"""PyG-signature layers (torch_geometric 2.8 drop-ins) and the adjacency handling they share.
The public names are exported by :mod:`sparsejit.nn`."""
