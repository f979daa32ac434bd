"""vitexport: PyTorch Vision Transformer → parity-checked INT8 ONNX / TensorRT artifacts."""
__version__ = "0.1.0"
__all__ = ["__version__"]
