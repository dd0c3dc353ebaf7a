"""Numerics: number formats (ExMy, INT-k; nearest and stochastic rounding), scaled fake-quantisation
with its telemetry, the precision recipe (one QuantSpec per tensor role), the Hadamard rotations some
recipes apply before quantising, the quantised GEMMs, and the layers that put any Flax NNX model under
a recipe (QDense, qdot, value_and_grad). Knows nothing of training runs or of the project's transformer."""

from scaling._lazy import exports

_NAMES = {
    "formats": "formats", "quant": "quant", "precision": "precision", "gemm": "gemm", "layers": "layers", "transforms": "transforms",
    "Format": "formats", "round_to_format": "formats",
    "QuantSpec": "quant", "fake_quant": "quant", "telemetry": "quant",
    "Recipe": "precision", "PRESETS": "precision",
    "QDense": "layers", "qdot": "layers", "value_and_grad": "layers", "telemetry_by_layer": "layers",
}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
