"""The README's worked example runs as pasted: its code block, executed as a module of its own,
is an app whose command is validated and whose projection folds, in memory."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from eventfold.testing import InMemoryApp
from eventfold.write_model import default_registry
from tests.packaging import ROOT


@pytest.fixture
def readme_example() -> Iterator[types.ModuleType]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A worked example"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None, "the worked example has no python block"
    module = types.ModuleType("readme_example")
    # Its event class takes the type name examples/inventory.py registers: put that one back
    registered = dict(default_registry._by_type)
    sys.modules[module.__name__] = module
    try:
        exec(compile(code.group(1), "README.md", "exec"), module.__dict__)
        yield module
    finally:
        del sys.modules[module.__name__]
        default_registry._by_type.clear()
        default_registry._by_type.update(registered)


def test_the_readme_example_runs_as_pasted(readme_example: types.ModuleType) -> None:
    inventory = InMemoryApp(readme_example.app)
    inventory.execute(readme_example.ReceiveStock(product="p1", quantity=3))
    inventory.execute(readme_example.ReceiveStock(product="p1", quantity=4))
    assert inventory.state("inventory_totals", "p1") == {"quantity": 7}
    with pytest.raises(ValidationError, match="quantity"):
        readme_example.ReceiveStock(product="p1", quantity=0)
