"""Numerics: number formats (ExMy, INT-k; nearest and stochastic rounding), scaled fake-quantisation
with its telemetry, the precision recipe (one QuantSpec per tensor role) and the quantised GEMMs.
Knows nothing of models or training."""

from scaling._lazy import exports

_NAMES = {
    "formats": "formats", "quant": "quant", "precision": "precision", "gemm": "gemm",
    "Format": "formats", "round_to_format": "formats",
    "QuantSpec": "quant", "fake_quant": "quant", "telemetry": "quant",
    "Recipe": "precision", "PRESETS": "precision",
    "qdot": "gemm",
}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
