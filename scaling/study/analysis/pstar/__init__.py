"""P*: a fitted law's compute-optimal (N, D, P) and its profile over the formats chips run, and the
one check of whether a fit has an optimum at all."""

from scaling._lazy import exports

_NAMES = {m: m for m in ("optimal", "profile", "optimum_check")}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
