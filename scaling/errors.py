"""The one error users see for bad input: a single line naming key, value and what is allowed; an
exception in a user's own Python becomes one too (UserCodeError: the file and line, the exception)."""

from __future__ import annotations

import contextlib
import os
import traceback
from typing import Any, Iterable, Iterator


class ConfigError(ValueError):
    """Bad user input. `scaling` CLI verbs print `error: <message>` and exit with code 2."""

    def __init__(self, key: str, value: Any, allowed: str | Iterable[Any]):
        if not isinstance(allowed, str):
            allowed = "one of " + ", ".join(str(a) for a in allowed)
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}: got {value!r}; allowed: {allowed}")


class UserCodeError(ConfigError):
    """An exception raised in a user's own Python (a `--sections` file, a registered architecture's
    function): one line naming the key, the file and line it was raised at, and the exception."""

    def __init__(self, key: str, where: str | None, error: BaseException):
        what = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}".rstrip(": ")
        if isinstance(error, SyntaxError):
            what = f"SyntaxError: {error.msg}"
        self.key, self.value, self.allowed, self.error = key, where, "code that runs", error
        ValueError.__init__(self, f"{key}: {where}: {what}" if where else f"{key}: {what}")


def where_raised(error: BaseException, file: str | os.PathLike | None = None) -> str | None:
    """'file:line' of the deepest frame of error's traceback in `file` (where it never entered `file`, or
    no file is given: the deepest frame outside the import machinery), or a syntax error's own position."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}:{error.lineno}"
    frames = [f for f in traceback.extract_tb(error.__traceback__)  # the import machinery's are nobody's code
              if not f.filename.startswith("<") and "importlib" not in f.filename.split(os.sep)]
    if file is not None:
        target = os.path.realpath(file)
        frames = [f for f in frames if os.path.realpath(f.filename) == target] or frames
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


@contextlib.contextmanager
def user_code(key: str, file: str | os.PathLike | None = None) -> Iterator[None]:
    """Run a user's own code: an exception it raises becomes a UserCodeError (one line: where and what);
    our ConfigError passes as it is (already one line), as do KeyboardInterrupt and SystemExit."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as e:
        raise UserCodeError(key, where_raised(e, file), e) from e
