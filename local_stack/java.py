"""The Java side of the local stack: the jars ``scripts/setup.sh`` fetched from Maven Central
(``local_stack/pom.xml``: Apache Kafka 4.1.1, its Connect runtime, Debezium 3.3.2) and a
Java 17 runtime to run them. Nothing is downloaded here."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from eventfold.local_stack.process import StackError

JARS_DIR = Path(__file__).resolve().parent / "jars"
SPARK_KAFKA_JARS_DIR = Path(__file__).resolve().parent / "spark_kafka" / "jars"

LOG4J2_TEMPLATE = """\
status = warn
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c{{1}})%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
{loggers}"""


def jars_dir() -> Path:
    configured = os.environ.get("EVENTFOLD_JARS_DIR")
    return Path(configured) if configured else JARS_DIR


def classpath() -> str:
    """Every fetched jar: the broker, Connect and Debezium share one pinned set."""
    directory = jars_dir()
    jars = sorted(directory.glob("*.jar"))
    if not any(j.name.startswith("kafka_2.13-") for j in jars):
        raise StackError(
            f"no Kafka jars in {directory}: run scripts/setup.sh, which fetches them once with "
            "`mvn -f local_stack/pom.xml dependency:copy-dependencies` (or set "
            "EVENTFOLD_JARS_DIR)")
    return ":".join(str(j) for j in jars)


def spark_kafka_jars() -> list[Path]:
    """The jars of Spark's Kafka source that setup fetched (``spark_kafka/pom.xml``), for
    ``spark.jars``; none when it did not run."""
    return sorted(SPARK_KAFKA_JARS_DIR.glob("*.jar"))


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not candidate or not Path(candidate).exists():
        raise StackError(
            "Java not found: Kafka and Kafka Connect need Java 17 "
            "(`apt-get install openjdk-17-jre-headless`) or JAVA_HOME set"
        )
    return candidate


def log4j_config(path: Path, info_loggers: dict[str, str]) -> Path:
    """A log4j2 file: WARN and above, plus INFO for ``info_loggers`` (name -> logger)."""
    loggers = "".join(f"logger.{key}.name = {name}\nlogger.{key}.level = info\n"
                      for key, name in info_loggers.items())
    path.write_text(LOG4J2_TEMPLATE.format(loggers=loggers))
    return path
