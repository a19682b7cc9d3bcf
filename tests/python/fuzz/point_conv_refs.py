"""Helpers of the point-cloud convolution fuzz cases (cases_point_conv.py): random clouds, a
plain Python kernel map (from the geometry formulas of csrc/point_conv/kernel_map.h, not from
the plan), float64 references, the plan's array layout (for corrupting one array at a time) and a
NaN-aware comparison."""

from __future__ import annotations

import itertools
from typing import Optional

import torch

from .refs import Rand, close

# Plan words (csrc/point_conv/plan_layout.h): the common header, then K, then the arrays.
WORD_OP, WORD_KERNEL, WORD_PARAM, WORD_ROWS, WORD_NNZ, WORD_COLS = 2, 3, 5, 6, 7, 8
WORD_K = 10
PLAN_ARRAYS = ("group_ptr", "in_idx", "out_idx", "out_row_ptr", "out_row_pair", "in_row_ptr",
               "in_row_pair", "pair_group")


def plan_arrays(plan: torch.Tensor) -> dict:
    """name -> (first word, entries, entry bits) of each array of a conv plan."""
    k, m = int(plan[WORD_K]), int(plan[WORD_NNZ])
    n_in, n_out = int(plan[WORD_COLS]), int(plan[WORD_ROWS])
    sizes = dict(group_ptr=(k + 1, 64), in_idx=(m, 32), out_idx=(m, 32),
                 out_row_ptr=(n_out + 1, 64), out_row_pair=(m, 32),
                 in_row_ptr=(n_in + 1, 64), in_row_pair=(m, 32), pair_group=(m, 32))
    at, out = WORD_K + 1, {}
    for name in PLAN_ARRAYS:
        n, bits = sizes[name]
        out[name] = (at, n, bits)
        at += n if bits == 64 else (n + 1) // 2
    return out


def set_plan_entry(plan: torch.Tensor, array: str, j: int, value: int) -> torch.Tensor:
    """A copy of `plan` with entry j of `array` set to `value` (int32 arrays: truncated)."""
    p = plan.clone()
    at, n, bits = plan_arrays(plan)[array]
    if bits == 64:
        p[at + j] = value
    else:
        p.view(torch.int32)[2 * at + j] = max(-2**31, min(2**31 - 1, value))
    return p


def get_plan_array(plan: torch.Tensor, array: str) -> torch.Tensor:
    at, n, bits = plan_arrays(plan)[array]
    if bits == 64:
        return plan[at:at + n].clone()
    return plan.view(torch.int32)[2 * at:2 * at + n].long()


def cloud(r: Rand, dims: int, shape, batch: int, n: int) -> torch.Tensor:
    """Up to n distinct random sites [N, 1 + dims] int32 (batch first), in random order."""
    sites = set()
    for _ in range(n):
        sites.add((r.randint(0, batch - 1),) + tuple(r.randint(0, s - 1) for s in shape))
    rows = list(sites)
    r.py.shuffle(rows)
    return torch.tensor(rows, dtype=torch.int32).reshape(len(rows), 1 + dims)


def _offsets(kernel):
    return list(itertools.product(*[range(k) for k in kernel]))  # axis 0 slowest


