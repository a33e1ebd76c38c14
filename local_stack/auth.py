"""How the local stack's Kafka clients authenticate: not at all (PLAINTEXT), or with one SCRAM
user over SASL_PLAINTEXT or SASL_SSL. The broker is formatted with that user, authenticates
its own inter-broker traffic as it, and the Connect worker logs in as it. Over SASL_SSL every
client trusts the stack's own CA (``local_stack.tls``).

The settings arrive in Java's names (``eventfold`` translates the pipeline's client settings);
nothing here knows the Python clients.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from eventfold.local_stack.process import StackError

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
CLIENT_PREFIXES = ("", "producer.", "consumer.", "admin.")
"""A Connect worker's own clients, its connectors' producers and consumers, and its admin
client each read their settings under their own prefix."""


@dataclass(frozen=True)
class ClientAuth:
    java_config: tuple[tuple[str, str], ...] = ()
    username: str = ""
    password: str = ""

    @classmethod
    def of(cls, java_config: Mapping[str, str], username: str = "",
           password: str = "") -> ClientAuth:
        auth = cls(tuple(sorted(java_config.items())), username, password)
        auth.check()
        return auth

    @property
    def protocol(self) -> str:
        return dict(self.java_config).get("security.protocol", "PLAINTEXT").upper()

    @property
    def mechanism(self) -> str:
        return dict(self.java_config).get("sasl.mechanism", "").upper()

    @property
    def sasl(self) -> bool:
        return self.protocol in SASL_PROTOCOLS

    @property
    def tls(self) -> bool:
        return self.protocol == "SASL_SSL"

    def trusting(self, ca_location: Path) -> ClientAuth:
        """These settings with the stack's CA as the trust store: the local broker's
        certificate is signed by it and by nothing a client may have been given."""
        config = dict(self.java_config)
        given = config.setdefault("ssl.truststore.location", str(ca_location))
        if Path(given).resolve() != ca_location.resolve():
            raise StackError(
                f"the local broker's certificate is signed by the stack's own CA, "
                f"{ca_location}; leave ssl.ca.location unset (clients of the local stack trust "
                f"that CA) or set it to that file, not {given}")
        config["ssl.truststore.type"] = "PEM"
        return ClientAuth.of(config, self.username, self.password)

    def check(self) -> None:
        if self.protocol == "PLAINTEXT":
            return
        if not self.sasl or self.mechanism not in SCRAM_MECHANISMS or not self.username:
            raise StackError(
                f"the local broker takes PLAINTEXT, or {' or '.join(SASL_PROTOCOLS)} with "
                f"{' or '.join(SCRAM_MECHANISMS)} and sasl.username/sasl.password; got "
                f"security.protocol={self.protocol} sasl.mechanism={self.mechanism or '-'} "
                "(for other setups, point EVENTFOLD_KAFKA_BOOTSTRAP at a cluster of your own)")
        unsafe = [c for c in ',[]="' if c in self.username + self.password]
        if unsafe:
            raise StackError(f"the local broker's SCRAM user and password cannot hold "
                             f"{' '.join(unsafe)} (the storage tool's --add-scram syntax)")

    def worker_config(self) -> dict[str, str]:
        """The settings for every client of a Connect worker."""
        return {f"{prefix}{key}": value for prefix in CLIENT_PREFIXES
                for key, value in self.java_config}

    def describe(self) -> dict[str, str]:
        """What a broker's data remembers of how it was formatted (no password)."""
        return {"protocol": self.protocol, "mechanism": self.mechanism,
                "username": self.username if self.sasl else ""}

    def check_matches(self, record: Path) -> None:
        """Refuse to start a broker formatted for other credentials: its SCRAM users live in
        its metadata log, written once at format time."""
        try:
            formatted = json.loads(record.read_text())
        except FileNotFoundError:
            formatted = ClientAuth().describe()
        if formatted != self.describe():
            raise StackError(
                f"this stack's broker was created for {formatted}, and the Kafka client "
                f"settings now ask for {self.describe()}: run `eventfold stack reset` to "
                "recreate the stack with them (it deletes the stack's data), or use another "
                "EVENTFOLD_STACK_DIR")
