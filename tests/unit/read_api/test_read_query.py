"""The read API's query grammar, cursors and KTable store: pure logic, no stack."""

from __future__ import annotations

import base64

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import JSON, DateTime, Integer, Numeric, String, column, select

from eventfold.projections import FoldProjection
from eventfold.read_api.query import (
    ListQuery,
    decode_cursor,
    encode_cursor,
    get_query,
    page_query,
    parse_list_query,
    parse_sort,
)
from eventfold.read_api.schema import Kind, QueryError, ReadModelSchema

SCHEMA = ReadModelSchema.of(FoldProjection(
    name="items", sources=("Item",), apply=lambda s, e: s, indexes=("total", "name"),
    columns={"total": Integer(), "name": String(), "price": Numeric(10, 2), "meta": JSON(),
             "seen": DateTime(timezone=True)}))


def test_schema_kinds_and_sortable_fields():
    assert SCHEMA.fields["price"].kind is Kind.DECIMAL
    assert SCHEMA.fields["meta"].kind is Kind.JSON
    assert SCHEMA.sortable == ["key", "total", "name"]


def test_values_are_bound_parameters_never_sql_text():
    query = parse_list_query(SCHEMA, [("name", "x' OR '1'='1"), ("total.in", "1,2"),
                                      ("name.prefix", "50%_off")])
    compiled = page_query(SCHEMA, query)
    assert "OR '1'='1" not in compiled.sql
    assert "x' OR '1'='1" in compiled.params.values()
    assert "50/%/_off" in compiled.params.values()  # LIKE wildcards escaped
    assert "%s" in get_query(SCHEMA)


@pytest.mark.parametrize("name", ["total;--", "total) OR (1=1", "TOTAL", "key ", "1", ""])
def test_only_declared_field_names_are_accepted(name):
    with pytest.raises(QueryError, match="unknown field"):
        parse_list_query(SCHEMA, [(name, "1")])


def test_sort_appends_the_key_and_cursor_round_trips():
    sort = parse_sort(SCHEMA, "-total,name")
    assert [str(k) for k in sort] == ["-total", "name", "key"]
    assert [str(k) for k in parse_sort(SCHEMA, "-total")] == ["-total", "-key"]
    token = encode_cursor(sort, {"total": 5, "name": None, "key": "k7"})
    assert decode_cursor(sort, token) == (5, None, "k7")
    with pytest.raises(QueryError, match="made for sort"):
        decode_cursor(parse_sort(SCHEMA, "name"), token)


TOTAL_SORT = parse_sort(SCHEMA, "total")
stored_keys = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)),
                      max_size=40)  # what a stored row's key can hold
issued_cursors = st.builds(
    lambda total, key: encode_cursor(TOTAL_SORT, {"total": total, "key": key}),
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), stored_keys)


@given(st.one_of(st.text(max_size=60), issued_cursors,
                 issued_cursors.map(lambda token: token[:-2]),
                 issued_cursors.map(lambda token: token + "A")))
def test_any_cursor_text_is_a_cursor_or_a_query_error(token):
    """Garbage (and damaged cursors) never escape as another exception, which would be a
    500; what decodes is what some cursor held."""
    try:
        total, key = decode_cursor(TOTAL_SORT, token)
    except QueryError:
        return
    assert total is None or isinstance(total, int)
    assert decode_cursor(TOTAL_SORT, encode_cursor(TOTAL_SORT, {"total": total, "key": key})
                         ) == (total, key)


SORTS = [parse_sort(SCHEMA, raw) for raw in ("", "total", "-total", "name,-total", "-name")]


