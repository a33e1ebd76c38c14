"""The HTTP metrics' labels stay bounded whatever clients send."""

from __future__ import annotations

import asyncio
from typing import Any

from eventfold.metrics import HttpMetrics, exposition


def test_made_up_methods_and_paths_share_one_series() -> None:
    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 405, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def sent(message: Any) -> None:
        return None

    metrics = HttpMetrics(refuse, api="bounded")
    for n in range(50):
        asyncio.run(metrics({"type": "http", "method": f"FOO{n}", "path": f"/x/{n}"}, None,
                            sent))
    series = [line for line in exposition().decode().splitlines()
              if line.startswith("eventfold_http_requests_total") and 'api="bounded"' in line]
    assert series == ['eventfold_http_requests_total{api="bounded",method="other",'
                      'route="unmatched",status="405"} 50.0']
