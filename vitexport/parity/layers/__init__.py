"""Per-layer localisation: which block did the numbers leave the budget in?

Torch side: forward hooks on the module(s) that make up the network's repeated blocks (timm
``blocks.3``, Hugging Face ``encoder.layer.3``, torchvision ``encoder.layers.encoder_layer_3``).
ONNX side: the output of the last node in the module's scope (see :mod:`.onnx_graph`), exposed as an
extra graph output; when the graph has no scopes (some dynamo exports) the tensor is found by value
against the torch reference. ONNX-vs-ONNX matches the same module scopes in both files (QDQ models
keep the node scopes even when tensor names change), or residual Adds by tensor name.

Each layer gets cosine (per sample), SNR and max error, plain and channel-standardized, and the
noise it adds over the previous layer; the first layer outside the budget is the
``first_divergence``, the layers that add the most noise are flagged as the worst.
"""
from .drivers import localize_layers, localize_onnx
from .mapping import map_layers_to_onnx
from .probes import LayerProbe, OnnxLayerProbe, TorchLayerProbe, block_names, make_torch_probe
from .stats import LayerBudget, LayerReport, LayerResult, compare_layers

__all__ = [
    "LayerBudget",
    "LayerResult",
    "LayerReport",
    "LayerProbe",
    "TorchLayerProbe",
    "OnnxLayerProbe",
    "block_names",
    "map_layers_to_onnx",
    "compare_layers",
    "localize_layers",
    "localize_onnx",
    "make_torch_probe",
]
