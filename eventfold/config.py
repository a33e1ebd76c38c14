"""One configuration object per process: ``Settings``, a pydantic-settings model read from
EVENTFOLD_* environment variables over an optional ``eventfold.toml``.

Endpoints default to the local stack started by ``eventfold stack up`` (its state file holds
the ports it picked); production sets them explicitly. docs/configuration.md documents
every variable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from eventfold.contract import (
    DEFAULT_DEAD_LETTER_RETENTION,
    DEFAULT_DERIVED_EVENT_RETENTION,
    interval_seconds,
    retention_ms,
)
from eventfold.outbox.connection import KafkaConnection, is_provider_reference, parse_key_values
from eventfold.outbox.design import DEFAULT_OUTBOX_DESIGN, OutboxDesign
from eventfold.outbox.topics import Replication

if TYPE_CHECKING:
    from eventfold.local_stack import LocalStack


class ConfigError(RuntimeError):
    pass


DEFAULT_STACK_DIR = Path(".eventfold/stack")


def find_stack_dir(start: Path) -> Path:
    """The local stack's directory: ``.eventfold/stack`` in ``start`` or the nearest parent
    that has one (as git finds ``.git``), else in ``start``."""
    for directory in (start, *start.parents):
        if (directory / DEFAULT_STACK_DIR).is_dir():
            return directory / DEFAULT_STACK_DIR
    return start / DEFAULT_STACK_DIR


def _config_file(env: Mapping[str, str]) -> tuple[dict[str, object], Path | None]:
    """The settings of ``EVENTFOLD_CONFIG`` (which must exist) or of ``./eventfold.toml`` (if
    it exists): top-level keys named as the fields, e.g. ``metrics_port = 9464``."""
    named = env.get("EVENTFOLD_CONFIG")
    path = Path(named) if named else Path("eventfold.toml")
    if not path.is_file():
        if named:
            raise ConfigError(f"EVENTFOLD_CONFIG names {path}, which is not a file")
        return {}, None
    try:
        values = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    unknown = sorted(set(values) - set(Settings.model_fields))
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {', '.join(unknown)}; the settings are "
                          f"{', '.join(Settings.model_fields)}")
    return values, path


_KINDS = {bool: "true or false (also 1/0, yes/no, on/off)", int: "an integer",
          Path: "a path", str: "text"}

PackageSettings = TypeVar("PackageSettings")

_ENVIRONMENT: ContextVar[Mapping[str, str] | None] = ContextVar("eventfold_environment",
                                                                default=None)
"""The variables ``Settings.from_env`` was given in place of the process's environment."""


