"""scaling: precision-aware scaling-law research toolkit.

Submodules are imported on use (`from scaling import formats, quant, fit, optimal, plan`),
so light verbs such as `scaling plan` never pay for importing JAX.
"""

__version__ = "0.1.0"
