import tracemalloc
from collections.abc import Iterator

from eventfold.outbox.verify import DETAIL, LoggedEvent, compare, verify_topic


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


def test_counts_are_exact_and_the_names_a_sample_of_the_first_aggregates() -> None:
    stored = [ev(f"s{i:04}", 1) for i in range(250)]
    delivered = [ev(f"s{i:04}", 1) for i in range(0, 250, 2)]
    report = compare(stored, delivered)
    assert (report.missing_count, report.expected, report.delivered) == (125, 250, 125)
    assert len(report.missing) == DETAIL
    assert list(report.missing)[:2] == ["s0001", "s0003"]


def test_the_comparison_holds_chunks_not_the_log_in_memory() -> None:
    """A log streams through: the memory Python holds does not grow with it."""
    count = 200_000

    def events() -> Iterator[LoggedEvent]:
        return (LoggedEvent(f"e{i}", f"s{i % 5_000}", i // 5_000 + 1) for i in range(count))

    tracemalloc.start()
    try:
        report = compare(events(), events())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.ok and (report.expected, report.delivered) == (count, count)
    # Both sides held in lists took 107 MB here; a chunk of each, 4.
    assert peak < 10 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"


def test_a_message_that_carries_no_event_is_passed_over() -> None:
    envelope = '{"eventId": "a-1", "streamVersion": 1, "payload": "{}"}'
    report = verify_topic([ev("a", 1)], [("a", envelope), ("a", "not an event"), ("b", None),
                                         (None, envelope), ("a", '{"eventId": "a-1"}')])
    assert (report.ok, report.expected, report.delivered) == (True, 1, 1)
