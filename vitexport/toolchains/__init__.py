"""Vendor toolchains that live outside the project's venv, reached through worker processes
(:mod:`.rknn`: Rockchip's rknn-toolkit2), and the ONNX layouts their compilers take (:mod:`.rknn_graph`)."""
from .rknn import RknnQuantization, RknnRequest, RknnResult, require_rknn, rknn_available, rknn_missing, run_rknn
from .rknn_log import OpRow, OpSummary, op_summary, parse_op_table

__all__ = ["RknnRequest", "RknnQuantization", "RknnResult", "run_rknn", "require_rknn", "rknn_available",
           "rknn_missing", "OpRow", "OpSummary", "op_summary", "parse_op_table"]
