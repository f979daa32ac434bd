"""TensorRT (Jetson Orin): the ``orin`` and ``orin-jp5`` targets (:mod:`.orin`, :mod:`.orin_jp5`), TensorRT's
parser operator lists (:mod:`.ops`), its Q/DQ rules (:mod:`.rules`), ``build_engine.sh`` and the engine
stage (:mod:`.engine`), the Polygraphy runner (:mod:`.runner`; ``tensorrt`` / ``polygraphy`` imported only
inside it)."""
from . import orin, orin_jp5  # noqa: F401  - each module registers its target

__all__: list[str] = []
