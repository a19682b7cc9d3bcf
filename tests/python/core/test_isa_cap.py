"""SPARSEJIT_MAX_ISA: the cap reaches the JIT's -march, the ahead-of-time copies and every
feature check, and each family computes under avx2 and baseline what it computes uncapped.

This machine's CI otherwise only ever runs the JIT variants of its own CPU: under the cap it
also runs the AVX2 variants (8-lane rows, no AVX512-BF16 products) and the baseline copies
an AVX2 or older CPU runs. Each tier runs in its own process (the cap is read once)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from sparsejit import _core

# Computes every family's outputs (and gradients) on seeded inputs sized past the JIT's
# thresholds, and saves them; the test compares the tiers' files.
_WORKER = textwrap.dedent(r"""
    import sys, torch
    import sparsejit as sj
    from sparsejit import _core
    torch.manual_seed(0)
    torch.set_num_threads(2)
    out = {"isa": _core.isa_state(), "command": _core.compiler_command()}

    def grads(name, y, *xs):
        out[name] = y.detach().clone()
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=y.dtype)
        y.backward(g)
        for i, x in enumerate(xs):
            out[f"{name}.grad{i}"] = x.grad.detach().clone()

    n, e = 3000, 40000
    src = (torch.rand(e) ** 3 * n).long()          # skewed: a few hub sources
    dst = torch.randint(0, n, (e,))
    ei = torch.stack([src, dst])
    A = sj.SparseMatrix.from_edge_index(ei, n)
    for F in (64, 20):
        for red in ("sum", "mean", "max"):
            X = torch.randn(n, F, requires_grad=True)
            grads(f"spmm.{red}.{F}", sj.spmm(A, X, reduce=red), X)
    Q, K = torch.randn(n, 32), torch.randn(n, 32)
    S = sj.sddmm(A, Q, K)
    out["sddmm"], out["edge_softmax"] = S, sj.edge_softmax(A, S)
    Qh, Kh = torch.randn(n, 2, 16, requires_grad=True), torch.randn(n, 2, 16, requires_grad=True)
    Vh = torch.randn(n, 2, 16, requires_grad=True)
    grads("attention", sj.sparse_attention(A, Qh, Kh, Vh), Qh, Kh, Vh)

    R = 8
    T = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=torch.randint(0, R, (e,)),
                                            num_relations=R)
    for f_in, f_out in ((16, 16), (64, 32)):
        X = torch.randn(n, f_in, requires_grad=True)
        W = torch.randn(R, f_in, f_out, requires_grad=True)
        grads(f"rgms.{f_in}.{f_out}", sj.rgms(T, X, W, reduce="mean"), X, W)
        out[f"rgms.bf16.{f_in}.{f_out}"] = sj.rgms(
            T, X.detach().bfloat16(), W.detach().bfloat16(), reduce="mean").float()

    import sparsejit.spconv as spconv
    coords = torch.unique(torch.randint(0, 24, (4000, 3)), dim=0)
    coords = torch.cat([torch.zeros(len(coords), 1, dtype=torch.long), coords], 1).int()
    for c in (16, 64):
        torch.manual_seed(2)
        net = spconv.SparseSequential(spconv.SubMConv3d(4, c, 3, indice_key="s1"),
                                      spconv.SparseConv3d(c, c, 3, stride=2))
        feats = torch.randn(len(coords), 4, requires_grad=True)
        y = net(spconv.SparseConvTensor(feats, coords, [24, 24, 24], batch_size=1))
        grads(f"spconv.{c}", y.features, feats, net[0].weight, net[1].weight)

    torch.manual_seed(3)
    for k, c_in, c_out in ((3, 64, 64), (1, 64, 256)):
        conv = torch.nn.Conv2d(c_in, c_out, k, padding=k // 2, bias=True)
        with torch.no_grad():
            w = conv.weight
            w[w.abs() < w.abs().flatten().quantile(0.9)] = 0
        layer = sj.nn.PrunedConv2d.from_dense(conv.eval())
        with torch.no_grad():
            out[f"filter_conv.{k}"] = layer(torch.randn(3, c_in, 28, 28))
    torch.save(out, sys.argv[1])
""")


def _run_tier(tmp_path, isa, cache):
    path = tmp_path / f"{isa}.pt"
    env = dict(os.environ, SPARSEJIT_MAX_ISA=isa, SPARSEJIT_CACHE_DIR=str(cache),
               OMP_NUM_THREADS="2")
    env.pop("SPARSEJIT_JIT", None)
    r = subprocess.run([sys.executable, "-c", _WORKER, str(path)], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, f"SPARSEJIT_MAX_ISA={isa}: {r.stderr[-3000:]}"
    return torch.load(path)


def _close(a, b, rtol):
    """Max error relative to the reference's scale (sums reordered by vector width)."""
    err = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    return err <= rtol * max(b.double().abs().max().item() if b.numel() else 0.0, 1.0)


def _jit_objects(cache):
    return [os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if f.endswith(".so")]


def _uses_zmm(lib):
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", lib], capture_output=True,
                         text=True).stdout
    return "%zmm" in dis


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine != "x86_64",
                    reason="x86-64 tiers")
