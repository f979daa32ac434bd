"""Targets as plug-ins: one module per place an artifact runs, found through a registry, and one folder
per vendor backend holding everything that names it.

:class:`Target` (:mod:`._base`) is the API a target module implements; :mod:`._registry` holds the
registered targets (``@register_target``; third-party packages through the ``vitexport.targets``
entry-point group) and resolves ``--target NAME`` to the target's default recipe. The targets
vitexport ships, each a module with its default recipe beside it:

- ``npu`` (:mod:`.npu`): a generic edge NPU, per-tensor INT8, no float16 (a paper contract);
- ``cpu`` (:mod:`.cpu`): x86 through ONNX Runtime's integer kernels;
- :mod:`.tensorrt`: ``orin`` (Jetson Orin, TensorRT 10, JetPack 6.1+, strongly typed Q/DQ) and ``orin-jp5``
  (TensorRT 8.5 / 8.6, JetPack 5 / 6.0), with TensorRT's parser op lists, Q/DQ rules, engine stage,
  runner and calibration cache;
- :mod:`.rknn`: ``rk3588`` (Rockchip RK3588's NPU, ``model.rknn`` compiled by rknn-toolkit2 in its worker
  and gated on its x86 simulator), with the worker's client, RKNN's graph forms, INT8 layout and routes;
- :mod:`.ethos_u`: ``ethos-u85``, ``ethos-u55`` (Arm Ethos-U, ``model.pte`` by ExecuTorch's Arm backend and
  Vela in their worker, gated on the TOSA reference model);
- :mod:`.openvino`: ``openvino`` (OpenVINO IR, gated on OpenVINO's CPU plugin; the same IR is what
  Intel's NPU plugin compiles), with its runner.

A vendor's name appears in code only inside its folder here (``tests/test_architecture.py``).
"""
from . import cpu, ethos_u, npu, openvino, rknn, tensorrt  # noqa: F401  - each module registers its target(s)
from ._base import Target, TargetOptions
from ._registry import (
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
