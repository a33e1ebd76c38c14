"""A package's exports loaded on first use (PEP 562), so that importing one module of the
package does not import every module its ``__all__`` names."""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from importlib import import_module
from typing import Any


def lazy_exports(namespace: MutableMapping[str, Any],
                 exported_from: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of the package whose ``globals()`` is ``namespace``: each name of
    ``exported_from`` imported from its module when first asked for, then kept."""

    def exported(name: str) -> Any:
        module = exported_from.get(name)
        if module is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    return exported
