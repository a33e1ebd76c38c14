"""ASGI app factories for servers that import by name (uvicorn workers, gunicorn):

    uvicorn --factory eventfold.asgi:command_api
    uvicorn --factory eventfold.asgi:read_api
"""

from __future__ import annotations

from fastapi import FastAPI

from eventfold.app import app_of
from eventfold.config import Settings


def command_api() -> FastAPI:
    settings = Settings.from_env().with_local_stack()
    return app_of(settings).runtime(settings).command_api()


def read_api() -> FastAPI:
    settings = Settings.from_env().with_local_stack()
    return app_of(settings).runtime(settings).read_api()
