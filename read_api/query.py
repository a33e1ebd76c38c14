"""Read model queries from URL parameters to parameterized SQL, with nothing in between that a
client controls as text.

Grammar (every name is checked against the read model's schema, every value is parsed to the
field's type and bound as a parameter):

    field=value                equality (``field.eq=value`` for fields named like a keyword)
    field.OP=value             OP in eq, ne, lt, lte, gt, gte, in (comma list), prefix, null
    fields=a,b                 field selection (the key always comes back)
    sort=-total,name           indexed fields only; the key is the last tie-break, in the
                               direction of the field before it (so that the (field, key)
                               index serves a one-field sort either way)
    limit=N                    1..MAX_PAGE_SIZE
    cursor=TOKEN               the ``next_cursor`` of the previous page (keyset paging)
"""

from __future__ import annotations

import base64
import binascii
import logging
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy
from sqlalchemy import column, func, select, table, tuple_, union_all
from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.expression import Select, TableClause

from eventfold.read_api.schema import Field, Kind, QueryError, ReadModelSchema

log = logging.getLogger(__name__)

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 50
MAX_IN_VALUES = 100
LIST_PARAMETERS = frozenset({"fields", "sort", "limit", "cursor"})
OPERATORS = ("eq", "ne", "lt", "lte", "gt", "gte", "in", "prefix", "null")
_NEEDS_A_VALUE = frozenset({"eq", "lt", "lte", "gt", "gte", "in", "prefix"})
"""Operators no null satisfies."""
_DIALECT = pg_psycopg.dialect()  # type: ignore[no-untyped-call]  # (SQLAlchemy's own)


@dataclass(frozen=True)
class Filter:
    field: Field
    op: str
    value: Any


@dataclass(frozen=True)
class SortKey:
    field: Field
    descending: bool = False

    def __str__(self) -> str:
        return f"-{self.field.name}" if self.descending else self.field.name


@dataclass(frozen=True)
class ListQuery:
    filters: tuple[Filter, ...]
    fields: tuple[str, ...]
    sort: tuple[SortKey, ...]
    limit: int
    after: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class CompiledQuery:
    sql: str
    params: dict[str, Any]


# -- parsing ------------------------------------------------------------------------------------
def parse_filters(schema: ReadModelSchema, params: Iterable[tuple[str, str]],
                  reserved: Iterable[str] = ()) -> tuple[Filter, ...]:
    """Every parameter not in ``reserved`` is a filter; anything unknown is a QueryError."""
    skip = frozenset(reserved)
    return tuple(_filter(schema, name, raw) for name, raw in params if name not in skip)


def _filter(schema: ReadModelSchema, parameter: str, raw: str) -> Filter:
    name, dot, op = parameter.partition(".")
    if not dot:
        op = "eq"
    if op not in OPERATORS:
        raise QueryError(f"{parameter}: unknown operator {op!r}; use one of "
                         f"{', '.join(OPERATORS)}")
    field = schema.field(name, parameter)
    if op == "null":
        return Filter(field, op, _parse_flag(raw, parameter))
    if op == "prefix" and field.kind is not Kind.TEXT:
        raise QueryError(f"{parameter}: prefix needs a text field; {name!r} is "
                         f"{field.kind.value}")
    if op == "in":
        values = raw.split(",")
        if len(values) > MAX_IN_VALUES:
            raise QueryError(f"{parameter}: at most {MAX_IN_VALUES} values")
        return Filter(field, op, tuple(field.parse(v, parameter) for v in values))
    return Filter(field, op, field.parse(raw, parameter))


def needs_a_value(filters: Iterable[Filter]) -> bool:
    """Whether ``filters`` match only rows with a value in one of the projection's own
    columns. A deleted key's row keeps none (its key and system columns only), so such
    filters never match one: Postgres's planner, which takes them to be independent of the
    view's ``NOT _deleted``, counts the deleted share of the table twice."""
    return any(f.op in _NEEDS_A_VALUE or (f.op == "null" and f.value is False)
               for f in filters if f.field.name != "key" and not f.field.name.startswith("_"))


