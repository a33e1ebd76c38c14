"""Errors that cross Spark's boundary by a code.

A Python task's exception reaches the driver as a Java error whose message holds the task's
traceback, so the driver cannot catch the task's class. An error meant to be recognised there
says its code in its message (``[eventfold:CODE]``), and the driver asks ``raised_in_task`` for
that code rather than matching a class name in text. Imports nothing of the package: every
layer may raise one."""

from __future__ import annotations

import re
from typing import ClassVar

_CODE = re.compile(r"\[eventfold:([a-z_]+)\]")


class TaskError(RuntimeError):
    """An error with a stable code, recognisable wherever it surfaces."""

    code: ClassVar[str]

    def __init__(self, message: str) -> None:
        super().__init__(f"[eventfold:{self.code}] {message}")


def raised_in_task(exc: BaseException, error: type[TaskError]) -> bool:
    """Whether ``exc`` is ``error``, raised here or in a Spark task (its code in the message of
    the error Spark raised on the driver)."""
    if isinstance(exc, error):
        return True
    return any(match.group(1) == error.code for match in _CODE.finditer(str(exc)))
