"""A class-data archive for the local Spark driver (Java's application class-data sharing).

A local Spark driver loads and verifies some fifteen thousand classes from Spark's jars before
its first job, and every ``projection run`` process starts one. ``build`` runs a small local
job in a JVM that writes, as it exits, the classes it loaded (``-XX:ArchiveClassesAtExit``);
a later local driver maps that file instead (``-XX:SharedArchiveFile``) and starts sooner
(docs/deployment.md, "A local driver's start", has the figures). Set-up builds it once per
Java and Spark install (``scripts/setup.sh``, ``eventfold stack install``); without it
nothing changes. The
options and the recording's handling are those of every JVM Eventfold starts
(``eventfold.contract.class_data``); a stale archive is ignored, and the build again replaces
it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from eventfold.contract.class_data import (
    clear_abandoned_recordings,
    find_java,
    keep_recording,
    mapping_options,
    recording_of,
    recording_options,
)

log = logging.getLogger(__name__)

DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def archive_path() -> Path:
    """Where the archive of this Java and Spark install lives, in the user's cache
    (``XDG_CACHE_HOME``, else ``~/.cache``)."""
    from pyspark import __version__ as pyspark_version
    from pyspark.find_spark_home import _find_spark_home as find_spark_home

    install = "\0".join((os.path.realpath(find_java() or ""),
                         os.path.realpath(find_spark_home()), pyspark_version))
    key = hashlib.sha256(install.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "eventfold" / f"spark-driver-{key}.jsa"


def driver_java_option(master_is_local: bool) -> dict[str, str]:
    """The driver option that maps the archive, for a local master when the archive exists."""
    if not master_is_local:
        return {}  # a cluster's driver may run on another host, without the file
    options = mapping_options(archive_path())
    return {DRIVER_JAVA_OPTIONS: " ".join(options)} if options else {}


def build(force: bool = False) -> tuple[Path, float | None]:
    """The archive, built unless present (or ``force``); with the seconds the build took, None
    when it was present."""
    archive = archive_path()
    if archive.is_file() and not force:
        return archive, None
    archive.parent.mkdir(parents=True, exist_ok=True)
    clear_abandoned_recordings(archive)
    recording = recording_of(archive)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", __name__, str(recording)],
                            capture_output=True, text=True, timeout=600, check=False)
    said = (result.stdout + result.stderr)[-2000:]
    if result.returncode != 0:
        recording.unlink(missing_ok=True)
        raise RuntimeError(f"the Spark driver's class archive was not written: {said}")
    keep_recording(recording, archive, said)
    return archive, time.monotonic() - started


def _dump(recording: str) -> None:
    """A local job touching what a projection batch uses (SQL, code generation, a shuffle,
    Arrow both ways); the JVM writes ``recording`` as it exits."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession, functions

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (SparkSession.builder.master("local[2]").appName("eventfold-class-archive")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config(DRIVER_JAVA_OPTIONS, " ".join(recording_options(Path(recording))))
               .getOrCreate())
    frame = session.range(10_000).selectExpr("cast(id % 97 as string) as key", "id as value")
    frame.groupBy("key").agg(functions.sum("value"), functions.max("value")).collect()
    frame.mapInArrow(lambda batches: batches, frame.schema).toPandas()
    gateway = SparkContext._gateway
    session.stop()
    if gateway is not None and gateway.proc is not None:
        gateway.shutdown()
        gateway.proc.stdin.close()
        gateway.proc.wait(timeout=300)  # the dump is at exit


if __name__ == "__main__":
    _dump(sys.argv[1])
