"""Targets as plug-ins: one module per place an artifact runs, found through a registry.

:class:`Target` (:mod:`.base`) is the API a target module implements; :mod:`.registry` holds the
registered targets (``@register_target``; third-party packages through the ``vitexport.targets``
entry-point group) and resolves ``--target NAME`` to the target's default recipe. The targets
vitexport ships, each a module with its default recipe beside it:

- ``orin`` (:mod:`.orin`): Jetson Orin, TensorRT 10 (JetPack 6.1+), strongly typed Q/DQ;
- ``orin-jp5`` (:mod:`.orin_jp5`): Jetson Orin, TensorRT 8.5 / 8.6 (JetPack 5 / 6.0);
- ``npu`` (:mod:`.npu`): a generic edge NPU, per-tensor INT8, no float16;
- ``cpu`` (:mod:`.cpu`): x86 through ONNX Runtime's integer kernels;
- ``rk3588`` (:mod:`.rk3588`): Rockchip RK3588's NPU, ``model.rknn`` compiled by rknn-toolkit2 and gated on
  its x86 simulator (:mod:`.rknn_stages`);
- ``ethos-u85``, ``ethos-u55`` (:mod:`.ethos_u`): Arm Ethos-U, ``model.pte`` by ExecuTorch's Arm backend and
  Vela, gated on the TOSA reference model;
- ``openvino`` (:mod:`.openvino`): OpenVINO IR, gated on OpenVINO's CPU plugin (the same IR is what
  Intel's NPU plugin compiles).

TensorRT's parts shared by both orin targets: :mod:`.tensorrt_ops` (parser operator lists),
:mod:`.tensorrt_rules` (Q/DQ rules), :mod:`.tensorrt_engine` (``build_engine.sh``, the engine stage).
"""
from . import cpu, ethos_u, npu, openvino, orin, orin_jp5, rk3588  # noqa: F401  - each module registers its target
from .base import Target, TargetOptions
from .registry import (
    DEFAULT_TARGET,
    ENTRY_POINT_GROUP,
    build_target,
    load_recipe,
    load_target,
    recipe_file,
    register_target,
    registered_targets,
    target_class,
)

__all__ = [
    "Target",
    "TargetOptions",
    "register_target",
    "registered_targets",
    "target_class",
    "build_target",
    "recipe_file",
    "load_recipe",
    "load_target",
    "DEFAULT_TARGET",
    "ENTRY_POINT_GROUP",
]
