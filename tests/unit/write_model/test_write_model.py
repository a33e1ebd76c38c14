"""Domain classes and command validation: no database needed."""

import pytest
from pydantic import ValidationError

from eventfold.config import ConfigError, Settings
from eventfold.write_model import DomainError, default_registry
from examples.inventory import Product, ReceiveStock, StockReceived


def test_aggregate_records_and_replays() -> None:
    product = Product("apples")
    product.receive_stock(5)
    product.receive_stock(7)
    assert (product.on_hand, product.version, product.loaded_version) == (12, 2, 0)
    assert product.pending_events == [StockReceived("apples", 5), StockReceived("apples", 7)]
    replayed = Product.replay("apples", product.pending_events)
    assert (replayed.on_hand, replayed.version, replayed.pending_events) == (12, 2, [])


def test_business_rule_violation_records_nothing() -> None:
    product = Product("apples")
    with pytest.raises(DomainError, match="positive"):
        product.receive_stock(0)
    assert product.pending_events == []


def test_stored_events_decode_to_their_class() -> None:
    event = default_registry.decode("StockReceived", {"product": "p", "quantity": 2})
    assert event == StockReceived("p", 2)
    with pytest.raises(LookupError, match="unknown event type"):
        default_registry.decode("Nope", {})


@pytest.mark.parametrize(("payload", "field"), [
    ({"product": "p"}, "quantity"),
    ({"product": "", "quantity": 1}, "product"),
    ({"product": "p", "quantity": "lots"}, "quantity"),
    ({"product": "p", "quantity": 1, "colour": "red"}, "colour"),
    ({"product": "p", "quantity": 1, "expected_version": -1}, "expected_version"),
])
def test_malformed_commands_name_the_field(payload, field) -> None:
    with pytest.raises(ValidationError) as info:
        ReceiveStock.model_validate(payload)
    assert field in {str(e["loc"][0]) for e in info.value.errors()}


def test_settings_from_env() -> None:
    settings = Settings.from_env({"EVENTFOLD_DATABASE_URL": "postgresql+psycopg://x/y",
                                  "EVENTFOLD_EVENT_TOPIC_PARTITIONS": "8"})
    assert settings.database_url == "postgresql+psycopg://x/y"
    assert settings.event_topic_partitions == 8
    assert settings.spark_master == "local[2]"
    with pytest.raises(ConfigError, match="integer"):
        Settings.from_env({"EVENTFOLD_READ_API_PORT": "eighty"})
