"""The bundled demo: a small ViT trained on scikit-learn's handwritten digits (offline data)."""
from pathlib import Path

__all__ = ["DEMO_DIR", "DEMO_MODEL_URI", "DEMO_WEIGHTS", "DEMO_CALIB", "DEMO_HELDOUT"]

DEMO_DIR = Path(__file__).resolve().parent
_REPO = DEMO_DIR.parents[1]
DEMO_MODEL_URI = f"python:{DEMO_DIR / 'model.py'}:build_demo_vit"
DEMO_WEIGHTS = DEMO_DIR / "demo_vit.safetensors"
DEMO_CALIB = _REPO / "calibration" / "demo" / "calib.npz"
DEMO_HELDOUT = _REPO / "calibration" / "demo" / "heldout.npz"
