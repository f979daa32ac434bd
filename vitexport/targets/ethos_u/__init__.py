"""Arm Ethos-U (U85, U55): Vela, with LiteRT's quantizer or ExecuTorch's Arm backend, in a venv of their own
(``make setup-ethos``).

- :mod:`.target`: the ``ethos-u85`` and ``ethos-u55`` targets (recipes ``ethos-u85.yaml``, ``ethos-u55.yaml``);
- :mod:`.stages`: ``build_engine`` (``model.tflite`` or ``model.pte``, Vela's estimates, the NPU-share and
  memory gates) and ``simulate`` (the integer program on the LiteRT interpreter or the TOSA reference model);
- :mod:`.tflite_lower`: the tflite route's lowering of vitexport's FP32 ONNX to TFLite ops;
- :mod:`.client`: the worker's client (request, timeout, one-line failures);
- :mod:`.worker`, :mod:`.tflite_worker`: run by ``.venv-ethos``'s interpreter, never imported by vitexport.
"""
from .target import EthosU55Target, EthosU85Target

__all__ = ["EthosU85Target", "EthosU55Target"]
