"""The Java side of the local stack: the jars fetched from Maven Central at set-up
(``local_stack/pom.xml``: Apache Kafka 4.1.1, its Connect runtime, Debezium 3.3.2), and a
Java 17 runtime to run them. ``scripts/setup.sh`` fetches them for a checkout and
``eventfold stack install`` for an installed wheel (``install_jars``); nothing is downloaded
while a stack starts or runs."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from eventfold.contract.class_data import (
    find_java,
    mapping_options,
    recording_of,
    recording_options,
)
from eventfold.local_stack.process import StackError

JARS_DIR = Path(__file__).resolve().parent / "jars"


def _run_maven(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise StackError(f"fetching jars failed ({' '.join(command[:5])} ...): "
                         f"{(result.stdout + result.stderr)[-2000:]}")

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


def install_jars(run: Callable[[list[str]], None] = _run_maven) -> list[Path]:
    """Fetch the pinned jars from Maven Central (once; a second call only checks): the stack's
    into ``jars_dir()``. What ``scripts/setup.sh`` does
    for a checkout, for an installed wheel (``eventfold stack install``). Returns the
    directories filled."""
    if shutil.which("mvn") is None:
        raise StackError("Maven (`mvn`) is needed once to fetch the Kafka, Connect and Debezium "
                         "jars: `apt-get install maven`")
    pom, target = JARS_DIR.parent / "pom.xml", jars_dir()
    marker, pinned = target / ".complete", pom_digest(pom)
    if marker.exists() and marker.read_text().strip() == pinned:
        return []
    shutil.rmtree(target, ignore_errors=True)
    run(["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
         f"-DoutputDirectory={target}", "-DincludeScope=runtime"])
    marker.write_text(pinned + "\n")
    return [target]


def pom_digest(pom: Path) -> str:
    """What a jars directory's ``.complete`` marker holds: the SHA-256 of the pom it was
    filled from (``scripts/setup.sh`` writes the same). By content, not by time: an installed
    wheel's pom is as new as the install, and a checkout's jars it points at
    (``EVENTFOLD_JARS_DIR``) are the same pins."""
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def classpath() -> str:
    """Every fetched jar: the broker, Connect and Debezium share one pinned set."""
    directory = jars_dir()
    jars = sorted(directory.glob("*.jar"))
    if not any(j.name.startswith("kafka_2.13-") for j in jars):
        raise StackError(
            f"no Kafka jars in {directory}: fetch them once with `eventfold stack install` "
            "(scripts/setup.sh does, in a checkout), or set EVENTFOLD_JARS_DIR")
    return ":".join(str(j) for j in jars)


STACK_ROLES = ("broker", "connect")
"""The stack's JVMs that have a class-data archive each."""


def class_archive(role: str) -> Path:
    """The class-data archive of the stack's ``role`` JVM (``STACK_ROLES``), beside the jars it
    was recorded from: fetching them again removes it."""
    return jars_dir() / f"{role}.jsa"


def class_data_options(role: str, record: bool = False) -> list[str]:
    """The JVM options of ``role``: map its archive, or, with ``record``, record it as the JVM
    exits (``eventfold.contract.class_data``)."""
    archive = class_archive(role)
    return recording_options(recording_of(archive)) if record else mapping_options(archive)


def java_binary() -> str:
    java = find_java()
    if java is None:
        raise StackError(
            "Java not found: Kafka and Kafka Connect need Java 17 "
            "(`apt-get install openjdk-17-jre-headless`) or JAVA_HOME set"
        )
    return java


def log4j_config(path: Path, info_loggers: dict[str, str]) -> Path:
    """A log4j2 file: WARN and above, plus INFO for ``info_loggers`` (name -> logger)."""
    loggers = "".join(f"logger.{key}.name = {name}\nlogger.{key}.level = info\n"
                      for key, name in info_loggers.items())
    path.write_text(LOG4J2_TEMPLATE.format(loggers=loggers))
    return path
