"""Bad input raises exceptions that name the argument, the position and the value."""

import pytest
import torch

import sparsejit as sj
from conftest import random_graph
from conftest import raises_type_error  # noqa: E402


def test_out_of_range_index_is_named():
    with pytest.raises(ValueError, match=r"indices\[2\] = 9001 is out of range for 5000 columns"):
        sj.SparseMatrix.from_csr(torch.tensor([0, 2, 3]), torch.tensor([0, 1, 9001]),
                                 shape=(2, 5000))


def test_negative_index_is_named():
    with pytest.raises(ValueError, match=r"indices\[0\] = -1"):
        sj.SparseMatrix.from_csr(torch.tensor([0, 1]), torch.tensor([-1]), shape=(1, 3))


def test_decreasing_indptr_is_named():
    with pytest.raises(ValueError, match=r"indptr\[2\] = 1 < indptr\[1\] = 3"):
        sj.SparseMatrix.from_csr(torch.tensor([0, 3, 1, 3]), torch.tensor([0, 1, 2]),
                                 shape=(3, 3))


def test_indptr_end_must_match_nnz():
    with pytest.raises(ValueError, match=r"indptr\[2\] = 4 must equal the number of stored"):
        sj.SparseMatrix.from_csr(torch.tensor([0, 1, 4]), torch.tensor([0, 1, 2]), shape=(2, 3))


def test_indptr_size_must_match_shape():
    with pytest.raises(ValueError, match="indptr has 3 entries"):
        sj.SparseMatrix.from_csr(torch.tensor([0, 1, 2]), torch.tensor([0, 1]), shape=(4, 3))


def test_float_indices_rejected():
    with pytest.raises(TypeError, match="indices must hold integers"):
        sj.SparseMatrix.from_csr(torch.tensor([0, 1]), torch.tensor([0.0]), shape=(1, 1))


def test_edge_index_errors():
    with pytest.raises(ValueError, match=r"shape \[2, E\]"):
        sj.SparseMatrix.from_edge_index(torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"edge_index\[:, 1\] = \[7, 0\] is out of range"):
        sj.SparseMatrix.from_edge_index(torch.tensor([[0, 7], [1, 0]]), num_nodes=5)
    with pytest.raises(ValueError, match="values has 3 entries but edge_index has 2 edges"):
        sj.SparseMatrix.from_edge_index(torch.tensor([[0, 1], [1, 0]]), values=torch.ones(3))
    for bad in ((2, 2), 2.5, True, "2"):
        with pytest.raises(TypeError, match="num_nodes must be an int"):
            sj.SparseMatrix.from_edge_index(torch.tensor([[0, 1], [1, 0]]), num_nodes=bad)
    A = sj.SparseMatrix.from_edge_index(torch.tensor([[0, 1], [1, 0]]),
                                        num_nodes=torch.tensor(3))  # anything with __index__
    assert A.shape == (3, 3) and isinstance(A.shape[0], int)


def test_values_shape_checked():
    A = random_graph(5, 5, 2, seed=1)
    with pytest.raises(ValueError, match=f"nnz = {A.nnz}"):
        A.with_values(torch.ones(A.nnz + 1))


def test_op_argument_errors():
    A = random_graph(6, 4, 2, seed=2)
    with pytest.raises(ValueError, match="X has 5 rows but the sparse matrix has 4 columns"):
        sj.spmm(A, torch.randn(5, 3))
    with pytest.raises(ValueError, match="reduce must be one of"):
        sj.spmm(A, torch.randn(4, 3), reduce="prod")
    with pytest.raises(TypeError, match="must be float32"):
        sj.spmm(A, torch.ones(4, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="A.values dtype"):
        sj.spmm(A.with_values(torch.ones(A.nnz, dtype=torch.float64)), torch.randn(4, 3))
    with pytest.raises(ValueError, match="need X of shape"):
        sj.spmm(A.with_values(torch.ones(A.nnz, 2)), torch.randn(4, 3))
    with pytest.raises(ValueError, match="Q has 5 rows but the sparse matrix has 6 rows"):
        sj.sddmm(A, torch.randn(5, 3), torch.randn(4, 3))
    with pytest.raises(ValueError, match="feature shapes differ"):
        sj.sddmm(A, torch.randn(6, 3), torch.randn(4, 2))
    with pytest.raises(ValueError, match=f"nnz = {A.nnz}"):
        sj.edge_softmax(A, torch.randn(A.nnz + 2))


def test_raw_op_checks_dtypes():
    A = random_graph(6, 4, 2, seed=2)
    with raises_type_error(match="indices dtype"):
        sj.ops.spmm(A.indptr, A.indices.int(), None, torch.randn(4, 3), "sum")
    with pytest.raises(ValueError, match="reduce must be one of"):
        sj.ops.spmm(A.indptr, A.indices, None, torch.randn(4, 3), "avg")
