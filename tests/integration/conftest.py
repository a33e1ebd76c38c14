import pytest
from sqlalchemy import create_engine


@pytest.fixture(scope="session")
def engine(stack_settings):
    """An SQLAlchemy engine on the stack's database."""
    engine = create_engine(stack_settings.database_url)
    yield engine
    engine.dispose()
