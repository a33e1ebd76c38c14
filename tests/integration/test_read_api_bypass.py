"""The read API's bypass of the router (``ktable_gets``) serves KTable gets, its hot path:
for every request it must answer exactly what the router would. A differential property test
sends the same request, made of any key, KTable name and query parameters, to one read API
that takes the bypass and one that does not, over the same KTable, and compares the
answers (all but what names the instance that gave them)."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import requests
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import BigInteger

from eventfold import Eventfold
from eventfold.local_stack.process import free_port
from eventfold.projections import projection
from eventfold.serving import BackgroundServer
from tests.pipeline_helpers import materialize, wait_for

KEYS = ["k1", "North America 1", "café 3", "100%", "a%41b", "x+y"]
_VOLATILE = {"instance", "served_by", "lag_measured_at", "checked_at"}


@pytest.fixture(scope="module")
def both(inventory_app, stack_settings, tmp_path_factory):
    """Two read APIs over one KTable: through the bypass, and through the router."""
    name = f"bypass_{uuid.uuid4().hex[:8]}"
    table = projection(name, sources=["Product"], columns={"quantity": BigInteger()})(
        lambda state, _event: state)
    materialize(stack_settings, table, {key: {"quantity": i} for i, key in enumerate(KEYS)})
    app = Eventfold(f"bypass_app_{name}")
    app.projections.add(table)
    servers = []
    for skip in (True, False):
        settings = stack_settings.replace(state_dir=tmp_path_factory.mktemp("state"))
        read_app = app.runtime(settings).read_api(skip_router=skip)
        servers.append(BackgroundServer(read_app, "127.0.0.1", free_port()).start())
    try:
        for server in servers:
            wait_for(lambda s=server: requests.get(f"{s.url}/ready", timeout=10)
                     .status_code == 200, "the KTable restored", 60)
        yield name, servers
    finally:
        for server in servers:
            server.stop()


def _answer(url: str) -> tuple[int, Any, str | None]:
    response = requests.get(url, timeout=30)
    try:
        body: Any = _stable(response.json())
    except ValueError:
        body = response.text
    return response.status_code, body, response.headers.get("retry-after")


def _stable(body: Any) -> Any:
    if isinstance(body, dict):
        return {k: _stable(v) for k, v in body.items() if k not in _VOLATILE}
    return body


def _as_sent(key: str, raw: bool) -> str:
    """The key in a path: percent-encoded, or as typed where a client may (a space, say,
    which the client library encodes itself)."""
    if raw and not set(key) & set("/?#%"):
        return key
    return quote(key, safe="")


_values = st.sampled_from(["true", "false", "1", "2", "0", "-1", "abc", "", "2" * 25, "\x00"])
_params = st.lists(st.tuples(st.sampled_from(["local", "version", "min_version", "wait_ms",
                                              "format", "limit"]), _values), max_size=3)
_keys = st.one_of(st.sampled_from([*KEYS, "missing", "a b", "%", "%2F", ".", "..", "\x00"]),
                  st.text(st.characters(blacklist_categories=("Cs",)), min_size=1,
                          max_size=6))


@settings(max_examples=150, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(key=_keys, params=_params, known_name=st.booleans(), raw=st.booleans())
@example(key="North America 1", params=[], known_name=True, raw=False)
@example(key="a%41b", params=[("local", "true")], known_name=True, raw=False)
def test_the_bypass_answers_what_the_router_would(both, key: str, params: list[tuple[str, str]],
                                                   known_name: bool, raw: bool) -> None:
    name, (bypass, routed) = both
    table = name if known_name else "nope"
    path = f"/ktables/{table}/entries/{_as_sent(key, raw)}"
    query = f"?{urlencode(params)}" if params else ""
    assert _answer(bypass.url + path + query) == _answer(routed.url + path + query)
