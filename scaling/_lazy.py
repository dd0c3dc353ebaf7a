"""Lazy package exports: a package names each public value and the submodule that defines it, and
the submodule is imported on first use (PEP 562), so `import scaling.plan` costs no JAX and no
package pays for the parts a caller does not touch."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def exports(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """The module-level `__getattr__` for `package`: names[name] is the submodule (relative to
    `package`, or absolute when it starts with 'scaling.') whose attribute `name` is exported."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        where = names[name]
        module = importlib.import_module(where if where.startswith("scaling.") else f"{package}.{where}")
        return module if module.__name__.rsplit(".", 1)[-1] == name else getattr(module, name)

    return __getattr__
