"""Reading a Hugging Face `config.json`: each value with the field it came from.

`Config.get("hidden_size")` returns the value and records the field as the figure's source;
`Config.need(...)` raises an `InputError` naming the field (or the alternatives looked for) when
it is absent, so an unknown architecture fails with the missing field, never a KeyError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipegen.common.errors import InputError

_MISSING = object()


@dataclass
class Config:
    """A parsed config.json and the file it came from (for messages and sources)."""

    data: dict[str, Any]
    file: str

    @classmethod
    def read(cls, path: Path) -> Config:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", file=str(path)) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"not JSON: {exc.msg}", file=str(path), line=exc.lineno) from None
        if not isinstance(data, dict):
            raise InputError("a config.json is a JSON object", file=str(path))
        return cls(data, str(path))

    def has(self, *names: str) -> bool:
        return any(self._lookup(n) is not _MISSING for n in names)

    def get(self, *names: str, default: Any = None) -> Any:
        """The first of `names` present (a dotted name reads a nested object), else `default`."""
        for name in names:
            value = self._lookup(name)
            if value is not _MISSING:
                return value
        return default

    def field(self, *names: str) -> str | None:
        """Which of `names` is present."""
        for name in names:
            if self._lookup(name) is not _MISSING:
                return name
        return None

    def need(self, *names: str, kind: type | tuple[type, ...] = int, what: str = "") -> Any:
        """The first of `names` present and of `kind`; an InputError naming them otherwise."""
        for name in names:
            value = self._lookup(name)
            if value is _MISSING or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, kind):
                raise InputError(f"expected {_kind_name(kind)}, got {value!r}", file=self.file, field=name)
            return value
        looked = " or ".join(f"`{n}`" for n in names)
        arch = self.get("architectures")
        arch_text = f" (architectures: {', '.join(arch)})" if isinstance(arch, list) and arch else ""
        raise InputError(f"missing {looked}{' — ' + what if what else ''}; cannot describe this "
                         f"architecture{arch_text} without it", file=self.file, field=names[0])

    def source(self, *names: str) -> str:
        """'config.json `a` × `b`'-style citation of the fields a figure came from."""
        return "config.json " + " × ".join(f"`{n}`" for n in names)

    def _lookup(self, name: str) -> Any:
        node: Any = self.data
        for part in name.split("."):
            if not isinstance(node, dict) or part not in node:
                return _MISSING
            node = node[part]
        return node


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({int: "an integer", float: "a number", str: "a string", list: "a list",
                        dict: "an object"}.get(k, k.__name__) for k in kinds)
