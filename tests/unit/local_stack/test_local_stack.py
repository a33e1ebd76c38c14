"""The local stack's failure messages: a person must know what to do next."""

import json
import logging
import socket
from pathlib import Path

import pytest

from eventfold.local_stack import LocalStack, StackError, broker, java, postgres
from eventfold.local_stack.auth import ClientAuth
from eventfold.local_stack.process import free_port, pid_alive, spawn, stop_pid, wait_until


def test_port_in_use_is_reported(tmp_path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(StackError, match=f"port {port} is already in use"):
            node = broker.Node(1, port, free_port())
            broker.start(tmp_path / "kafka", node, [node], broker.new_cluster_id(),
                         tmp_path / "broker.log", ClientAuth())


def test_missing_postgres_binaries_say_how_to_install(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("EVENTFOLD_PG_BIN", str(tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(postgres.glob, "glob", lambda _: [])
    with pytest.raises(StackError, match="apt-get install postgresql"):
        postgres.find_bin_dir()


def test_missing_java_says_how_to_install(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StackError, match="openjdk-17"):
        java.java_binary()


def test_missing_jars_say_how_to_fetch_them(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("EVENTFOLD_JARS_DIR", str(tmp_path))
    with pytest.raises(StackError, match=r"eventfold stack install"):
        java.classpath()


def test_a_process_that_dies_during_start_shows_its_log(tmp_path) -> None:
    log_path = tmp_path / "dies.log"
    process = spawn(["sh", "-c", "echo 'fatal: bad config'; exit 3"], log_path)
    with pytest.raises(StackError, match=r"(?s)exited during start-up.*fatal: bad config"):
        wait_until(lambda: False, what="dies", timeout_s=10, pid=process.pid, log_path=log_path)


def test_stop_pid_escalates_to_sigkill(tmp_path, caplog) -> None:
    log_path = tmp_path / "stubborn.log"
    process = spawn(["sh", "-c", "trap '' TERM; echo ignoring TERM; exec sleep 30"], log_path)
    # The line comes after the trap: SIGTERM from here on is ignored for sure.
    wait_until(lambda: "ignoring TERM" in log_path.read_text(), what="the trap", timeout_s=5)
    with caplog.at_level(logging.INFO, logger="eventfold.local_stack.process"):
        stop_pid(process.pid, what="stubborn", timeout_s=0.5)
    assert not pid_alive(process.pid)
    assert f"stubborn (pid {process.pid}) ignored signal 15 for 0 s; killing it" in caplog.text


def test_status_without_a_stack(tmp_path) -> None:
    assert LocalStack(tmp_path).status() == {"running": False, "data_dir": str(tmp_path),
                                             "data": False}
    assert LocalStack(tmp_path).down() is False  # nothing to stop is not an error


def test_a_port_the_kernel_picks_again_is_not_handed_out_twice(monkeypatch) -> None:
    from eventfold.local_stack import process

    # The kernel's picks, as seen in a CI run that gave a broker and a worker one port.
    picks = iter([56531, 56531, 56531, 56532, 56533, 56533, 56534])
    monkeypatch.setattr(process, "_kernel_picked_port", lambda: next(picks))
    monkeypatch.setattr(process, "_handed_out", set())
    assert [free_port(), free_port(), free_port(avoid={56533})] == [56531, 56532, 56534]


def test_the_stack_directory_is_found_from_below_the_project(tmp_path, monkeypatch) -> None:
    from eventfold.config import Settings, find_stack_dir

    (tmp_path / ".eventfold" / "stack").mkdir(parents=True)
    below = tmp_path / "src" / "deep"
    below.mkdir(parents=True)
    assert find_stack_dir(below) == tmp_path / ".eventfold" / "stack"
    elsewhere = tmp_path.parent / f"{tmp_path.name}-other"
    elsewhere.mkdir()
    assert find_stack_dir(elsewhere) == elsewhere / ".eventfold" / "stack"
    monkeypatch.chdir(below)
    assert Settings.from_env({}).stack_dir == tmp_path / ".eventfold" / "stack"
    assert Settings.from_env({"EVENTFOLD_STACK_DIR": "/x"}).stack_dir == Path("/x")


def test_the_local_broker_refuses_security_it_cannot_serve() -> None:
    with pytest.raises(StackError, match="PLAINTEXT, or SASL_PLAINTEXT or SASL_SSL with SCRAM"):
        ClientAuth.of({"security.protocol": "SSL"})
    with pytest.raises(StackError, match=r"sasl\.mechanism=PLAIN"):
        ClientAuth.of({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}, "u")


def test_clients_of_a_tls_stack_trust_its_own_ca_and_no_other(tmp_path) -> None:
    ca = tmp_path / "stack" / "tls" / "ca.pem"
    sasl_ssl = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}
    trusting = dict(ClientAuth.of(sasl_ssl, "app", "pw").trusting(ca).java_config)
    assert (trusting["ssl.truststore.type"], trusting["ssl.truststore.location"]) == (
        "PEM", str(ca))
    assert ClientAuth.of({**sasl_ssl, "ssl.truststore.location": str(ca)}, "app",
                         "pw").trusting(ca).tls
    with pytest.raises(StackError, match=r"signed by the stack's own CA, .*ca\.pem; leave "
                                         r"ssl\.ca\.location unset .* not /etc/ssl/ours\.pem"):
        ClientAuth.of({**sasl_ssl, "ssl.truststore.location": "/etc/ssl/ours.pem"}, "app",
                      "pw").trusting(ca)


def test_settings_of_a_tls_stack_trust_the_ca_it_names(tmp_path) -> None:
    from eventfold.config import Settings

    stack = tmp_path / "stack"
    stack.mkdir()
    state = {"database_url": "postgresql+psycopg://u@127.0.0.1:1/db",
             "kafka_bootstrap": "127.0.0.1:2", "connect_url": "http://127.0.0.1:3",
             "kafka_ca_location": "/stack,a/tls/ca.pem"}
    (stack / "stack.json").write_text(json.dumps(state))
    env = {"EVENTFOLD_STACK_DIR": str(stack),
           "EVENTFOLD_KAFKA_CONFIG": "security.protocol=SASL_SSL,sasl.username=app"}
    kafka = Settings.from_env(env).with_local_stack().kafka
    assert kafka.client_config()["ssl.ca.location"] == "/stack,a/tls/ca.pem"
    assert kafka.java_config()["ssl.truststore.location"] == "/stack,a/tls/ca.pem"
    own = {**env, "EVENTFOLD_KAFKA_CONFIG": "security.protocol=SASL_SSL,ssl.ca.location=/o.pem"}
    assert Settings.from_env(own).with_local_stack().kafka.client_config()[
        "ssl.ca.location"] == "/o.pem"
    elsewhere = {**env, "EVENTFOLD_KAFKA_BOOTSTRAP": "kafka.example.com:9093"}
    assert "ssl.ca.location" not in Settings.from_env(elsewhere).with_local_stack(
        ).kafka.client_config()


def test_a_broker_formatted_without_credentials_is_not_started_with_them(tmp_path) -> None:
    record = tmp_path / "auth.json"
    ClientAuth().check_matches(record)  # a stack from before credentials: PLAINTEXT
    scram = ClientAuth.of({"security.protocol": "SASL_PLAINTEXT",
                           "sasl.mechanism": "SCRAM-SHA-256"}, "app", "pw")
    with pytest.raises(StackError, match="eventfold stack reset"):
        scram.check_matches(record)


def test_the_stacks_jvms_map_their_class_archives_once_recorded(tmp_path, monkeypatch) -> None:
    from eventfold.contract.class_data import recording_of
    from eventfold.local_stack.java import class_archive, class_data_options

    monkeypatch.setenv("EVENTFOLD_JARS_DIR", str(tmp_path))
    assert class_data_options("broker") == []  # not recorded: started as before
    assert class_data_options("broker", record=True) == [
        f"-XX:ArchiveClassesAtExit={recording_of(class_archive('broker'))}"]
    class_archive("broker").write_bytes(b"")
    assert class_data_options("broker") == [f"-XX:SharedArchiveFile={tmp_path / 'broker.jsa'}"]
    assert class_data_options("connect") == []  # each role its own


def test_a_component_is_not_given_a_port_another_one_saved(monkeypatch) -> None:
    from eventfold.local_stack import process

    saved = {"postgres": free_port(), "connect": free_port()}  # both down: nothing listens
    picks = iter([saved["postgres"], saved["connect"], 1 + max(saved.values())])
    monkeypatch.setattr(process, "_kernel_picked_port", lambda: next(picks))
    monkeypatch.setattr(process, "_handed_out", set())
    assert LocalStack._usable_port("postgres", saved) == saved["postgres"]
    assert LocalStack._usable_port("broker", saved) == 1 + max(saved.values())
