"""The dense family: segment_matmul / gather_matmul and ``linear`` (a Linear on sparsejit's
dense GEMM layer, which the PyG-signature layers of every family use where it is faster)."""

from sparsejit.families.dense.ops import (gather_matmul, linear, linear_add_, relu_linear,
                                          segment_matmul)

__all__ = ["segment_matmul", "gather_matmul", "linear", "linear_add_", "relu_linear"]
