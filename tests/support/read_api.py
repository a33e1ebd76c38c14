"""A read API instance as the product runs it, in the test's process, and reading from one as
a client does (retries included); which process holds a file lock."""

from __future__ import annotations

import os
import time
from pathlib import Path

import requests
from sqlalchemy import JSON, Boolean, DateTime, Float, Integer, Numeric, String

from eventfold.local_stack.process import free_port
from eventfold.projections import FoldProjection
from eventfold.read_api import ReadApiOptions, StoreConfig, create_read_app
from eventfold.serving import BackgroundServer
from tests.pipeline_helpers import wait_for

NAMES = ["apple", "banana", "bandana", "cherry", "pear", None]
COLUMNS = {"name": String(), "price": Numeric(10, 2), "stock": Integer(), "rating": Float(),
           "active": Boolean(), "tags": JSON(), "listed_at": DateTime(timezone=True)}


def catalog_projection(unique: str) -> FoldProjection:
    return FoldProjection(name=f"catalog_{unique}", sources=("Catalog",), columns=COLUMNS,
                      apply=lambda state, event: event.data,
                      indexes=("name", "price", "stock", "listed_at"))


def read_api(projections, settings, instance: str, **limits: int) -> BackgroundServer:
    """A read API instance as the product runs it: KTables in RocksDB stores of its own."""
    options = ReadApiOptions(database_url=settings.database_url,
                             kafka=settings.kafka, instance_id=instance,
                             ktable_store=StoreConfig(settings.state_dir / instance,
                                                      cache_mb=64),
                             **limits)
    server = BackgroundServer(create_read_app(projections, options), "127.0.0.1",
                              free_port()).start()
    wait_for(lambda: requests.get(f"{server.url}/ready", timeout=5).status_code == 200,
             f"read API {instance} ready", 60)
    return server


def get(server, path: str, **params) -> requests.Response:
    return requests.get(f"{server.url}{path}", params=params, timeout=30)


def lock_holder(pids: list[int], lock_name: str, under: Path | None = None) -> int | None:
    """The process that has a file named ``lock_name`` open (``under`` a directory if given):
    the store's writer, or the workers' lead."""
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = Path(os.readlink(fd))
                if target.name == lock_name and (under is None or target.parent == under):
                    return pid
        except OSError:
            continue
    return None


def get_as_a_client(url: str, pause_s: float = 0.5, retries: int = 2) -> requests.Response:
    """A GET as a client retrying an idempotent read makes it: after a broken connection,
    ``pause_s`` later, ``retries`` times at most; after a 503, once more when its Retry-After
    says. A SIGKILLed worker resets the connections it held, and those the kernel queued on
    its SO_REUSEPORT socket until the process has exited: a retry sent at once can land in
    that queue again."""
    for attempt in range(retries + 1):
        try:
            response = requests.get(url, timeout=10)
            break
        except requests.ConnectionError:
            if attempt == retries:
                raise
            time.sleep(pause_s)
    if response.status_code == 503:
        time.sleep(float(response.headers.get("Retry-After", "1")))
        response = requests.get(url, timeout=10)
    return response
