"""Arm Ethos-U (U85, U55): ExecuTorch's Arm backend and Vela in a venv of their own (``make setup-ethos``).

- :mod:`.target`: the ``ethos-u85`` and ``ethos-u55`` targets (recipes ``ethos-u85.yaml``, ``ethos-u55.yaml``);
- :mod:`.stages`: ``build_engine`` (``model.pte``, Vela's estimates, the NPU-share and memory gates) and
  ``simulate`` (the INT8 program on the TOSA reference model);
- :mod:`.client`: the worker's client (request, timeout, one-line failures);
- :mod:`.worker`: run by ``.venv-ethos``'s interpreter, never imported by vitexport.
"""
from .target import EthosU55Target, EthosU85Target

__all__ = ["EthosU85Target", "EthosU55Target"]
