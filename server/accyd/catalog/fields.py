"""Reading one manifest table's fields, every error naming the file, the entry and the field."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from accyd.catalog import expr
from accyd.catalog.dtypes import DType
from accyd.errors import CatalogError

__all__ = ["Where"]

T = TypeVar("T")


class Where:
    """The place being read (file, entry, field path), for error messages."""

    def __init__(self, path: Path, entry: str) -> None:
        self.path = path
        self.entry = entry

    def error(self, field: str, problem: str) -> CatalogError:
        return CatalogError(f"{self.path}: {self.entry}: field {field!r}: {problem}", field=field)

    def get(self, table: Mapping[str, Any], key: str, kind: type[T], field: str = "") -> T:
        name = field or key
        if key not in table:
            raise self.error(name, "is required")
        return self.check(table[key], kind, name)

    def optional(self, table: Mapping[str, Any], key: str, kind: type[T], default: T) -> T:
        if key not in table:
            return default
        return self.check(table[key], kind, key)

    def check(self, value: Any, kind: type[T], field: str) -> T:
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)  # type: ignore[return-value]
        if not ok:
            raise self.error(field, f"must be {kind.__name__}, not {type(value).__name__}")
        return value  # type: ignore[no-any-return]

    def only(self, table: Mapping[str, Any], allowed: set[str], prefix: str = "") -> None:
        for key in table:
            if key not in allowed:
                raise self.error(
                    f"{prefix}{key}", f"is not a known field ({', '.join(sorted(allowed))})"
                )

    def convert(self, field: str, convert: Callable[[], T]) -> T:
        try:
            return convert()
        except ValueError as error:
            raise self.error(field, str(error)) from None

    def dtype(self, table: Mapping[str, Any], field: str) -> DType:
        name = self.get(table, "dtype", str, f"{field}.dtype")
        try:
            return DType.parse(name)
        except ValueError as error:
            raise self.error(f"{field}.dtype", str(error)) from None

    def expr(self, text: Any, names: Mapping[str, int], field: str) -> expr.Expr:
        source = self.check(text, str, field)
        try:
            return expr.parse(source, names)
        except ValueError as error:
            raise self.error(field, str(error)) from None
