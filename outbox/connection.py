"""How to reach a Kafka cluster: its bootstrap servers and the client settings every Kafka
client Eventfold creates gets (``security.protocol``, ``sasl.*``, ``ssl.*``, timeouts...).

The settings are written once, in librdkafka's names (the Python clients'). The Java clients
(the local stack's Connect worker and broker) get them translated where the two differ:
``sasl.username``/``sasl.password`` become a ``sasl.jaas.config`` login module,
``ssl.ca.location`` a PEM trust store. A key prefixed ``java.`` goes to Java clients only and
one prefixed ``librdkafka.`` to Python clients only, for settings that exist on one side.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JAVA_ONLY = "java."
LIBRDKAFKA_ONLY = "librdkafka."
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    **{m: "org.apache.kafka.common.security.scram.ScramLoginModule" for m in SCRAM_MECHANISMS},
}
_SECRET_WORDS = ("password", "secret", "jaas", "key.pem", "token")


def parse_key_values(text: str, what: str = "setting") -> dict[str, str]:
    """``"a.b=1,c=x"`` as a dict; '' is {}. A value may hold ``=``, and a comma written
    ``\\,`` (``ssl.cipher.suites=A\\,B``)."""
    config: dict[str, str] = {}
    parts = (part.replace("\\,", ",").strip() for part in re.split(r"(?<!\\),", text))
    for item in filter(None, parts):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} {item!r} is not key=value")
        config[key.strip()] = value.strip()
    return config


def is_secret(key: str) -> bool:
    """Whether a config key holds a credential that is never printed."""
    return any(word in key.lower() for word in _SECRET_WORDS)


def is_provider_reference(value: str) -> bool:
    """Whether ``value`` names a secret for Kafka Connect's config providers to resolve
    (``${file:/path:key}``, ``${env:NAME}``) rather than holding it."""
    return value.startswith("${") and value.endswith("}")


def redact(config: Mapping[str, str]) -> dict[str, str]:
    """``config`` fit to print: credentials masked, except config provider references
    (``${file:...}``), which name where the secret is, not the secret."""
    return {key: "****" if is_secret(key) and value and not is_provider_reference(value)
            else value
            for key, value in config.items()}


@dataclass(frozen=True)
class KafkaConnection:
    """Bootstrap servers plus client settings; hashable, so a process can keep one client per
    connection, and picklable, so Spark tasks get it in their closure."""

    bootstrap_servers: str
    settings: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, bootstrap_servers: str,
           settings: Mapping[str, str] | None = None) -> KafkaConnection:
        return cls(bootstrap_servers, tuple(sorted((settings or {}).items())))

    @property
    def protocol(self) -> str:
        return dict(self.settings).get("security.protocol", "PLAINTEXT").upper()

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """The librdkafka config of a Python producer, consumer or admin client."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        for key, value in self.settings:
            if not key.startswith(JAVA_ONLY):
                config[key.removeprefix(LIBRDKAFKA_ONLY)] = value
        return {**config, **overrides}

    def java_config(self) -> dict[str, str]:
        """The same settings for a Java client (without ``bootstrap.servers``)."""
        given = {k: v for k, v in self.settings if not k.startswith(LIBRDKAFKA_ONLY)}
        config = {k.removeprefix(JAVA_ONLY): v for k, v in given.items()
                  if k not in ("sasl.username", "sasl.password", "sasl.mechanisms",
                               "ssl.ca.location")}
        mechanism = given.get("sasl.mechanism", given.get("sasl.mechanisms", ""))
        if mechanism:
            config["sasl.mechanism"] = mechanism
        if "sasl.username" in given and "sasl.jaas.config" not in config:
            config["sasl.jaas.config"] = jaas_login(mechanism or "PLAIN", given["sasl.username"],
                                                    given.get("sasl.password", ""))
        if "ssl.ca.location" in given:
            config.setdefault("ssl.truststore.type", "PEM")
            config.setdefault("ssl.truststore.location", given["ssl.ca.location"])
        return config

    def __repr__(self) -> str:
        return (f"KafkaConnection({self.bootstrap_servers!r}, "
                f"{redact(dict(self.settings))!r})")


def jaas_login(mechanism: str, username: str, password: str) -> str:
    """A ``sasl.jaas.config`` value logging in as ``username`` with ``mechanism``."""
    module = _LOGIN_MODULES.get(mechanism.upper())
    if module is None:
        raise ValueError(f"no login module for SASL mechanism {mechanism!r}; set "
                         "java.sasl.jaas.config yourself")
    return f'{module} required username="{_quoted(username)}" password="{_quoted(password)}";'


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
