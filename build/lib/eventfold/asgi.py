"""ASGI app factories for servers that import by name (uvicorn workers, gunicorn):

    uvicorn --factory eventfold.asgi:command_api
    uvicorn --factory eventfold.asgi:read_api
"""

from __future__ import annotations

from fastapi import FastAPI

from eventfold.app import load_app
from eventfold.config import Settings


def command_api() -> FastAPI:
    settings = Settings.from_env().with_local_stack()
    return load_app(settings.app).command_api(settings)


def read_api() -> FastAPI:
    settings = Settings.from_env().with_local_stack()
    return load_app(settings.app).read_api(settings)
