"""Atomic file writes: a reader never sees a half-written file, a crash leaves the old one or none."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one JSON line and fsync; a torn last line (crash mid-append) is skipped by read_jsonl."""
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True, default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # torn final line from a crash
    return records


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy / jax scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def check_writable_dir(key: str, path: str | os.PathLike) -> None:
    """Refuse, before any work, a directory that cannot be written or made: the nearest existing ancestor
    must be a directory this process may write (ConfigError naming the option and the path), so a verb
    never fails with an OSError traceback after its work (a file's directory: pass its parent)."""
    from scaling.errors import ConfigError

    path = Path(path)
    probe = path.absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(key, str(path), f"a directory that can be made ({probe} is a file)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(key, str(path), f"a directory this user can write ({probe} is not writable)")
