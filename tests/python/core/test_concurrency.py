"""sparsejit under the concurrency users bring: DataLoader workers forked after the parent ran
ops (OpenMP pool, JIT cache, locks), and many threads at once on different structures and
widths, including concurrent first compiles of one kernel (compiled once).

Each scenario runs in a subprocess with a time limit and a fresh JIT cache, so a deadlock
(e.g. an OpenMP pool used across fork) fails the test instead of hanging pytest, and the first
compiles really are first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_PRELUDE = textwrap.dedent("""
    import torch
    import sparsejit as sj

    def graph(n, avg, seed):
        g = torch.Generator().manual_seed(seed)
        e = n * avg
        src = (torch.rand(e, generator=g) ** 2 * n).long().clamp_(max=n - 1)  # skewed
        dst = torch.randint(0, n, (e,), generator=g)
        return torch.stack([src, dst]), g

    def reference_sum(ei, x, n):
        return torch.zeros(n, x.shape[1], dtype=x.dtype).index_add_(0, ei[1], x[ei[0]])
""")


def _run(body: str, tmp_path, timeout: int = 240) -> str:
    env = dict(os.environ, SPARSEJIT_CACHE_DIR=str(tmp_path / "jit-cache"), OMP_NUM_THREADS="2")
    r = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(body)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def test_forked_dataloader_workers_run_ops(tmp_path):
    out = _run("""
        from torch.utils.data import DataLoader, Dataset

        # The parent runs ops first: the JIT compiles, OpenMP starts its pool.
        ei, g = graph(20000, 8, 0)
        x = torch.randn(20000, 64, generator=g)
        A = sj.SparseMatrix.from_edge_index(ei, 20000)
        torch.testing.assert_close(sj.spmm(A, x), reference_sum(ei, x, 20000))

        class Graphs(Dataset):
            def __len__(self):
                return 6

            def __getitem__(self, i):  # runs in a forked worker
                n = 3000 + 500 * i
                ei, g = graph(n, 6, 100 + i)
                x = torch.randn(n, (16, 32, 64)[i % 3], generator=g)
                B = sj.SparseMatrix.from_edge_index(ei, n)
                y = sj.spmm(B, x, "sum")
                conv = sj.nn.GCNConv(x.shape[1], 8)
                h = conv(x, ei)
                return y, reference_sum(ei, x, n), h.shape[0] == n and bool(torch.isfinite(h).all())

        loader = DataLoader(Graphs(), batch_size=None, num_workers=2,
                            multiprocessing_context="fork")
        got = 0
        for y, ref, ok in loader:
            torch.testing.assert_close(y, ref)
            assert ok
            got += 1
        assert got == 6
        # The parent still works after its workers are gone.
        torch.testing.assert_close(sj.spmm(A, x), reference_sum(ei, x, 20000))
        print("fork ok", got)
    """, tmp_path)
    assert "fork ok 6" in out


def test_eight_threads_on_different_structures_and_widths(tmp_path):
    out = _run("""
        import threading

        cases = []
        for t in range(8):
            n = 4000 + 1000 * t
            ei, g = graph(n, 5 + t, 200 + t)
            x = torch.randn(n, (16, 32, 48, 64)[t % 4], generator=g)
            cases.append((ei, n, x))
        errors, barrier = [], threading.Barrier(8)

        def work(t):
            ei, n, x = cases[t]
            try:
                barrier.wait()
                for _ in range(3):
                    A = sj.SparseMatrix.from_edge_index(ei, n)
                    y = sj.spmm(A, x, "sum")
                    torch.testing.assert_close(y, reference_sum(ei, x, n))
                    m = sj.spmm(A, x, "max")
                    assert m.shape == (n, x.shape[1])
            except Exception as e:  # reported below with the thread's case
                errors.append(f"thread {t}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        print("threads ok")
    """, tmp_path)
    assert "threads ok" in out


def test_concurrent_first_compiles_of_one_kernel_compile_once(tmp_path):
    out = _run("""
        import threading
        from sparsejit import _core

        assert _core.jit_enabled()
        infos, barrier = [None] * 8, threading.Barrier(8)

        def work(t):
            barrier.wait()
            # float32, int64 indices, sum, no values, 1 head, F = 40: one spec for every thread
            e = _core.enums()
            infos[t] = _core.jit_spmm(e["scalar"]["f32"], e["index"]["i64"], "sum", 0, 1, 40,
                                      0, 0)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert all(i["ok"] for i in infos), [i["error"] for i in infos]
        compiled = sum(i["compile_ms"] > 0 for i in infos)
        assert len({i["library_path"] for i in infos}) == 1
        print("compiled", compiled)
    """, tmp_path)
    assert "compiled 1" in out.split("\n")
