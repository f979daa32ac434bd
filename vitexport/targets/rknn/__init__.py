"""Rockchip RKNN: the ``rk3588`` target (:mod:`.rk3588`) and its stages (:mod:`.stages`), rknn-toolkit2's
worker (:mod:`.worker`, run in its own venv, ``requirements.txt``) and its client
(:mod:`.client`), RKNN's op-table parser (:mod:`.log`), and the ONNX layouts its compiler takes
(:mod:`.graph`, :mod:`.qdq`, :mod:`.outliers`, :mod:`.routes`)."""
from . import rk3588  # noqa: F401  - registers the target
from .client import RknnQuantization, RknnRequest, RknnResult, require_rknn, rknn_available, rknn_missing, run_rknn
from .log import OpRow, OpSummary, op_summary, parse_op_table

__all__ = ["RknnRequest", "RknnQuantization", "RknnResult", "run_rknn", "require_rknn", "rknn_available",
           "rknn_missing", "OpRow", "OpSummary", "op_summary", "parse_op_table"]
