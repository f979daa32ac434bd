"""RKNN's op table read back: each GEMM/Conv row's multiply-accumulates as the source model's layer
counts them (vitexport.graph.macs), whatever layout RKNN lists its weight in. The table is one RKNN
printed for rknn_models.qdq_convs (rknn-toolkit2 2.5.0, rk3588)."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from rknn_models import CONV_MACS, qdq_convs
from vitexport.targets.rknn.stages import cpu_conversions, rknn_share
from vitexport.targets.rknn.client import RknnResult, _rknn_groups
from vitexport.targets.rknn.log import op_summary, parse_op_table, with_groups

#: RKNN's table for qdq_convs: the depthwise weight listed as (1, 16, 3, 3), the grouped conv expanded
#: into a dense (16, 16, 3, 3) one named ``grouped#1``, the last conv left in float16
TABLE = r"""
D RKNN: [17:51:59.290]                                                         Network Layer Information Table
D RKNN: [17:51:59.290] --------------------------------------------------------------------------------------------------------------------------------------------------------------------------
D RKNN: [17:51:59.290] ID   OpType             DataType Target InputShape                               OutputShape            Cycles(DDR/NPU/Total)    RW(KB)       FullName
D RKNN: [17:51:59.290] --------------------------------------------------------------------------------------------------------------------------------------------------------------------------
D RKNN: [17:51:59.290] 0    InputOperator      INT8     CPU    \                                        (1,3,16,16)            0/0/0                    0            InputOperator:x
D RKNN: [17:51:59.290] 1    ConvRelu           INT8     NPU    (1,3,16,16),(16,3,4,4),(16)              (1,16,4,4)             228/256/256              5            Conv:patch
D RKNN: [17:51:59.290] 2    ConvRelu           INT8     NPU    (1,16,4,4),(1,16,3,3),(16)               (1,16,4,4)             50/144/144               0            Conv:depthwise
D RKNN: [17:51:59.290] 3    ConvRelu           INT8     NPU    (1,16,4,4),(16,16,3,3),(16)              (1,16,4,4)             130/144/144              2            Conv:grouped#1
D RKNN: [17:51:59.290] 4    exDataConvert      INT8     NPU    (1,16,4,4)                               (1,16,4,4)             0/0/0                    0            exDataConvert:pointwise_x_DQ
D RKNN: [17:51:59.290] 5    ConvRelu           FLOAT16  NPU    (1,16,4,4),(32,16,1,1),(32)              (1,32,4,4)             114/64/114               1            Conv:pointwise
D RKNN: [17:51:59.290] 6    OutputOperator     FLOAT16  CPU    (1,32,4,4)                               \                      0/0/0                    1            OutputOperator:y
D RKNN: [17:51:59.290] --------------------------------------------------------------------------------------------------------------------------------------------------------------------------
"""


def test_depthwise_and_grouped_rows_count_the_models_macs():
    rows = with_groups(parse_op_table(TABLE), {"depthwise": 16, "grouped": 4})
    macs = {r.source: r.macs for r in rows if r.is_gemm}
    assert macs == {name: v[-1] for name, v in CONV_MACS.items()}
    s = op_summary(rows)
    assert s.gemm_macs == sum(macs.values()) and s.int8_macs == s.gemm_macs - CONV_MACS["pointwise"][-1]


def test_a_depthwise_row_is_told_by_its_shape_alone():
    """Without the source's group counts the depthwise (1, C, k, k) row still counts k² per output
    (not C·k², 16-fold more); the expanded grouped conv counts as the dense conv RKNN computes."""
    macs = {r.source: r.macs for r in parse_op_table(TABLE) if r.is_gemm}
    assert macs["depthwise"] == CONV_MACS["depthwise"][-1]
    assert macs["grouped"] == 4 * CONV_MACS["grouped"][-1]


#: the row RKNN printed for FastViT's final_conv (a 3x3 conv in 384 groups, 384 → 768 channels, plus a
#: parallel 1x1 in 384 groups, summed): one dense-listed Conv named after the Add
FUSED_ROW = (r"D RKNN: [20:09:37.699] 212  Conv               FLOAT16  NPU    (1,384,2,2),(768,384,3,3),(768)          "
             r"(1,768,2,2)            224939/82944/224939      5190         Conv:/final_conv/Add_1_fused#1")


def test_parallel_grouped_branches_rknn_fuses_count_the_grouped_macs():
    """RKNN fuses FastViT's kxk + 1x1 branches and their Add into one conv listed dense (10.6 M MACs read
    as is); named ``<Add>_fused``, it takes the branches' group count: 768 x 1 x 3 x 3 x 4 = 27.6 k."""
    w3, w1 = np.zeros((768, 1, 3, 3), np.float32), np.zeros((768, 1, 1, 1), np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w3"], ["a"], group=384, pads=[1] * 4, name="/final_conv/conv_kxk"),
         helper.make_node("Conv", ["x", "w1"], ["b"], group=384, name="/final_conv/conv_scale"),
         helper.make_node("Add", ["a", "b"], ["y"], name="/final_conv/Add_1")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 384, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 768, 2, 2])],
        [numpy_helper.from_array(w3, "w3"), numpy_helper.from_array(w1, "w1")])
    groups = _rknn_groups(ir.serde.deserialize_model(helper.make_model(g)))
    assert groups["/final_conv/Add_1_fused"] == 384
    dense = parse_op_table("Network Layer Information Table\n" + FUSED_ROW)
    assert dense[0].macs == 768 * 384 * 9 * 4  # as listed: the overstatement
    (row,) = with_groups(dense, groups)
    assert row.macs == 768 * 9 * 4


