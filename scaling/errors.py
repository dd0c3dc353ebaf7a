"""The one error users see for bad input: a single line naming key, value and what is allowed."""

from __future__ import annotations

from typing import Any, Iterable


class ConfigError(ValueError):
    """Bad user input. `scaling` CLI verbs print `error: <message>` and exit with code 2."""

    def __init__(self, key: str, value: Any, allowed: str | Iterable[Any]):
        if not isinstance(allowed, str):
            allowed = "one of " + ", ".join(str(a) for a in allowed)
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}: got {value!r}; allowed: {allowed}")