class Settings(BaseSettings):
    """Every setting of an Eventfold process. Constructed directly, keyword arguments win over
    ``EVENTFOLD_<FIELD>`` variables, which win over ``eventfold.toml`` (or the file
    ``EVENTFOLD_CONFIG`` names), which wins over the defaults. A value of the wrong type is a
    ``ConfigError`` naming where it came from, never a silent default."""

    model_config = SettingsConfigDict(env_prefix="EVENTFOLD_", env_ignore_empty=True,
                                      frozen=True, extra="forbid")

    app: str = "examples.inventory:app"
    app_dir: str = ""
    database_url: str = ""
    read_database_url: str = ""
    reader_role: str = "eventfold_reader"
    kafka_bootstrap: str = ""
    kafka_config: str = ""
    replication_factor: str = ""
    min_insync_replicas: str = ""
    connect_url: str = ""
    connect_database_url: str = ""
    connect_database_password: str = ""
    connector_name: str = "eventfold-outbox"
    outbox_design: str = DEFAULT_OUTBOX_DESIGN.value
    spark_master: str = "local[2]"
    spark_conf: str = ""
    stack_dir: Path = Field(default_factory=lambda: find_stack_dir(Path.cwd()))
    event_topic_partitions: int = 4
    trigger_interval: str = "100 milliseconds"
    # projections.limits's defaults, written out: importing projections here would slow every
    # command process's start (docs/benchmarks.md); a test keeps the two equal.
    max_rows_per_batch: int = 500_000
    driver_batch_max_rows: int = Field(default=1_000, ge=0)
    fair_batch_rows: int = Field(default=20_000, ge=0)
    replay_max_rows_per_batch: int = 1_000_000
    replay_rest_ratio: float = Field(default=2.0, ge=0)
    ktable_retire_wait_s: int = 60
    writer_lease_s: float = Field(default=10.0, gt=0)
    projection_stall_s: float = Field(default=120.0, gt=0)
    reaction_batch_max_events: int = Field(default=500, ge=1)
    reaction_retry_pause_s: float = Field(default=2.0, gt=0)
    reaction_session_timeout_s: float = Field(default=10.0, ge=6, le=300)
    reaction_max_poll_interval_s: float = Field(default=300.0, ge=6)
    process_timer_grace_s: float = Field(default=2.0, ge=0)
    ktable_topic_config: str = ""
    state_dir: Path = Path(".eventfold/state")
    ktable_cache_mb: int = Field(default=64, ge=1)
    ktable_standby_replicas: int = Field(default=1, ge=0)
    ktable_acceptable_lag: int = Field(default=10_000, ge=0)
    read_forward_timeout_s: float = Field(default=3.0, gt=0)
    advertised_url: str = ""
    allow_data_loss: bool = False
    http_host: str = "127.0.0.1"
    command_api_port: int = 8000
    read_api_port: int = 8001
    http_workers: int = 1
    command_commit_slots: int = Field(default=1, ge=1)
    read_pool_size: int = 10
    read_statement_timeout_ms: int = Field(default=5_000, ge=1)
    read_count_timeout_ms: int = Field(default=200, ge=1)
    read_exact_count_max_rows: int = Field(default=10_000, ge=0)
    instance_id: str = ""
    request_log: bool = True
    metrics: bool = True
    metrics_port: int = 0
    api_token: str = ""
    max_body_bytes: int = 1024 * 1024
    command_id_retention: str = "7 days"
    dead_letter_retention: str = DEFAULT_DEAD_LETTER_RETENTION
    deleted_key_retention: str = "7 days"
    derived_event_retention: str = DEFAULT_DERIVED_EVENT_RETENTION
    log_level: str = "INFO"
    log_format: str = "text"

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            # The file is read again only to say where a bad value came from.
            environment = _ENVIRONMENT.get()
            env = os.environ if environment is None else environment
            raise ConfigError(_explain(exc, values, env, *_config_file(env))) from None

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environment = _ENVIRONMENT.get()
        if environment is not None:  # from_env's variables stand in for the process's
            env_settings = InitSettingsSource(settings_cls, {
                name: value for name in cls.model_fields
                if (value := environment.get(f"EVENTFOLD_{name.upper()}"))})
        _, file_path = _config_file(os.environ if environment is None else environment)
        if file_path is None:
            return init_settings, env_settings
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, file_path)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings of this process's environment, or of ``environ`` in its place."""
        token = _ENVIRONMENT.set(None if environ is None else dict(environ))
        try:
            return cls()
        finally:
            _ENVIRONMENT.reset(token)

    @model_validator(mode="after")
    def _checked(self) -> Settings:
        self.check()
        return self

    def check(self) -> None:
        """Parse the structured settings once, so that a bad value fails at start, naming
        its variable."""
        for name in ("kafka_client_settings", "replication", "spark_settings"):
            try:
                getattr(self, name)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        for name, parse in (("trigger_interval", interval_seconds),
                            ("command_id_retention", interval_seconds),
                            ("dead_letter_retention", retention_ms),
                            ("deleted_key_retention", retention_ms),
                            ("derived_event_retention", retention_ms)):
            try:
                parse(getattr(self, name))
            except ValueError as exc:
                raise ConfigError(f"EVENTFOLD_{name.upper()}: {exc}") from None
        if self.app_dir and not Path(self.app_dir).is_dir():
            raise ConfigError(f"EVENTFOLD_APP_DIR names {self.app_dir}, which is not a "
                              "directory")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"EVENTFOLD_LOG_FORMAT is text or json, not {self.log_format!r}")
        if self.outbox_design not in tuple(OutboxDesign):
            raise ConfigError(f"EVENTFOLD_OUTBOX_DESIGN is one of "
                              f"{', '.join(OutboxDesign)}, not {self.outbox_design!r}")
        password = self.connect_database_password
        if password and not is_provider_reference(password):
            raise ConfigError(
                "EVENTFOLD_CONNECT_DATABASE_PASSWORD must be a Kafka Connect config provider "
                "reference such as ${file:/etc/kafka/secrets.properties:password}, not the "
                "password itself (Connect would store it in clear in its config topic)")

    @cached_property
    def kafka_client_settings(self) -> dict[str, str]:
        return parse_key_values(self.kafka_config, "EVENTFOLD_KAFKA_CONFIG entry")

    @cached_property
    def spark_settings(self) -> dict[str, str]:
        """Spark settings of projection processes (spark-submit's own ``--conf`` win)."""
        return parse_key_values(self.spark_conf, "EVENTFOLD_SPARK_CONF entry")

    @cached_property
    def kafka(self) -> KafkaConnection:
        """The broker and the client settings every Kafka client of this process uses."""
        return KafkaConnection.of(self.kafka_bootstrap, self.kafka_client_settings)

    def local_stack(self, data_dir: Path | None = None) -> LocalStack:
        """The local stack in ``data_dir`` (default: the stack directory), its broker taking
        the credentials this process's Kafka clients log in with."""
        from eventfold.local_stack import LocalStack
        from eventfold.local_stack.auth import ClientAuth

        settings = self.kafka_client_settings
        auth = ClientAuth.of(self.kafka.java_config(), settings.get("sasl.username", ""),
                             settings.get("sasl.password", ""))
        return LocalStack(data_dir or self.stack_dir, auth)

    @cached_property
    def replication(self) -> Replication:
        return Replication.parse(self.replication_factor, self.min_insync_replicas)

    def fill(self, package_settings: type[PackageSettings], **given: Any) -> PackageSettings:
        """A package's own settings (a dataclass: ``RunnerSettings``, ``ReadApiOptions``)
        made from these: each of its fields named as a setting of this class (``kafka`` and
        ``replication`` parsed) takes that setting's value, ``given`` the rest, and a field
        neither names keeps its default. So a package's new setting is a field there and a
        row of docs/configuration.md, never a line copying it here."""
        names = {f.name for f in dataclasses.fields(package_settings)}  # type: ignore[arg-type]
        taken = {name: getattr(self, name) for name in names - set(given)
                 if name in type(self).model_fields or isinstance(
                     getattr(type(self), name, None), property | cached_property)}
        return package_settings(**taken, **given)

    def per_http_worker(self, per_instance: int) -> int:
        """A worker's share of what an instance is given (its database pool, its block
        cache), as Kafka Streams divides its cache among its stream threads."""
        return -(-per_instance // max(self.http_workers, 1))

    def with_local_stack(self) -> Settings:
        """Fill unset endpoints from the running local stack's state file."""
        if self.database_url and self.kafka_bootstrap and self.connect_url:
            return self
        state_path = self.stack_dir / "stack.json"
        try:
            state = json.loads(state_path.read_text())
        except FileNotFoundError:
            raise ConfigError(
                "no endpoints configured: set EVENTFOLD_DATABASE_URL, EVENTFOLD_KAFKA_BOOTSTRAP "
                f"and EVENTFOLD_CONNECT_URL, or start the local stack (`eventfold stack up`; "
                f"looked for {state_path})"
            ) from None
        return self.replace(
            database_url=self.database_url or state["database_url"],
            kafka_bootstrap=self.kafka_bootstrap or state["kafka_bootstrap"],
            connect_url=self.connect_url or state["connect_url"],
            kafka_config=self.kafka_config if self.kafka_bootstrap else self._trusting(
                state.get("kafka_ca_location", "")),
        )

    def _trusting(self, ca_location: str) -> str:
        """The Kafka client settings, trusting the local stack's CA (a broker that takes
        SASL_SSL) unless they name a trust store of their own."""
        if not ca_location or "ssl.ca.location" in self.kafka_client_settings:
            return self.kafka_config
        entry = "ssl.ca.location=" + ca_location.replace(",", "\\,")
        return f"{self.kafka_config},{entry}" if self.kafka_config else entry

    def replace(self, **changes: object) -> Settings:
        """A copy with ``changes``, validated (and its derived values computed) anew."""
        return type(self)(**{**self.model_dump(), **changes})

    @property
    def database_url_for_connect(self) -> str:
        return self.connect_database_url or self.database_url


def _explain(error: ValidationError, given: Mapping[str, Any], env: Mapping[str, str],
             from_file: Mapping[str, object], file_path: Path | None) -> str:
    """What is wrong, naming where each bad value came from."""
    problems = []
    for problem in error.errors():
        name = str(problem["loc"][0]) if problem["loc"] else ""
        variable = f"EVENTFOLD_{name.upper()}"
        if name in given:
            where, raw = f"Settings({name}=...)", given[name]
        elif env.get(variable):
            where, raw = variable, env[variable]
        elif name in from_file:
            where, raw = f"{name} in {file_path}", from_file[name]
        else:
            where, raw = name, problem.get("input")
        field = Settings.model_fields.get(name)
        kind = field.annotation if field is not None else None
        wanted = _KINDS.get(kind, getattr(kind, "__name__", "")) if isinstance(kind, type) else ""
        if problem["type"] == "greater_than_equal":
            wanted = f"{wanted} of at least {problem['ctx']['ge']}"
        problems.append(f"{where} must be {wanted}, not {raw!r}" if wanted
                        else f"{where}: {problem['msg']}")
    return "; ".join(problems)