@pytest.mark.skipif(not _core.isa_state()["avx2_fma"], reason="the host has no AVX2 tier")
@pytest.mark.slow  # every family JIT-compiled three times, on three cold caches
def test_every_family_computes_the_same_under_the_avx2_and_baseline_caps(tmp_path):
    assert _core.jit_enabled(), "the JIT must be on for the tiers' kernels to differ"
    native = _run_tier(tmp_path, "native", tmp_path / "cache_native")
    results = {isa: _run_tier(tmp_path, isa, tmp_path / f"cache_{isa}")
               for isa in ("avx2", "baseline")}
    assert native["isa"]["cap"] == "native"
    assert results["avx2"]["isa"] == {"cap": "avx2", "tier": "avx2", "avx2_fma": True,
                                      "avx512_bf16": False, "bf16_dot": False, "amx": False}
    assert results["baseline"]["isa"]["tier"] == "baseline"
    assert not results["baseline"]["isa"]["avx2_fma"]
    assert "-march=x86-64-v3" in results["avx2"]["command"]
    assert "-march=x86-64 " in results["baseline"]["command"]
    keys = [k for k in native if k not in ("isa", "command")]
    assert len(keys) >= 30
    for isa, res in results.items():
        assert set(res) == set(native), isa
        for k in keys:
            a, b = res[k], native[k]
            assert a.shape == b.shape and a.dtype == b.dtype, (isa, k)
            assert torch.isfinite(a).all(), (isa, k)
            # bfloat16 RGMS rounds its reduced rows where the CPU has AVX512-BF16 products
            # (uncapped here) and multiplies in float32 under the caps
            assert _close(a, b, 2e-2 if ".bf16." in k else 1e-4), (isa, k)
    # the JIT compiled under each cap: avx2's objects hold no 512-bit register; the host's own
    # (AVX-512 here) do
    if shutil.which("objdump"):
        objs = _jit_objects(tmp_path / "cache_avx2")
        assert objs, "nothing was JIT-compiled under the avx2 cap"
        assert not any(_uses_zmm(o) for o in objs)
        assert _jit_objects(tmp_path / "cache_baseline")
        if "avx512f" in open("/proc/cpuinfo").read():
            assert any(_uses_zmm(o) for o in _jit_objects(tmp_path / "cache_native"))


def test_an_unknown_cap_is_named_and_ignored():
    env = dict(os.environ, SPARSEJIT_MAX_ISA="avx9")
    r = subprocess.run([sys.executable, "-c",
                        "from sparsejit import _core; print(_core.isa_state()['cap'])"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "native"
    assert "SPARSEJIT_MAX_ISA='avx9'" in r.stderr and "avx2" in r.stderr


def test_the_cap_shows_in_the_cpu_line_and_the_tuning_key():
    code = ("import sparsejit.info as i; from sparsejit.runtime.cpu import cpu_model; "
            "print(i.cpu_line()); print(cpu_model())")
    capped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, SPARSEJIT_MAX_ISA="avx2"), timeout=300)
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items()
                                if k != "SPARSEJIT_MAX_ISA"}, timeout=300)
    assert capped.returncode == 0 and plain.returncode == 0, capped.stderr + plain.stderr
    line, key = capped.stdout.splitlines()
    assert line.endswith("sparsejit capped at SPARSEJIT_MAX_ISA=avx2")
    assert key.endswith("[SPARSEJIT_MAX_ISA=avx2]")
    assert "capped" not in plain.stdout and "SPARSEJIT_MAX_ISA" not in plain.stdout