def _parse_flag(raw: str, parameter: str) -> bool:
    lowered = raw.lower()
    if lowered not in ("true", "false"):
        raise QueryError(f"{parameter}: expected true or false, got {raw!r}")
    return lowered == "true"


def parse_list_query(schema: ReadModelSchema, params: Sequence[tuple[str, str]]) -> ListQuery:
    single = _single_values(params)
    sort = parse_sort(schema, single.get("sort", ""))
    query = ListQuery(
        filters=parse_filters(schema, params, LIST_PARAMETERS),
        fields=parse_fields(schema, single.get("fields")),
        sort=sort,
        limit=parse_limit(single.get("limit")),
    )
    token = single.get("cursor")
    if token:
        return ListQuery(query.filters, query.fields, sort, query.limit,
                         decode_cursor(sort, token))
    return query


def _single_values(params: Sequence[tuple[str, str]]) -> dict[str, str]:
    values: dict[str, str] = {}
    for name, raw in params:
        if name in LIST_PARAMETERS:
            if name in values:
                raise QueryError(f"{name}: give it once")
            values[name] = raw
    return values


def parse_fields(schema: ReadModelSchema, raw: str | None) -> tuple[str, ...]:
    if not raw:
        return tuple(schema.fields)
    names = [n.strip() for n in raw.split(",") if n.strip()]
    for name in names:
        schema.field(name, "fields")
    return ("key", *(n for n in dict.fromkeys(names) if n != "key"))


def parse_sort(schema: ReadModelSchema, raw: str) -> tuple[SortKey, ...]:
    keys: list[SortKey] = []
    for part in (p.strip() for p in raw.split(",") if p.strip()):
        descending = part.startswith("-")
        field = schema.field(part.lstrip("-+"), "sort")
        if not field.sortable:
            raise QueryError(f"sort: {field.name!r} is not indexed; sortable fields are "
                             f"{', '.join(schema.sortable)}")
        if any(k.field.name == field.name for k in keys):
            raise QueryError(f"sort: {field.name!r} appears twice")
        keys.append(SortKey(field, descending))
    if not any(k.field.name == "key" for k in keys):
        # unique: a stable order for paging
        keys.append(SortKey(schema.fields["key"], bool(keys) and keys[-1].descending))
    return tuple(keys)


def parse_limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_PAGE_SIZE
    try:
        limit = int(raw)
    except ValueError:
        raise QueryError(f"limit: {raw!r} is not an integer") from None
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise QueryError(f"limit: must be between 1 and {MAX_PAGE_SIZE}, got {limit}")
    return limit


# -- cursors -------------------------------------------------------------------------------------
def encode_cursor(sort: Sequence[SortKey], row: dict[str, Any]) -> str:
    """An opaque token for the page after ``row``: the sort it was made for and the row's
    values of the sort fields. Decoding re-parses the values with the fields' types."""
    payload = {"sort": [str(k) for k in sort],
               "after": [None if row[k.field.name] is None else str(row[k.field.name])
                         for k in sort]}
    return base64.urlsafe_b64encode(orjson.dumps(payload)).decode().rstrip("=")


def decode_cursor(sort: Sequence[SortKey], token: str) -> tuple[Any, ...]:
    try:
        payload = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        raise QueryError("cursor: not a cursor this API issued") from None
    if (not isinstance(payload, dict) or not isinstance(payload.get("after"), list)
            or not isinstance(payload.get("sort"), list)):
        raise QueryError("cursor: not a cursor this API issued")
    expected = [str(k) for k in sort]
    if payload["sort"] != expected:
        raise QueryError(f"cursor: made for sort={','.join(map(str, payload['sort']))}, "
                         f"this request sorts by {','.join(expected)}")
    after = payload["after"]
    if len(after) != len(sort) or not all(v is None or isinstance(v, str) for v in after):
        raise QueryError("cursor: not a cursor this API issued")
    for key, raw in zip(sort, after, strict=True):
        if raw is None and not key.field.nullable:
            # no row holds it: such a cursor was made by hand, and no page comes after it
            raise QueryError(f"cursor: {key.field.name} is never null, and the cursor says "
                             "null; not a cursor this API issued")
    return tuple(None if raw is None else key.field.parse(raw, "cursor")
                 for key, raw in zip(sort, after, strict=True))


