"""Measured ceilings for roofline fractions: streaming memory bandwidth and dense GEMM
throughput of this machine."""

from __future__ import annotations

import time

import torch

_cached = {}


def stream_bandwidth_gbs(mbytes: int = 256, repeat: int = 5, device: str = "cpu") -> float:
    """Median bandwidth of a large tensor copy (bytes read + bytes written) in GB/s, with
    torch's current thread count. Cached per (device, threads)."""
    key = (device, torch.get_num_threads())
    if key in _cached:
        return _cached[key]
    n = mbytes * (1 << 20) // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeat):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    gbs = 2 * n * 4 / times[len(times) // 2] / 1e9
    _cached[key] = gbs
    return gbs


def spmm_min_bytes(rows: int, nnz: int, row_width: int, elem_size: int, index_size: int,
                   with_values: bool) -> int:
    """No-reuse byte count of SpMM: indptr + indices (+ values) + one gathered row of X per
    stored entry + the output."""
    return ((rows + 1) * index_size + nnz * index_size + (nnz * elem_size if with_values else 0)
            + nnz * row_width * elem_size + rows * row_width * elem_size)


def sddmm_min_bytes(rows: int, nnz: int, row_width: int, elem_size: int, index_size: int) -> int:
    """No-reuse byte count of SDDMM: structure + one row of Q and of K per entry + output."""
    return ((rows + 1) * index_size + nnz * index_size + 2 * nnz * row_width * elem_size
            + nnz * elem_size)


_gemm_cached = {}


def gemm_peak_gflops(n: int = 2048, repeat: int = 5, device: str = "cpu",
                     dtype: torch.dtype = torch.float32) -> float:
    """Median GFLOP/s of a dense n x n x n ``torch.mm`` (MKL / oneDNN on the CPU, cuBLAS on a
    GPU) with torch's current thread count: the compute ceiling the compute-bound families
    are measured against. Cached per (device, dtype, threads)."""
    key = (device, dtype, torch.get_num_threads())
    if key in _gemm_cached:
        return _gemm_cached[key]
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    torch.mm(a, b)
    times = []
    for _ in range(repeat):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.mm(a, b)
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    gflops = 2 * n ** 3 / times[len(times) // 2] / 1e9
    _gemm_cached[key] = gflops
    return gflops
