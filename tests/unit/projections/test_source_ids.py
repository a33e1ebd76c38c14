from eventfold.projections.state.source_ids import made_again


def test_a_topic_with_another_id_than_recorded_was_made_again() -> None:
    recorded = {"events.Order": "id-1", "events.Customer": "id-2"}
    now = {"events.Order": "id-3", "events.Customer": "id-2", "events.Invoice": "id-4"}
    assert made_again(recorded, now) == {"events.Order": ("id-1", "id-3")}


def test_a_topic_never_recorded_or_gone_now_is_not_made_again() -> None:
    assert made_again({}, {"events.Order": "id-1"}) == {}
    assert made_again({"events.Order": "id-1"}, {}) == {}