def test_the_share_names_each_float_conv_with_the_layout_rule_that_left_it(tmp_path):
    """What the gate reads from RKNN's op table (no RKNN needed: a table it printed): a conv the layout
    left float is named with ConvsInFloat's reason, one the quantizer left float with the quantizer's."""
    compiled = tmp_path / "model.rknn.onnx"
    onnx.save(qdq_convs(), compiled)
    ops = with_groups(parse_op_table(TABLE), {"depthwise": 16, "grouped": 4})
    res = RknnResult(reply={}, outputs=[], ops=ops, summary=op_summary(ops), log=tmp_path / "rknn.log", wall_s=0.0)
    layout = {"skipped": {"pointwise": "rknn_convs_in_float took its Q/DQ off: no calibration range was measured"}}
    share = rknn_share(res, "qdq", layout, compiled, ["target_options.route=rknn"])
    (layer,) = share.float_layers
    assert (layer.name, layer.op, layer.macs) == ("Conv:pointwise", "ConvRelu", 4 * 4 * 32 * 16)
    assert layer.why.startswith("rknn_convs_in_float took its Q/DQ off")
    share = rknn_share(res, "qdq", {}, compiled, [])
    assert "yet RKNN chose float16" in share.float_layers[0].why  # Q/DQ'd in the file: RKNN's own choice


def test_the_conversions_rknn_placed_on_the_cpu_are_read_from_its_table(tmp_path):
    """EfficientFormerV2's downsampling attention with uint8 activations: RKNN converted the probabilities'
    QuantizeLinear on the CPU; the stage takes that Q/DQ off and compiles again (CpuQuantizesInFloat)."""
    row = ("D RKNN: [19:50:48.894] 99   exDataConvert      FLOAT16  CPU    (1,8,4,16)                               "
           "(1,8,4,16)             0/0/0                    1            exDataConvert:attn/Softmax_output_0_QuantizeLinear")
    table = TABLE.replace("D RKNN: [17:51:59.290] 5 ", row + "\nD RKNN: [17:51:59.290] 5 ", 1)
    ops = parse_op_table(table)
    res = RknnResult(reply={}, outputs=[], ops=ops, summary=op_summary(ops), log=tmp_path / "rknn.log", wall_s=0.0)
    assert cpu_conversions(res) == {"attn/Softmax_output_0_QuantizeLinear"}
    ops = parse_op_table(TABLE)  # its exDataConvert on the NPU: nothing to take off
    assert cpu_conversions(RknnResult(reply={}, outputs=[], ops=ops, summary=op_summary(ops), log=tmp_path / "l", wall_s=0.0)) == set()


def test_last_pass_names_the_code_generation_when_it_crashed_there(tmp_path):
    """rknn-toolkit2 2.5.0 on a SegFormer (issue 29) died in ``OpEmit`` after ``RKNNAllocateConvCachePass`` ended:
    the pass named must be the one that had started last, which has no ``rknn::`` prefix."""
    from vitexport.targets.rknn.log import last_pass

    log = tmp_path / "rknn.log"
    log.write_text("D RKNN: [23:49:47.733] >>>>>> start: rknn::RKNNAllocateConvCachePass\n"
                   "D RKNN: [23:49:47.733] <<<<<<<< end: rknn::RKNNAllocateConvCachePass\n"
                   "D RKNN: [23:49:47.733] >>>>>> start: OpEmit\n"
                   "D RKNN: [23:49:47.752] finish initComputeZoneMapByStepsVector\n")
    assert last_pass(log) == "OpEmit"
    log.write_text("D RKNN: [17:00:00.000] >>>>>> start: rknn::RKNNWeightTransposePass\n")
    assert last_pass(log) == "rknn::RKNNWeightTransposePass"