# -- SQL ----------------------------------------------------------------------------------------
def view_table(schema: ReadModelSchema) -> TableClause:
    return table(schema.view, *(column(f.name, f.column_type) for f in schema.fields.values()))


_CACHE_BROKEN = False
"""Set once SQLAlchemy's cache API failed a page: the pages after it compile in full."""


def compile_query(statement: Select[Any]) -> CompiledQuery:
    """The statement's SQL and parameters, compiled once per shape of query.

    Compiling took more time than anything else of a page's work in the read API's process
    (docs/benchmarks.md, "Pages compiled once per shape"), and pages of one shape (filters,
    sort, fields, cursor) share their SQL: this keeps what SQLAlchemy's own statement cache
    keeps, keyed alike, and takes each request's values out of its statement the same way
    (SQLAlchemy's cache API is its Connection's, and the read API runs its SQL through
    psycopg). ``test_a_cached_compile_is_the_compile`` holds the two equal."""
    global _CACHE_BROKEN
    if not _CACHE_BROKEN:
        try:
            return _cached_compile(statement)
        except (AttributeError, TypeError, AssertionError) as exc:  # SQLAlchemy's internals moved
            _CACHE_BROKEN = True
            log.warning("read models: compiling every page in full from now on; SQLAlchemy "
                        "%s no longer has the cache API pages were compiled through (%s: %s)",
                        sqlalchemy.__version__, type(exc).__name__, exc)
    return _compile(statement)


def _compile(statement: Select[Any]) -> CompiledQuery:
    compiled = statement.compile(dialect=_DIALECT, compile_kwargs={"render_postcompile": True})
    return CompiledQuery(str(compiled), dict(compiled.params))


_COMPILED: OrderedDict[Any, Any] = OrderedDict()
_COMPILED_MAX = 512  # shapes of query kept: the users' queries, not the values in them
_COMPILED_LOCK = threading.Lock()


def _cached_compile(statement: Select[Any]) -> CompiledQuery:
    key = statement._generate_cache_key()
    if key is None:
        return _compile(statement)
    with _COMPILED_LOCK:
        compiled = _COMPILED.get(key[0])
        if compiled is not None:
            _COMPILED.move_to_end(key[0])
    if compiled is None:
        compiled = statement._compiler(_DIALECT, cache_key=key, column_keys=[])
        with _COMPILED_LOCK:
            _COMPILED[key[0]] = compiled
            while len(_COMPILED) > _COMPILED_MAX:
                _COMPILED.popitem(last=False)
    collected: dict[str, Any] = {"_collected_params": key[2]} if len(key) > 2 else {}  # 2.1
    params = compiled.construct_params(extracted_parameters=key[1], escape_names=False,
                                       _no_postcompile=True, **collected)
    expanded = compiled._process_parameters_for_postcompile(params)  # IN lists, as rendered
    return CompiledQuery(expanded.statement, dict(expanded.parameters))


def page_query(schema: ReadModelSchema, query: ListQuery) -> CompiledQuery:
    """The page's rows, one more than the limit (is there a next page?). After a cursor, the
    rows after it are one range of the sort's index where a row comparison can say which
    (``_one_range``), else the union of index range scans (see ``_after``), each limited,
    sorted again: at most a few pages' rows, whatever the depth."""
    view = view_table(schema)
    conditions = [_condition(view, f) for f in query.filters]
    order = [view.c[k.field.name].desc().nulls_first() if k.descending
             else view.c[k.field.name].asc().nulls_last() for k in query.sort]
    # the sort fields too: the next page's cursor is made of them
    selected = [view.c[name] for name in
                dict.fromkeys([*query.fields, *(k.field.name for k in query.sort)])]

    def scan(*where: ColumnElement[bool]) -> Select[Any]:
        return select(*selected).where(*conditions, *where).order_by(*order).limit(
            query.limit + 1)

    if query.after is None:
        return compile_query(scan())
    if _one_range(query.sort, query.after):
        columns = [view.c[k.field.name] for k in query.sort]
        after = (tuple_(*columns) < tuple_(*query.after) if query.sort[0].descending
                 else tuple_(*columns) > tuple_(*query.after))
        return compile_query(scan(after))
    rows = union_all(*(scan(*branch) for branch in _after(view, query.sort, query.after))
                     ).subquery("after_cursor")
    resorted = [rows.c[k.field.name].desc().nulls_first() if k.descending
                else rows.c[k.field.name].asc().nulls_last() for k in query.sort]
    return compile_query(select(*(rows.c[c.name] for c in selected)).order_by(*resorted)
                         .limit(query.limit + 1))


