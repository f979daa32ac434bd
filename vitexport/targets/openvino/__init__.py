"""OpenVINO: the ``openvino`` target and its IR stage (:mod:`.target`), the CPU plugin's runner and IR
writer (:mod:`.runner`; ``openvino`` imported on first use)."""
from . import target  # noqa: F401  - registers the target

__all__: list[str] = []
