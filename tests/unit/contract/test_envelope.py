import json

import pytest

from eventfold.contract import EventEnvelope, MalformedEvent


def test_decodes_what_the_event_router_writes() -> None:
    value = json.dumps({"payload": json.dumps({"product": "p1", "quantity": 5}),
                        "eventType": "StockReceived", "eventId": "e1", "streamVersion": 3,
                        "globalPosition": 42, "recordedAt": "2026-11-21T22:18:13.2Z"})
    envelope = EventEnvelope.decode(b"p1", value.encode())
    assert envelope == EventEnvelope("e1", "StockReceived", "p1", 3, 42,
                                     "2026-11-21T22:18:13.2Z", {"product": "p1", "quantity": 5})
    assert EventEnvelope.decode(*envelope.encode()) == envelope


@pytest.mark.parametrize(("key", "value", "reason"), [
    ("p1", None, "tombstone"),
    (None, "{}", "without a key"),
    ("p1", "not json", "undecodable"),
    ("p1", json.dumps({"payload": "{}"}), "undecodable"),
    ("p1", json.dumps({"payload": "[1]", "eventType": "T", "eventId": "e", "streamVersion": 1,
                       "globalPosition": 1}), "not a JSON object"),
    ("p1", json.dumps({"payload": "{}", "eventType": "T", "eventId": "e",
                       "streamVersion": "x", "globalPosition": 1}), "undecodable"),
])
def test_malformed_messages_say_why(key, value, reason) -> None:
    with pytest.raises(MalformedEvent, match=reason):
        EventEnvelope.decode(key, value)


def test_a_derived_event_reads_back_keyed_by_its_key_at_its_source_position() -> None:
    from eventfold.contract import derived_value

    value = derived_value("d1", "SalesTargetReached", {"total": 2100}, "sales_totals", "e9", 42)
    envelope = EventEnvelope.decode_derived(b"product1", value)
    assert (envelope.event_id, envelope.event_type, envelope.stream_id,
            envelope.global_position, envelope.data) == (
        "d1", "SalesTargetReached", "product1", 42, {"total": 2100})
    assert envelope.metadata == {"projection": "sales_totals", "source_event_id": "e9"}
    with pytest.raises(MalformedEvent, match="undecodable derived event"):
        EventEnvelope.decode_derived("k", '{"eventType": "X"}')
    with pytest.raises(MalformedEvent, match="not a JSON object"):
        EventEnvelope.decode_derived("k", '{"eventId": "d", "eventType": "X", "data": [1]}')
