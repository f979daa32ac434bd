"""Train the bench's photo MobileViT-XXS (``bench/arch.py:photo_mobilevit``): timm's ``mobilevit_xxs`` at 64×64,
10 classes, on crops of bundled photos (:mod:`_train_hybrid` has the data and the recipe)."""
from __future__ import annotations

from _train_hybrid import main

if __name__ == "__main__":
    main("photo_mobilevit")
