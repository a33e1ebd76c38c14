"""Settings from the environment and an optional eventfold.toml: a wrong value is an error
that names where it came from, never a silent default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eventfold.config import ConfigError, Settings
from eventfold.wiring import runner_settings


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("EVENTFOLD_REQUEST_LOG", "ture", "EVENTFOLD_REQUEST_LOG must be true or false"),
    ("EVENTFOLD_METRICS", "enabled", "EVENTFOLD_METRICS must be true or false"),
    ("EVENTFOLD_HTTP_WORKERS", "two", "EVENTFOLD_HTTP_WORKERS must be an integer, not 'two'"),
    ("EVENTFOLD_METRICS_PORT", "1e999", "EVENTFOLD_METRICS_PORT must be an integer"),
    ("EVENTFOLD_COMMAND_COMMIT_SLOTS", "0",
     "EVENTFOLD_COMMAND_COMMIT_SLOTS must be an integer of at least 1, not '0'"),
    ("EVENTFOLD_DEAD_LETTER_RETENTION", "a month",
     "EVENTFOLD_DEAD_LETTER_RETENTION: not an interval: 'a month'"),
    ("EVENTFOLD_DERIVED_EVENT_RETENTION", "-1 days",
     "EVENTFOLD_DERIVED_EVENT_RETENTION: not an interval"),
])
def test_a_wrong_value_is_an_error_naming_its_variable(variable: str, value: str,
                                                       message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({variable: value})


@pytest.mark.parametrize(("value", "expected"), [("false", False), ("0", False), ("no", False),
                                                 ("off", False), ("True", True), ("1", True)])
def test_booleans_take_the_usual_spellings(value: str, expected: bool) -> None:
    assert Settings.from_env({"EVENTFOLD_REQUEST_LOG": value}).request_log is expected


def test_eventfold_toml_sets_what_the_environment_does_not(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "eventfold.toml").write_text(
        'metrics_port = 9464\nrequest_log = false\nconnector_name = "orders-outbox"\n')
    settings = Settings.from_env({"EVENTFOLD_CONNECTOR_NAME": "from-env"})
    assert settings.metrics_port == 9464
    assert settings.request_log is False
    assert settings.connector_name == "from-env"  # the environment wins


def test_a_mistake_in_the_file_names_the_file(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "eventfold.toml"
    config.write_text('metrics_port = "soon"\n')
    with pytest.raises(ConfigError, match=r"metrics_port in eventfold.toml must be an integer"):
        Settings.from_env({})
    config.write_text("request_logs = true\n")
    with pytest.raises(ConfigError, match=r"unknown setting.*request_logs"):
        Settings.from_env({})
    config.write_text("request_log = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Settings.from_env({})
    other = tmp_path / "elsewhere.toml"
    other.write_text("http_workers = 3\n")
    assert Settings.from_env({"EVENTFOLD_CONFIG": str(other)}).http_workers == 3
    with pytest.raises(ConfigError, match=r"EVENTFOLD_CONFIG names .*missing\.toml"):
        Settings.from_env({"EVENTFOLD_CONFIG": str(tmp_path / "missing.toml")})


def test_every_setting_has_a_row_in_the_configuration_table() -> None:
    """docs/configuration.md's table is the one place settings are documented."""
    table = (Path(__file__).parents[3] / "docs" / "configuration.md").read_text()
    rows = "\n".join(line for line in table.splitlines() if line.startswith("| `EVENTFOLD_"))
    documented = set(re.findall(r"`(EVENTFOLD_[A-Z_]+)`", rows))
    assert {f"EVENTFOLD_{name.upper()}" for name in Settings.model_fields} <= documented


def test_retentions_become_the_topic_configs_of_the_projections_outputs() -> None:
    from eventfold.wiring import output_topic_configs

    default = output_topic_configs(Settings())
    assert default.dead_letter_config()["retention.ms"] == str(30 * 86_400_000)
    assert default.derived_config()["retention.ms"] == "-1"
    given = output_topic_configs(Settings.from_env({
        "EVENTFOLD_DEAD_LETTER_RETENTION": "12 hours",
        "EVENTFOLD_DERIVED_EVENT_RETENTION": "90 days",
        "EVENTFOLD_KTABLE_TOPIC_CONFIG": "segment.ms=600000"}))
    assert given.dead_letter_config() == {"cleanup.policy": "delete",
                                          "retention.ms": "43200000", "retention.bytes": "-1"}
    assert given.derived_config()["retention.ms"] == str(90 * 86_400_000)
    assert given.ktable_config() == {"cleanup.policy": "compact", "retention.ms": "-1",
                                     "retention.bytes": "-1", "segment.ms": "600000"}


def test_an_instances_pool_and_cache_are_divided_among_its_http_workers() -> None:
    three = Settings.from_env({"EVENTFOLD_HTTP_WORKERS": "3"})
    assert (three.per_http_worker(10), three.per_http_worker(64)) == (4, 22)
    assert Settings.from_env({}).per_http_worker(10) == 10


def test_a_run_takes_every_setting_it_has_a_field_for_by_name() -> None:
    """``Settings.fill`` copies by name: a field of ``RunnerSettings`` the app's settings do
    not name would keep its default whatever the environment says, so each one is named,
    but for those the app computes."""
    import dataclasses

    from eventfold.projections.run_settings import RunnerSettings
    from eventfold.reactions.runner import ReactionOptions
    from eventfold.read_api import ReadApiOptions

    named = set(Settings.model_fields) | {"kafka", "replication"}
    computed = {"topic_configs", "deleted_key_retention_s"}
    assert {f.name for f in dataclasses.fields(RunnerSettings)} - computed <= named
    computed = {"pool_size", "title", "ktable_store", "workers_dir", "skip_router"}
    assert {f.name for f in dataclasses.fields(ReadApiOptions)} - computed <= named
    assert {f.name for f in dataclasses.fields(ReactionOptions)} <= named
    settings = Settings(projection_stall_s=77, trigger_interval="2 seconds",
                        ktable_retire_wait_s=5, writer_lease_s=3, fair_batch_rows=9,
                        replay_rest_ratio=0.5)
    run = runner_settings(settings, max_rows=123)
    assert (run.projection_stall_s, run.trigger_interval, run.ktable_retire_wait_s,
            run.writer_lease_s, run.fair_batch_rows, run.replay_rest_ratio,
            run.max_rows_per_batch) == (77, "2 seconds", 5, 3, 9, 0.5, 123)
    assert run.kafka == settings.kafka
    reads = Settings(read_forward_timeout_s=0.5).fill(ReadApiOptions, database_url="postgresql://x")
    assert reads.read_forward_timeout_s == 0.5
