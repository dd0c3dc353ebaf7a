"""Prediction: a held-out budget predicted before it trains (`predict`), and the calibrated predictor
of any run with its backtests (`calibrate`)."""

from scaling._lazy import exports

_NAMES = {m: m for m in ("predict", "calibrate")}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
