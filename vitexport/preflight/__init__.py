"""Checks made before any work, so that a run that cannot succeed fails in seconds with one line.

- :mod:`.outdir`: the output folder (writable, not ``/``, home or the package; stale temps removed).
- :mod:`.memory`: what the inputs, one forward, the histograms and the reference need, against the
  memory the machine has.
- :mod:`.model`: the model runs on the parity inputs, and gives the same outputs twice.
"""
from .memory import Need, available_memory, format_bytes, require
from .model import check_model, run_needs
from .outdir import check_output_folder

__all__ = ["Need", "available_memory", "format_bytes", "require", "check_output_folder", "check_model", "run_needs"]
