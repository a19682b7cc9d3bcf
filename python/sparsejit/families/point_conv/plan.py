"""Reading a point-cloud plan: every word position comes from the C++ owner of the layout
(``csrc/point_conv/plan_layout.h`` through ``_core``), none is restated here."""

from __future__ import annotations

from typing import Tuple

import torch

from sparsejit import _core

_LAYOUT = _core.plan_layout()
_WORDS = _LAYOUT["words"]
_OP = _LAYOUT["ops"]["point_conv"]
_K = _LAYOUT["point_conv"]["kernel_volume"]
_FIXED = _LAYOUT["point_conv"]["fixed_words"]
KINDS = ("subm", "spconv", "coarse", "transposed", "generalized")


def is_point_conv_plan(t) -> bool:
    """True for a (CPU or CUDA, not meta) int64 tensor that carries a point-cloud plan header."""
    return (isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.dim() == 1 and
            t.numel() > _FIXED and not t.is_meta and int(t[_WORDS["op"]]) == _OP)


def plan_info(plan: torch.Tensor) -> dict:
    """Sizes stored in a conv plan: kernel volume, pairs, input and output sites."""
    w = plan[:_FIXED].tolist()
    return {"kind": KINDS[w[_WORDS["kernel"]]], "kernel_volume": w[_K],
            "pairs": w[_WORDS["nnz"]], "num_in": w[_WORDS["cols"]], "num_out": w[_WORDS["rows"]],
            "identity_offset": w[_WORDS["param"]]}


def _array(plan: torch.Tensor, view: dict, name: str) -> torch.Tensor:
    at, dtype, n = view[name]
    if dtype == "int64":
        return plan[at:at + n]
    return plan[at:at + (n + 1) // 2].view(torch.int32)[:n]


def plan_pairs(plan: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel map of a plan as ``(offset_ptr [K + 1], in_idx [M], out_idx [M])``
    (int64 copies; for inspection, tests and pooling)."""
    info = plan_info(plan)
    view = _core.point_conv_plan_view(info["kernel_volume"], info["pairs"], info["num_in"],
                                      info["num_out"])
    return (_array(plan, view, "group_ptr").clone(), _array(plan, view, "in_idx").long(),
            _array(plan, view, "out_idx").long())


def plan_head(plan: torch.Tensor) -> torch.Tensor:
    """The header, K and the pairs per kernel offset (``group_ptr``): O(K) words that identify
    a kernel map for the tuner's store."""
    k = int(plan[_K])
    return plan[:_FIXED + k + 1]
