"""The SparkSession for projection jobs: any master, our Kafka data source registered.

Where a setting comes from, strongest first:

1. how Spark was launched: ``spark-submit --master ... --conf k=v`` and ``spark-defaults.conf``;
2. what the caller passes (``EVENTFOLD_SPARK_MASTER``, ``EVENTFOLD_SPARK_CONF``);
3. ``DEFAULTS`` below.

So a team tunes Spark the way it tunes any Spark application, and none of our defaults is
fixed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from pyspark import SparkConf, SparkContext
from pyspark.find_spark_home import _find_spark_home as find_spark_home
from pyspark.sql import SparkSession

from eventfold.projections.execution.class_archive import driver_java_option

log = logging.getLogger(__name__)

DEFAULTS: Mapping[str, str] = {
    # The projection process has its own status and metrics; a team that wants Spark's UI
    # turns it on.
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Shuffles happen only on fallback paths (a key in two partitions, re-keying) and carry
    # one row per key: a few partitions suffice.
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
    "spark.sql.streaming.stopTimeout": "30s",
    # A projection host's live batches share one pool, served in the order they came, before
    # the replays' pool (pools.xml says why; session_conf points at it): a team's own
    # allocation file replaces ours.
    "spark.scheduler.mode": "FAIR",
    # Kafka client options (kafka.sasl.jaas.config...) and database URLs are masked wherever
    # Spark prints a plan's options (UI, logs); Spark's default masks only "url".
    "spark.sql.redaction.options.regex": "(?i)url|jaas|password|secret|token|sasl",
}


ALLOCATION_FILE = "spark.scheduler.allocation.file"
LIVE_POOL, REPLAY_POOL = "live", "replays"
"""The pools of ``pools.xml``; a thread's jobs go to one through ``SCHEDULER_POOL``."""
SCHEDULER_POOL = "spark.scheduler.pool"


def pools_file() -> str:
    """``pools.xml`` on disk, where Spark's scheduler can read it: the package's own file, or,
    when Eventfold is imported from a zip (``spark-submit --py-files``), a copy of it in the
    temporary directory."""
    here = Path(__file__).with_name("pools.xml")
    if here.is_file():
        return str(here)
    content = resources.files(__package__ or __name__).joinpath("pools.xml").read_bytes()
    digest = hashlib.sha256(content).hexdigest()[:16]
    copy = Path(tempfile.gettempdir()) / f"eventfold-pools-{digest}.xml"
    if not copy.is_file():
        partial = copy.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(content)
        partial.replace(copy)  # whole or not at all, whoever else writes it
    return str(copy)


def launch_conf() -> dict[str, str]:
    """The settings Spark is launched with, before any of ours: under spark-submit, all of
    them (``--master``, ``--conf``, ``--name``, ``spark-defaults.conf``); in a plain Python
    process, ``spark-defaults.conf`` (the JVM starts with the builder's settings, so that
    ``spark.jars`` and driver options still apply)."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # spark-submit started this process and its JVM
        SparkContext._ensure_initialized()
        return dict(SparkConf().getAll())
    return spark_defaults()


def spark_defaults() -> dict[str, str]:
    """``spark-defaults.conf`` of ``SPARK_CONF_DIR`` (or of the Spark home's ``conf``)."""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or str(Path(find_spark_home()) / "conf")
    path = Path(conf_dir) / "spark-defaults.conf"
    if not path.is_file():
        return {}
    settings: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, *value = re.split(r"\s*[=\s]\s*", line.strip(), maxsplit=1)
            settings[key] = value[0] if value else ""
    return settings


def session_conf(master: str, extra_conf: Mapping[str, str], launched: Mapping[str, str],
                 app_name: str = "") -> dict[str, str]:
    """What the builder sets: ours, less what the launch already decided."""
    wanted = {**DEFAULTS, ALLOCATION_FILE: pools_file(), "spark.master": master, **extra_conf}
    if app_name:
        wanted.setdefault("spark.app.name", app_name)
    if (cores := local_cores(master)) is not None:
        # Idle Python workers are kept for reuse, without a bound by default: a host's queries
        # left a dozen of them idle on two cores. Two per core is all tasks can use at once.
        wanted.setdefault(IDLE_PYTHON_WORKERS, str(2 * cores))
    return {k: v for k, v in wanted.items() if k not in launched}


IDLE_PYTHON_WORKERS = "spark.python.factory.idleWorkerMaxPoolSize"


def local_cores(master: str) -> int | None:
    """The cores of a ``local[N]`` (or ``local``, ``local[*]``) master; None for a cluster's."""
    found = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master)
    if found is None:
        return None
    if found[1] is None:
        return 1
    return os.cpu_count() or 1 if found[1] == "*" else int(found[1])


def spark_session(master: str = "local[2]", app_name: str = "eventfold",
                  extra_conf: Mapping[str, str] | None = None,
                  log_level: str = "ERROR") -> SparkSession:
    """Build (or get) the session. The launch's settings win over ``master``, ``extra_conf``
    and ``DEFAULTS``, in this order."""
    # Executors must run the interpreter that has Eventfold and its dependencies installed,
    # unless the cluster says which (spark.pyspark.python, PYSPARK_PYTHON on its hosts).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    launched = launch_conf()
    # A user's own driver options replace the archive's, as any of their settings does ours.
    extra = {**driver_java_option(local_cores(master) is not None), **(extra_conf or {})}
    builder = SparkSession.builder
    for key, value in session_conf(master, extra, launched, app_name).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    log.info("Spark master %s%s", session.sparkContext.master,
             f"; kept from the launch: {', '.join(sorted(launched))}" if launched else "")
    session.sparkContext.setLogLevel(log_level)
    return session
