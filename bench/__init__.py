"""``make bench``: vitexport against the plain ``torch.onnx.export`` + ``quantize_static`` path.

Every measurement runs in its own child process (``python -m bench.worker``) so that peak memory is
that measurement's alone and a plain-path calibration that runs away is killed instead of taking the
machine down. ``bench.run`` orchestrates, ``bench.report`` renders ``bench/results.md``.
"""
__all__: list[str] = []