def count_query(schema: ReadModelSchema, filters: Sequence[Filter]) -> CompiledQuery:
    view = view_table(schema)
    return compile_query(select(func.count()).select_from(view)
                         .where(*(_condition(view, f) for f in filters)))


def matching_query(schema: ReadModelSchema, filters: Sequence[Filter]) -> CompiledQuery:
    """The rows ``filters`` match, to EXPLAIN: the plan's top node holds the planner's
    estimate of how many there are."""
    view = view_table(schema)
    return compile_query(select(view.c.key).where(*(_condition(view, f) for f in filters)))


def get_query(schema: ReadModelSchema) -> str:
    """Get by key, as plain SQL with one positional parameter (the hot path; prepared once)."""
    view = view_table(schema)
    statement = select(*view.c).where(view.c.key == "k")
    text = str(statement.compile(dialect=_DIALECT))
    return text.replace("%(key_1)s", "%s")


_COMPARISONS: dict[str, Callable[[ColumnElement[Any], Any], ColumnElement[bool]]] = {
    "eq": operator.eq, "lt": operator.lt, "lte": operator.le, "gt": operator.gt,
    "gte": operator.ge,
}


def _condition(view: TableClause, f: Filter) -> ColumnElement[bool]:
    col: ColumnElement[Any] = view.c[f.field.name]
    comparison = _COMPARISONS.get(f.op)
    if comparison is not None:
        return comparison(col, f.value)
    match f.op:
        case "ne":
            return col.is_distinct_from(f.value)
        case "in":
            return col.in_(f.value)
        case "prefix":
            return col.startswith(f.value, autoescape=True)
        case "null":
            return col.is_(None) if f.value else col.is_not(None)
    raise QueryError(f"unknown operator {f.op!r}")  # parse_filters lets none through


def _one_range(sort: Sequence[SortKey], values: Sequence[Any]) -> bool:
    """Whether the rows after ``values`` are one range of the sort fields' index, read from
    a row comparison ``(a, key) > (%s, %s)``: every field in the same direction, no value
    null, and no null after a value (descending, nulls come first; ascending, only if no
    sort field is nullable). A row comparison is null, so false, where a field is null,
    unless an earlier field already decided it."""
    return (len({k.descending for k in sort}) == 1
            and all(value is not None for value in values)
            and (sort[0].descending or not any(k.field.nullable for k in sort)))


def _after(view: TableClause, sort: Sequence[SortKey], values: Sequence[Any]
           ) -> list[list[ColumnElement[bool]]]:
    """Rows strictly after ``values`` in the sort order (ASC NULLS LAST, DESC NULLS FIRST, as
    Postgres orders by default and its indexes scan), as branches whose union they are: for
    each sort field, 'equal on the fields before it, after on this one', with the nulls after
    a value a branch of their own. For a one-field sort each branch is a range of the
    (field, key) index, where one OR of them all would scan from the start."""
    branches: list[list[ColumnElement[bool]]] = []
    equal_so_far: list[ColumnElement[bool]] = []
    for key, value in zip(sort, values, strict=True):
        col = view.c[key.field.name]
        branches += [[*equal_so_far, after] for after in
                     _strictly_after(col, key.descending, value, key.field.nullable)]
        equal_so_far.append(col.is_(None) if value is None else col == value)
    return branches


def _strictly_after(col: ColumnElement[Any], descending: bool, value: Any, nullable: bool
                    ) -> list[ColumnElement[bool]]:
    """Disjoint conditions that together hold the values after ``value`` in one field."""
    if value is None:
        return [col.is_not(None)] if descending else []
    if descending:
        return [_COMPARISONS["lt"](col, value)]
    return [_COMPARISONS["gt"](col, value), *([col.is_(None)] if nullable else [])]
