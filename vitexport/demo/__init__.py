"""The bundled demo: a small ViT trained on scikit-learn's handwritten digits (offline data).

Model code, weights and both data splits ship inside the package (package data), so an installed
vitexport runs the demo from any folder; ``make demo-model`` (``scripts/make_demo.py``) regenerates
the weights and splits deterministically.
"""
from pathlib import Path

__all__ = ["DEMO_DIR", "DEMO_MODEL_URI", "DEMO_WEIGHTS", "DEMO_CALIB", "DEMO_HELDOUT"]

DEMO_DIR = Path(__file__).resolve().parent
DEMO_MODEL_URI = f"python:{DEMO_DIR / 'model.py'}:build_demo_vit"
DEMO_WEIGHTS = DEMO_DIR / "demo_vit.safetensors"
#: 200 digits, no labels (calibration needs none)
DEMO_CALIB = DEMO_DIR / "calib.npz"
#: 400 digits with labels ``y``: the parity / accuracy split
DEMO_HELDOUT = DEMO_DIR / "heldout.npz"