def reference_map(coords, kind, shape, kernel, stride, padding, dilation, out_coords=None):
    """(output sites as a list of tuples or None when they are the given ones, pairs
    [(in row, output site, offset)]) by the formulas, without the plan."""
    rows = [tuple(int(v) for v in row) for row in coords.tolist()]
    dims = len(shape)
    where = {site: i for i, site in enumerate(rows)}
    offs = _offsets(kernel)
    pairs = []
    if kind in ("subm", "generalized", "spconv", "coarse"):
        if kind == "subm":
            outs = rows
        elif kind == "generalized":
            outs = [tuple(int(v) for v in row) for row in out_coords.tolist()]
        elif kind == "coarse":
            outs = sorted({(s[0],) + tuple(s[1 + d] // stride[d] for d in range(dims))
                           for s in rows})
        else:
            oshape = [(shape[d] + 2 * padding[d] - dilation[d] * (kernel[d] - 1) - 1)
                      // stride[d] + 1 for d in range(dims)]
            cand = set()
            for s in rows:
                for e in offs:
                    o = []
                    for d in range(dims):
                        t = s[1 + d] - e[d] * dilation[d] + padding[d]
                        if t % stride[d] or not 0 <= t // stride[d] < oshape[d]:
                            break
                        o.append(t // stride[d])
                    else:
                        cand.add((s[0],) + tuple(o))
            outs = sorted(cand)
        for o in outs:
            for k, e in enumerate(offs):
                if kind == "subm":
                    site = tuple(o[1 + d] + (e[d] - (kernel[d] - 1) // 2) * dilation[d]
                                 for d in range(dims))
                else:
                    site = tuple(o[1 + d] * stride[d] + e[d] * dilation[d] - padding[d]
                                 for d in range(dims))
                i = where.get((o[0],) + site)
                if i is not None:
                    pairs.append((i, o, k))
        return outs, pairs
    assert kind == "transposed"
    oshape = [(shape[d] - 1) * stride[d] - 2 * padding[d] + dilation[d] * (kernel[d] - 1) + 1
              for d in range(dims)]
    outs = set()
    for i, s in enumerate(rows):
        for k, e in enumerate(offs):
            o = tuple(s[1 + d] * stride[d] + e[d] * dilation[d] - padding[d]
                      for d in range(dims))
            if all(0 <= o[d] < oshape[d] for d in range(dims)):
                outs.add((s[0],) + o)
                pairs.append((i, (s[0],) + o, k))
    return sorted(outs), pairs


def conv_ref(x, w, bias, pairs_rows, n_out, absolute=False):
    """float64 y [n_out, C_out] = bias + sum over (in row, out row, k) of x[in] @ w[k];
    differentiable in x and w (float64 inputs)."""
    xd, wd = x.double(), w.double()
    if absolute:
        xd, wd = xd.abs(), wd.abs()
    y = torch.zeros(n_out, w.shape[2], dtype=torch.float64)
    if pairs_rows:
        i = torch.tensor([p[0] for p in pairs_rows])
        o = torch.tensor([p[1] for p in pairs_rows])
        k = torch.tensor([p[2] for p in pairs_rows])
        msg = torch.bmm(xd[i].unsqueeze(1), wd[k]).squeeze(1)
        y = y.index_add(0, o, msg)
    if bias is not None:
        y = y + (bias.double().abs() if absolute else bias.double())
    return y


def close_nan(out, ref, mag, dtype, what="output") -> Optional[str]:
    """close() where the reference is finite; NaN / ±inf exactly where the reference has
    them (an IEEE sum is NaN or ±inf in any order once a term is)."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape):
        return close(out, ref, mag, dtype, what)
    o = out.detach().double()
    fin = torch.isfinite(ref)
    for name, a, b in (("NaN", o.isnan(), ref.isnan()), ("+inf", o == float("inf"),
                       ref == float("inf")), ("-inf", o == -float("inf"), ref == -float("inf"))):
        if not torch.equal(a, b):
            return f"{what}: {name} at {int(a.sum())} places, the reference at {int(b.sum())}"
    return close(out.detach().double().where(fin, 0.0).to(dtype), ref.where(fin, 0.0),
                 mag.where(fin, 0.0), dtype, what)


def rows_of(outs, plan_out_coords):
    """Reference pairs keyed by output site -> rows of the plan's output coordinates, or an
    error when the plan's output set differs from the reference's."""
    got = [tuple(row) for row in plan_out_coords.tolist()]
    if sorted(got) != sorted(outs) or len(set(got)) != len(got):
        return None, (f"output sites differ: plan has {len(got)} ({got[:4]}...), reference "
                      f"{len(outs)} ({list(outs)[:4]}...)")
    return {site: i for i, site in enumerate(got)}, None


def same_pairs(plan_a, plan_b) -> bool:
    from sparsejit.families.point_conv.ops import plan_pairs

    return all(torch.equal(x, y) for x, y in zip(plan_pairs(plan_a), plan_pairs(plan_b)))


def check_map(res, coords, kind, shape, geo, out_coords):
    """None when a plan's output sites and pairs are the reference kernel map's."""
    from sparsejit.families.point_conv.ops import plan_pairs

    plan, oc = res
    outs, pairs = reference_map(coords, kind, shape, geo["kernel"], geo["stride"],
                                geo["padding"], geo["dilation"], out_coords)
    rows, err = rows_of(outs, oc)
    if err:
        return err
    ptr, ins, ous = plan_pairs(plan)
    k_of = torch.repeat_interleave(torch.arange(ptr.numel() - 1), ptr.diff())
    got = sorted(zip(ins.tolist(), ous.tolist(), k_of.tolist()))
    want = sorted((i, rows[o], k) for i, o, k in pairs)
    return None if got == want else f"pairs differ: {len(got)} vs reference {len(want)}"
