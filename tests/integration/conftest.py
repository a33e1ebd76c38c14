import pytest
from sqlalchemy import create_engine


@pytest.fixture(scope="session")
def engine(stack_settings):
    """An SQLAlchemy engine on the stack's database."""
    engine = create_engine(stack_settings.database_url)
    yield engine
    engine.dispose()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)

