"""The five op families and the dense products they share, one subpackage each, every layer of a family under its one name
(``csrc/<family>``, ``torch_ext/ops/<family>.cpp``, ``kernels/cpu/<family>_*``,
``codegen/cpu_<family>_spec``; see docs/ARCHITECTURE.md):

- ``spmm``: SpMM, SDDMM, edge softmax and the CSR structure (``SparseMatrix``), plans, tuner,
  PyG-signature message-passing layers;
- ``attention``: fused sparse attention and the attention layers (GAT, GATv2, Transformer);
- ``rgms``: relational gather-matmul-scatter (``TypedSparseMatrix``), schedules, tuner, R-GCN;
- ``point_conv``: point-cloud sparse convolution (kernel maps, ``SparseTensor``), schedules,
  tuner, spconv-compatible modules;
- ``filter_conv``: filter-sparse (pruned) Conv2d, its layers, BatchNorm folding, ``sparsify``;
- ``dense``: the dense products every family's layers share (``segment_matmul``,
  ``gather_matmul``, ``linear`` on the dense GEMM layer; ``torch_ext/ops/dense.cpp``).

Inside a family: ``ops`` (wrappers, fakes, autograd) sit on its structure and its
``schedules``/``plans`` (stored results, read-only); its ``tuner`` imports the ops and
registers with ``sparsejit.runtime.tuners``; ``layers`` use the ops. Importing this package
registers every fake, autograd formula and tuner.
"""

from sparsejit.families import attention, dense, filter_conv, point_conv, rgms, spmm  # noqa: F401
