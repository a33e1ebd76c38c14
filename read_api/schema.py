"""What a read model looks like to a client: its fields, their types, which ones sort.

Built from the projection's declaration (the same SQLAlchemy column types the projection
creates its table with), so the OpenAPI document, the query validator and the SQL agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from enum import Enum
from typing import Any

from sqlalchemy import JSON, Boolean, Date, DateTime, Float, Integer, Numeric, String, Text
from sqlalchemy.types import BigInteger, TypeEngine

from eventfold.projections import Projection


class QueryError(ValueError):
    """A client's query is wrong; the message names the parameter and what is allowed."""


class Kind(Enum):
    TEXT = "text"
    INTEGER = "integer"
    NUMBER = "number"
    DECIMAL = "decimal"
    BOOLEAN = "boolean"
    DATETIME = "datetime"
    DATE = "date"
    JSON = "json"

    @property
    def comparable(self) -> bool:
        return self is not Kind.JSON


def _parse_bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError("expected true or false")


def _parse_int(raw: str) -> int:
    value = int(raw)
    if not -(2**63) <= value < 2**63:
        raise ValueError("out of the 64-bit range")
    return value


def _parse_datetime(raw: str) -> datetime:
    return datetime.fromisoformat(raw.replace("Z", "+00:00"))


def _parse_decimal(raw: str) -> Decimal:
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise ValueError("not a decimal number") from None
    if not value.is_finite():
        raise ValueError("not a finite number")
    return value


_PARSERS: dict[Kind, Callable[[str], Any]] = {
    Kind.TEXT: str,
    Kind.INTEGER: _parse_int,
    Kind.NUMBER: float,
    Kind.DECIMAL: _parse_decimal,
    Kind.BOOLEAN: _parse_bool,
    Kind.DATETIME: _parse_datetime,
    Kind.DATE: date.fromisoformat,
}

_JSON_SCHEMAS: dict[Kind, dict[str, Any]] = {
    Kind.TEXT: {"type": "string"},
    Kind.INTEGER: {"type": "integer"},
    Kind.NUMBER: {"type": "number"},
    Kind.DECIMAL: {"type": "number"},
    Kind.BOOLEAN: {"type": "boolean"},
    Kind.DATETIME: {"type": "string", "format": "date-time"},
    Kind.DATE: {"type": "string", "format": "date"},
    Kind.JSON: {},
}


def kind_of(column_type: TypeEngine[Any]) -> Kind:
    # Order matters: Float is a Numeric.
    for sa_type, kind in ((Boolean, Kind.BOOLEAN), (Integer, Kind.INTEGER), (Float, Kind.NUMBER),
                          (Numeric, Kind.DECIMAL), (DateTime, Kind.DATETIME),
                          (Date, Kind.DATE), (JSON, Kind.JSON), (String, Kind.TEXT)):
        if isinstance(column_type, sa_type):
            return kind
    return Kind.JSON  # an exotic type: returned as-is, never filtered or sorted on


@dataclass(frozen=True)
class Field:
    name: str
    kind: Kind
    column_type: TypeEngine[Any]
    sortable: bool
    nullable: bool = True

    def parse(self, raw: str, parameter: str) -> Any:
        """The typed value of ``raw`` for this field, or a QueryError naming ``parameter``."""
        if not self.kind.comparable:
            raise QueryError(f"{parameter}: field {self.name!r} holds JSON and cannot be "
                             "filtered on")
        check_text(raw, parameter)
        try:
            return _PARSERS[self.kind](raw)
        except (ValueError, TypeError) as exc:
            raise QueryError(f"{parameter}: {raw!r} is not a valid {self.kind.value} for "
                             f"field {self.name!r} ({exc})") from None

    def json_schema(self) -> dict[str, Any]:
        schema = dict(_JSON_SCHEMAS[self.kind])
        if self.nullable and schema:
            return {"anyOf": [schema, {"type": "null"}]}
        return schema


def check_text(raw: str, parameter: str) -> None:
    """A QueryError for text no stored value can hold (Postgres text has no NUL, and UTF-8
    no lone surrogate): the query could only fail in the database."""
    if "\x00" in raw:
        raise QueryError(f"{parameter}: contains a NUL character (\\u0000), which no stored "
                         "value holds")
    if not raw.isascii():
        try:
            raw.encode()
        except UnicodeEncodeError:
            raise QueryError(f"{parameter}: contains a lone surrogate (not valid Unicode)"
                             ) from None


@dataclass(frozen=True)
class ReadModelSchema:
    """The client-facing shape of one projection's read model (its view)."""

    name: str
    view: str
    fields: Mapping[str, Field]
    keyed_by_stream: bool
    description: str = ""

    @classmethod
    def of(cls, projection: Projection) -> ReadModelSchema:
        fields: dict[str, Field] = {"key": Field("key", Kind.TEXT, Text(), True, False)}
        for name, column_type in projection.columns.items():
            kind = kind_of(column_type)
            fields[name] = Field(name, kind, column_type,
                                 kind.comparable and name in projection.indexes)
        fields["_version"] = Field("_version", Kind.INTEGER, BigInteger(), False, False)
        fields["_position"] = Field("_position", Kind.INTEGER, BigInteger(), False, False)
        fields["_updated_at"] = Field("_updated_at", Kind.DATETIME, DateTime(timezone=True),
                                      False, False)
        return cls(name=projection.name, view=projection.table, fields=fields,
                   keyed_by_stream=projection.key_by is None,
                   description=projection.description)

    def field(self, name: str, parameter: str) -> Field:
        found = self.fields.get(name)
        if found is None:
            raise QueryError(f"{parameter}: unknown field {name!r}; {self.name} has "
                             f"{', '.join(self.fields)}")
        return found

    @property
    def sortable(self) -> list[str]:
        return [f.name for f in self.fields.values() if f.sortable]

    def row_json_schema(self) -> dict[str, Any]:
        return {"type": "object", "title": f"{self.name} row",
                "properties": {n: f.json_schema() for n, f in self.fields.items()},
                "required": ["key"]}

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "view": self.view,
            "key": "key",
            "keyed_by_stream": self.keyed_by_stream,
            "fields": {n: {"type": f.kind.value, "sortable": f.sortable,
                           "filterable": f.kind.comparable} for n, f in self.fields.items()},
        }
