"""Train the bench's photo EfficientViT-B0 (``bench/arch.py:photo_effvit``): timm's ``efficientvit_b0`` (MIT) at
64×64, 10 classes, on crops of bundled photos (:mod:`_train_hybrid` has the data and the recipe)."""
from __future__ import annotations

from _train_hybrid import main

if __name__ == "__main__":
    main("photo_effvit")
