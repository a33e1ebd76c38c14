from outbox import OutboxConnectorSpec, config_diff


def test_renders_debezium_outbox_config() -> None:
    spec = OutboxConnectorSpec(
        database_url="postgresql+psycopg://app:s3cret@db.internal:6543/shop",
        name="shop-outbox", slot_name="shop_slot")
    config = spec.config()
    assert config["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert (config["database.hostname"], config["database.port"]) == ("db.internal", "6543")
    assert (config["database.user"], config["database.password"]) == ("app", "s3cret")
    assert config["database.dbname"] == "shop"
    assert config["plugin.name"] == "pgoutput"
    assert config["slot.name"] == "shop_slot"
    assert config["publication.name"] == "eventfold_outbox"
    assert config["publication.autocreate.mode"] == "disabled"
    assert config["table.include.list"] == "public.outbox,public.eventfold_heartbeat"
    assert config["heartbeat.interval.ms"] == "10000"
    assert "eventfold_heartbeat" in config["heartbeat.action.query"]
    assert config["transforms.outbox.predicate"] == "isOutbox"
    assert config["predicates.isOutbox.pattern"] == r".*\.outbox$"
    assert spec.heartbeat_topics == ["__debezium-heartbeat.shop-outbox",
                                     "shop-outbox.public.eventfold_heartbeat"]
    assert config["snapshot.mode"] == "no_data"
    assert config["tombstones.on.delete"] == "false"
    assert config["transforms.outbox.type"] == "io.debezium.transforms.outbox.EventRouter"
    assert config["transforms.outbox.table.field.event.key"] == "aggregateid"
    assert config["transforms.outbox.route.by.field"] == "aggregatetype"
    replacement = config["transforms.outbox.route.topic.replacement"]
    assert replacement == "eventfold.events.${routedByValue}"
    placement = config["transforms.outbox.table.fields.additional.placement"].split(",")
    assert "id:envelope:eventId" in placement
    assert "type:envelope:eventType" in placement
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