@given(st.sampled_from(SORTS), st.data())
def test_a_cursor_that_decodes_makes_a_page_query(sort, data):
    """Made by hand to the cursor's shape (``{"sort": [...], "after": [null]}`` answered
    500 with an IndexError): what decodes compiles, else a QueryError says why."""
    after = data.draw(st.lists(st.none() | st.text(max_size=5) | st.integers().map(str),
                               min_size=len(sort), max_size=len(sort)))
    token = base64.urlsafe_b64encode(orjson.dumps(
        {"sort": [str(k) for k in sort], "after": after})).decode()
    try:
        decoded = decode_cursor(sort, token)
    except QueryError:
        return
    page_query(SCHEMA, ListQuery(filters=(), fields=("key",), sort=sort, limit=10,
                                 after=decoded))


def test_a_null_where_no_row_has_one_is_a_query_error_naming_the_field():
    token = base64.urlsafe_b64encode(b'{"sort": ["key"], "after": [null]}').decode()
    with pytest.raises(QueryError, match="key is never null"):
        decode_cursor(parse_sort(SCHEMA, ""), token)


@given(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), stored_keys)
def test_an_issued_cursor_decodes_to_the_row_it_was_made_after(total, key):
    token = encode_cursor(TOTAL_SORT, {"total": total, "key": key})
    assert decode_cursor(TOTAL_SORT, token) == (total, key)


def test_limit_and_repeated_parameters():
    with pytest.raises(QueryError, match="between 1 and 500"):
        parse_list_query(SCHEMA, [("limit", "1000")])
    with pytest.raises(QueryError, match="give it once"):
        parse_list_query(SCHEMA, [("sort", "total"), ("sort", "name")])


def test_a_cached_compile_is_the_compile(monkeypatch):
    """Pages of one shape share their compiled SQL; each page's own values go with it (the
    second of each pair below differs from the first in values only)."""
    from eventfold.read_api import query as module

    cursor = encode_cursor(parse_sort(SCHEMA, "-total"), {"total": 7, "key": "k7"})
    null_cursor = encode_cursor(parse_sort(SCHEMA, "total"), {"total": None, "key": "k1"})
    pages = [
        [("total.gte", "5"), ("sort", "-total"), ("limit", "50")],
        [("total.gte", "9"), ("sort", "-total"), ("limit", "20")],
        [("total.gte", "0"), ("sort", "-total"), ("cursor", cursor)],
        [("total.gte", "3"), ("sort", "-total"), ("cursor", encode_cursor(
            parse_sort(SCHEMA, "-total"), {"total": 2, "key": "k2"}))],
        [("name.in", "a,b,c"), ("sort", "name")],
        [("name.in", "x,y"), ("sort", "name")],
        [("name.prefix", "50%_off"), ("fields", "name")],
        [("name.prefix", "zz"), ("fields", "name")],
        [("sort", "total"), ("cursor", null_cursor)],
        [("sort", "total"), ("cursor", encode_cursor(parse_sort(SCHEMA, "total"),
                                                     {"total": 4, "key": "k4"}))],
    ]
    statements = []

    def record(statement):
        statements.append(statement)
        return module._compile(statement)

    monkeypatch.setattr(module, "compile_query", record)
    for params in pages:
        page_query(SCHEMA, parse_list_query(SCHEMA, params))
    monkeypatch.setattr(module, "_COMPILED", module.OrderedDict())
    for statement in statements:
        assert module._cached_compile(statement) == module._compile(statement)
    assert len(module._COMPILED) < len(statements)  # shapes shared, not one per page


def test_a_sqlalchemy_without_the_cache_api_compiles_in_full_and_says_so_once(
        monkeypatch, caplog):
    from eventfold.read_api import query as module

    calls = []

    def moved(statement):
        calls.append(statement)
        raise AttributeError("'Select' object has no attribute '_generate_cache_key'")

    monkeypatch.setattr(module, "_cached_compile", moved)
    monkeypatch.setattr(module, "_CACHE_BROKEN", False)
    statement = select(column("a")).where(column("a") > 3)
    with caplog.at_level("WARNING", logger=module.__name__):
        first, second = module.compile_query(statement), module.compile_query(statement)
    assert first == second == module._compile(statement)
    assert len(calls) == 1  # not tried again for every page
    assert ["compiling every page in full" in r.getMessage() for r in caplog.records] == [True]
