"""The gradient of SpMM max / min with respect to X: the native spmm_arg_backward op against
the ATen path it replaced (index_select of the winners' columns, a where, scatter_add_), side
by side in one process on the same positions; medians, 1 and 2 threads.

    SPARSEJIT_DATA=../shared/data python3 benchmarks/archive/bench_spmm_arg_backward.py
"""
import torch

import sparsejit as sj
from sparsejit.runtime.timing import median_ms
from sparsejit.tools import data

GRAPHS = ["pubmed", "powerlaw:n=200000,avg=12,alpha=2.1,seed=1"]


def aten_path(col, arg, grad, x_rows):
    """The Python scatter that ran before the op (families/spmm/spmm.py, 2-D X, no values)."""
    valid = arg >= 0
    pos = arg.clamp(min=0)
    g = torch.where(valid, grad, torch.zeros((), dtype=grad.dtype))
    src = col.to(torch.long).index_select(0, pos.reshape(-1)).view(pos.shape)
    return torch.zeros(x_rows, grad.shape[1], dtype=grad.dtype).scatter_add_(0, src, g)


def main():
    from sparsejit.info import cpu_line
    print(f"CPU: {cpu_line()}", flush=True)
    ops = torch.ops.sparsejit
    print("| graph | F | threads | native (ms) | ATen scatter (ms) | speed-up |")
    print("|---|---|---|---|---|---|")
    for spec in GRAPHS:
        try:
            g = data.load_graph(spec)
        except Exception as e:  # noqa: BLE001 - a missing data folder skips real graphs
            print(f"skip {spec}: {e}")
            continue
        A = sj.SparseMatrix.from_edge_index(g.edge_index, g.num_nodes)
        for f in (16, 64):
            x = torch.randn(A.shape[1], f)
            y, arg = ops.spmm(A.indptr, A.indices, None, x, "max", A.shape[1], need_arg=True)
            grad = torch.randn_like(y)
            ref = aten_path(A.indices, arg, grad, A.shape[1])
            got = ops.spmm_arg_backward(A.indptr, A.indices, arg, grad, None, A.shape[1])
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                t_native = median_ms(lambda: ops.spmm_arg_backward(
                    A.indptr, A.indices, arg, grad, None, A.shape[1]), 9, warmup=2)
                t_aten = median_ms(lambda: aten_path(A.indices, arg, grad, A.shape[1]), 9,
                                   warmup=2)
                print(f"| {spec} | {f} | {threads} | {t_native:.2f} | {t_aten:.2f} | "
                      f"{t_aten / t_native:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
