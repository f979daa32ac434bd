"""Tiny hand-written ONNX graphs for the checker's tests (onnx.helper, no export)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
