"""Prediction: a held-out budget predicted before it trains (`predict`); backtests along compute and N
(`backtest`), the predictors they score with proper scores (`scores`, `calibrate`) and any rows
predicted by the winner (`table`)."""

from scaling._lazy import exports

_NAMES = {m: m for m in ("predict", "calibrate", "backtest", "scores", "table")}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
