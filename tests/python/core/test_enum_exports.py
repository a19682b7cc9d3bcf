"""The enums Python passes to the ops come from ``_core.enums()`` (kernels/common/enums.h and the
families' argument enums), not numbers copied into Python; stored numbers never move."""

from sparsejit import _core
from sparsejit.families.point_conv import schedules as point_conv_schedules
from sparsejit.families.rgms import ops as rgms_ops
from sparsejit.families.rgms import schedules as rgms_schedules
from sparsejit.families.rgms import tuner as rgms_tuner


def test_op_kinds_keep_their_numbers_and_11_stays_retired():
    # Plans and kernel caches store these numbers: a value never moves or is reused.
    assert _core.enums()["op"] == {
        "spmm": 1, "sddmm": 2, "rgms": 3, "point_conv": 4, "filter_conv": 5, "attention": 6,
        "edge_softmax": 7, "edge_softmax_backward": 8, "attention_backward": 9,
        "point_conv_map": 10, "point_conv_implicit": 12}


def test_rgms_arguments_by_name():
    e = _core.enums()
    assert e["rgms_strategy"] == {"auto": 0, "aggregate_first": 1, "transform_first": 2}
    assert e["rgms_gemm"] == {"auto": 0, "onednn": 1, "builtin": 2, "fused": 3}
    assert rgms_ops._STRATEGIES == e["rgms_strategy"]
    assert rgms_tuner.KERNELS is rgms_schedules.KERNELS
    assert rgms_schedules.KERNELS == {"tiles": e["rgms_gemm"]["auto"],
                                      "fused": e["rgms_gemm"]["fused"]}


def test_point_conv_stored_choices_by_name():
    e = _core.enums()
    assert e["point_conv_dataflow"] == {"auto": 0, "gather_gemm_scatter": 1,
                                        "output_stationary": 2}
    assert e["point_conv_wgrad"] == {"auto": 0, "registers": 1, "gemm": 2}
    assert point_conv_schedules.DATAFLOW_NAMES == {1: "gather_gemm_scatter",
                                                   2: "output_stationary"}
    assert point_conv_schedules.WGRAD_NAMES == {1: "registers", 2: "gemm"}
