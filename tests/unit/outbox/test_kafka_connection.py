"""Client settings reach every Kafka client, Python and Java, from one place."""

import pickle

import pytest
from confluent_kafka import KafkaError, KafkaException

from eventfold.config import ConfigError, Settings
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.outbox.topics import Replication, ReplicationUnavailable

SCRAM = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
         "sasl.username": "app", "sasl.password": 'pa"ss'}


def test_python_clients_get_the_settings_as_given() -> None:
    kafka = KafkaConnection.of("b:9092", {**SCRAM, "java.ssl.engine.factory.class": "X",
                                          "librdkafka.debug": "security"})
    assert kafka.client_config(**{"linger.ms": 5}) == {
        "bootstrap.servers": "b:9092", **SCRAM, "debug": "security", "linger.ms": 5}


def test_java_clients_get_a_login_module_and_a_pem_trust_store() -> None:
    kafka = KafkaConnection.of("b:9092", {**SCRAM, "ssl.ca.location": "/ca.pem",
                                          "java.client.dns.lookup": "use_all_dns_ips",
                                          "librdkafka.debug": "all"})
    assert kafka.java_config() == {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule '
                            'required username="app" password="pa\\"ss";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": "/ca.pem",
        "client.dns.lookup": "use_all_dns_ips"}


def test_a_connection_reaches_executors_whole() -> None:
    kafka = KafkaConnection.of("b:9092", SCRAM)
    assert pickle.loads(pickle.dumps(kafka)) == kafka


def test_the_password_never_shows_in_a_repr() -> None:
    assert 'pa"ss' not in repr(KafkaConnection.of("b:9092", SCRAM))


def test_settings_read_the_client_config_from_one_variable() -> None:
    settings = Settings.from_env({
        "EVENTFOLD_KAFKA_BOOTSTRAP": "b:9092",
        "EVENTFOLD_KAFKA_CONFIG": "security.protocol=SASL_PLAINTEXT, sasl.mechanism=PLAIN,"
                                  "sasl.username=u,sasl.password=p=w"})
    assert settings.kafka.client_config()["sasl.password"] == "p=w"
    escaped = Settings.from_env({"EVENTFOLD_KAFKA_CONFIG": r"ssl.cipher.suites=A\,B,acks=all"})
    assert escaped.kafka_client_settings == {"ssl.cipher.suites": "A,B", "acks": "all"}
    with pytest.raises(ConfigError, match="EVENTFOLD_KAFKA_CONFIG entry 'oops' is not"):
        Settings.from_env({"EVENTFOLD_KAFKA_CONFIG": "oops"})


@pytest.mark.parametrize("value", ["hunter2", "${file:/x:y"])
def test_the_connect_database_password_must_be_a_provider_reference(value) -> None:
    with pytest.raises(ConfigError, match="config provider reference") as raised:
        Settings.from_env({"EVENTFOLD_CONNECT_DATABASE_PASSWORD": value})
    assert value not in str(raised.value)


def test_replication_defaults_to_what_the_cluster_holds() -> None:
    default = Replication()
    assert default.for_kind("events", brokers=1) == (1, 1)
    assert default.for_kind("ktables", brokers=2) == (2, 1)
    assert default.for_kind("derived", brokers=5) == (3, 2)


def test_replication_per_kind_of_topic() -> None:
    replication = Replication.parse("events=3,ktables=2", "events=2")
    assert replication.for_kind("events", brokers=5) == (3, 2)
    assert replication.for_kind("ktables", brokers=5) == (2, 1)
    assert replication.for_kind("dead_letters", brokers=5) == (3, 2)
    assert Replication.parse("2").for_kind("derived", brokers=1) == (2, 1)
    with pytest.raises(ValueError, match="unknown topic kind"):
        Replication.parse("event=3")
    with pytest.raises(ReplicationUnavailable, match="more than their replication factor"):
        Replication.parse("1", "2").for_kind("events", 3)
    with pytest.raises(ConfigError, match="whole numbers"):
        Settings.from_env({"EVENTFOLD_REPLICATION_FACTOR": "three"})


@pytest.mark.parametrize("code", [KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH,
                                  KafkaError.NOT_LEADER_FOR_PARTITION])
def test_offsets_are_asked_again_while_a_restarted_broker_catches_up(code: int) -> None:
    """A broker just restarted answers with epoch errors until its metadata catches up with
    the client's: asked again, not failed on. Other errors fail at once."""
    planner = OffsetPlanner(KafkaConnection.of("127.0.0.1:9"), timeout_s=5)
    answers = iter([code, code, None])

    def ask() -> str:
        error = next(answers)
        if error is not None:
            raise KafkaException(KafkaError(error))
        return "offsets"
    try:
        assert planner._while_electing(ask) == "offsets"

        def refused() -> str:
            raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
        with pytest.raises(KafkaException):
            planner._while_electing(refused)
    finally:
        planner.close()
