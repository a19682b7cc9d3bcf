"""The CUDA code generation has the CPU side's shape (docs/ARCHITECTURE.md, "Adding an op
family"): ``codegen/cuda_spec.h`` holds only the common base (dtype, index type, block) and each
family's spec lives in its own ``codegen/cuda_<family>.h`` / ``cuda_spec_<family>.cpp`` with its
own fields, planner and variants; no CUDA codegen file switches on the op kind (a per-family
type answers instead), and every family's variants reach ``enumerate_cuda_variants()``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CODEGEN = ROOT / "codegen"
# (header, source, variant function) of each CUDA family.
FAMILIES = {
    "spmm": ("cuda_spmm.h", "cuda_spec_spmm.cpp", "append_spmm_variants"),
    "attention": ("cuda_attention.h", "cuda_spec_attention.cpp", "append_attention_variants"),
    "point_conv": ("cuda_point_conv.h", "cuda_spec_point_conv.cpp", "append_point_conv_variants"),
    "filter_conv": ("cuda_filter_conv.h", "cuda_spec_filter_conv.cpp",
                    "append_filter_conv_variants"),
}


def _cuda_codegen_files():
    return sorted(p for p in CODEGEN.iterdir() if p.name.startswith("cuda_"))


def test_no_cuda_codegen_file_switches_on_the_op_kind():
    pattern = re.compile(r"case\s+(CudaOp|OpKind)::|switch\s*\(\s*(s\.)?op\b|\bop\s*==\s*(CudaOp|OpKind)::")
    offenders = []
    for p in _cuda_codegen_files():
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{p.name}:{n}: {line.strip()}")
    assert offenders == [], "a per-family spec type should answer instead:\n" + "\n".join(offenders)


def test_the_base_holds_only_the_common_fields():
    text = (CODEGEN / "cuda_spec.h").read_text()
    body = text[text.index("class CudaKernelSpecBase"):]
    body = body[:body.index("\n};")]
    fields = re.findall(r"^\s+(?:[\w:]+)\s+(\w+)\s*=\s*[^;]+;", body, re.M)
    assert sorted(fields) == ["block", "dtype", "index"], fields


def test_each_family_has_its_spec_file_and_its_variants_are_listed():
    base = (CODEGEN / "cuda_spec.cpp").read_text()
    for family, (header, source, variants) in FAMILIES.items():
        h = (CODEGEN / header).read_text()
        assert re.search(r"struct Cuda\w+Spec final : CudaKernelSpecBase", h), header
        assert f"void {variants}(" in h, (header, variants)
        assert f"void {variants}(" in (CODEGEN / source).read_text(), (source, variants)
        assert f"{variants}(&out)" in base, f"enumerate_cuda_variants() misses {family}"
