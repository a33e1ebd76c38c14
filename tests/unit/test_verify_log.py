from eventfold.outbox.verify import LoggedEvent, compare


def ev(stream: str, version: int) -> LoggedEvent:
    return LoggedEvent(f"{stream}-{version}", stream, version)


def test_complete_log_is_ok() -> None:
    stored = [ev("a", 1), ev("a", 2), ev("b", 1)]
    report = compare(stored, [ev("b", 1), ev("a", 1), ev("a", 2)])
    assert report.ok and report.missing_count == report.duplicate_count == 0


def test_missing_duplicated_and_out_of_order_are_reported_per_aggregate() -> None:
    stored = [ev("a", 1), ev("a", 2), ev("a", 3), ev("b", 1), ev("b", 2)]
    delivered = [ev("a", 1), ev("a", 3), ev("b", 2), ev("b", 1), ev("a", 1)]
    report = compare(stored, delivered)
    assert report.missing == {"a": [2]}
    assert report.duplicated == {"a-1": 1}
    assert report.out_of_order == {"b": [2, 1]}
    assert not report.ok
    assert "1 missing, 1 duplicates, 1 aggregates out of order" in report.summary()


def test_redelivery_after_a_crash_is_a_duplicate_not_a_reordering() -> None:
    stored = [ev("a", 1), ev("a", 2), ev("a", 3)]
    delivered = [ev("a", 1), ev("a", 2), ev("a", 1), ev("a", 2), ev("a", 3)]
    report = compare(stored, delivered)
    assert report.ok
    assert report.duplicate_count == 2
