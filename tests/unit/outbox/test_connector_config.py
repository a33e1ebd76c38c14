import pytest

from eventfold.outbox.connector import OutboxConnectorSpec
from eventfold.outbox.design import OutboxDesign
from eventfold.outbox.operations import ConnectorStatus, SlotInfo, config_diff, describe_diff

SECRET_REF = "${file:/etc/kafka/secrets.properties:shop.password}"


# What the router reads in each design: (captured table, key, route by, id, type column).
ROUTED = {
    OutboxDesign.EVENTS_TABLE: ("events", "stream_id", "stream_type", "event_id", "event_type"),
    OutboxDesign.OUTBOX_TABLE: ("outbox", "aggregateid", "aggregatetype", "id", "type"),
}


@pytest.mark.parametrize("design", list(OutboxDesign))
def test_renders_debezium_outbox_config(design: OutboxDesign) -> None:
    spec = OutboxConnectorSpec(
        database_url="postgresql+psycopg://app:s3cret@db.internal:6543/shop",
        name="shop-outbox", slot_name="shop_slot", password_ref=SECRET_REF, design=design)
    table, key, route_by, event_id, event_type = ROUTED[design]
    config = spec.config()
    assert config["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert (config["database.hostname"], config["database.port"]) == ("db.internal", "6543")
    assert (config["database.user"], config["database.password"]) == ("app", SECRET_REF)
    assert "s3cret" not in str(config)
    assert config["database.dbname"] == "shop"
    assert config["plugin.name"] == "pgoutput"
    assert config["slot.name"] == "shop_slot"
    assert config["publication.name"] == "eventfold_outbox"
    assert config["publication.autocreate.mode"] == "disabled"
    assert config["table.include.list"] == f"public.{table},public.eventfold_heartbeat"
    assert config["heartbeat.interval.ms"] == "10000"
    assert "eventfold_heartbeat" in config["heartbeat.action.query"]
    assert config["transforms.outbox.predicate"] == "isOutbox"
    assert config["predicates.isOutbox.pattern"] == rf".*\.{table}$"
    assert spec.heartbeat_topics == ["__debezium-heartbeat.shop-outbox",
                                     "shop-outbox.public.eventfold_heartbeat"]
    assert config["snapshot.mode"] == "no_data"
    assert config["tombstones.on.delete"] == "false"
    assert config["transforms.outbox.type"] == "io.debezium.transforms.outbox.EventRouter"
    assert config["transforms.outbox.table.field.event.key"] == key
    assert config["transforms.outbox.route.by.field"] == route_by
    assert config["transforms.outbox.table.field.event.id"] == event_id
    replacement = config["transforms.outbox.route.topic.replacement"]
    assert replacement == "eventfold.events.${routedByValue}"
    placement = config["transforms.outbox.table.fields.additional.placement"].split(",")
    assert f"{event_id}:envelope:eventId" in placement
    assert f"{event_type}:envelope:eventType" in placement
    # xid8 is not a type Debezium carries; only the store's own readers need it.
    assert config.get("column.exclude.list") == (
        "public.events.tx_id" if design is OutboxDesign.EVENTS_TABLE else None)
    assert "stream_version:envelope:streamVersion" in placement
    assert all(isinstance(v, str) for v in config.values())


def test_defaults_for_a_url_without_credentials() -> None:
    config = OutboxConnectorSpec(database_url="postgresql://localhost/db").config()
    assert (config["database.port"], config["database.user"], config["database.password"]) == (
        "5432", "postgres", "")


def test_config_diff_names_changed_added_and_removed_keys() -> None:
    current = {"name": "c", "a": "1", "b": "2", "gone": "x"}
    wanted = {"a": "1", "b": "3", "new": "y"}
    assert config_diff(current, wanted) == {"b": ("2", "3"), "gone": ("x", None),
                                            "new": (None, "y")}
    assert config_diff(None, {"a": "1"}) == {"a": (None, "1")}
    assert config_diff({"name": "c", "a": "1"}, {"a": "1"}) == {}


def test_a_password_in_the_url_without_a_provider_reference_is_refused() -> None:
    spec = OutboxConnectorSpec(database_url="postgresql://app:s3cret@db/shop")
    with pytest.raises(ValueError, match="config provider") as raised:
        spec.config()
    assert "s3cret" not in str(raised.value)


def test_the_urls_ssl_parameters_reach_debezium() -> None:
    config = OutboxConnectorSpec(database_url=(
        "postgresql+psycopg://app@db/shop?sslmode=verify-full&sslrootcert=/certs/ca.pem"
        "&sslcert=/certs/client.pem&sslkey=/certs/client.key&application_name=x")).config()
    assert {k: v for k, v in config.items() if k.startswith("database.ssl")} == {
        "database.sslmode": "verify-full", "database.sslrootcert": "/certs/ca.pem",
        "database.sslcert": "/certs/client.pem", "database.sslkey": "/certs/client.key"}


def test_a_diff_never_prints_a_secret() -> None:
    lines = describe_diff({"database.password": ("old-secret", "new-secret"),
                           "database.sslpassword": (None, "k3y"),
                           "database.user": ("a", "b"),
                           "producer.override.sasl.jaas.config": ("x", SECRET_REF)})
    text = "\n".join(lines)
    assert "secret" not in text.replace(SECRET_REF, "") and "k3y" not in text
    assert "database.user: 'a' -> 'b'" in lines
    assert SECRET_REF in text  # a reference names where the secret is, and may show


def test_a_connector_absent_while_its_slot_exists_is_starting_not_gone() -> None:
    # right after a worker restart, the worker answers 404 until it has read its configs
    slot = SlotInfo("cdc_outbox", active=False, retained_wal_bytes=0, unconfirmed_wal_bytes=0)
    assert ConnectorStatus("cdc-outbox", "ABSENT", [], slot).starting
    assert not ConnectorStatus("cdc-outbox", "ABSENT", [], None).starting
