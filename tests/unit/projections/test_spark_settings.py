"""Where a projection process's Spark settings come from: the launch first (spark-submit,
spark-defaults.conf), then EVENTFOLD_SPARK_* settings, then our defaults."""

from __future__ import annotations

import pytest

from eventfold.config import ConfigError, Settings
from eventfold.contract import split_password
from eventfold.projections.execution.spark import (
    DEFAULTS,
    IDLE_PYTHON_WORKERS,
    LIVE_POOL,
    REPLAY_POOL,
    session_conf,
    spark_defaults,
)
from eventfold.projections.run_settings import EXECUTOR_PASSWORD
from eventfold.wiring import spark_conf


def test_the_launch_wins_over_settings_which_win_over_defaults() -> None:
    conf = session_conf("spark://cluster:7077",
                        {"spark.sql.shuffle.partitions": "16", "spark.ui.enabled": "true"},
                        {"spark.master": "yarn", "spark.ui.enabled": "false"},
                        app_name="eventfold-totals")
    assert "spark.master" not in conf  # spark-submit --master yarn stays
    assert "spark.ui.enabled" not in conf  # so does its --conf
    assert conf["spark.sql.shuffle.partitions"] == "16"
    assert conf["spark.app.name"] == "eventfold-totals"
    assert conf["spark.python.worker.reuse"] == DEFAULTS["spark.python.worker.reuse"]


def test_without_a_launch_the_settings_apply() -> None:
    conf = session_conf("spark://cluster:7077", {}, {})
    assert conf["spark.master"] == "spark://cluster:7077"
    assert DEFAULTS.items() <= conf.items()


def test_spark_defaults_file_is_read(tmp_path, monkeypatch) -> None:
    (tmp_path / "spark-defaults.conf").write_text(
        "# a comment\nspark.master  spark://h:7077\nspark.executor.memory=4g\n"
        "spark.driver.extraJavaOptions -Da=1 -Db=2\n\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert spark_defaults() == {"spark.master": "spark://h:7077",
                                "spark.executor.memory": "4g",
                                "spark.driver.extraJavaOptions": "-Da=1 -Db=2"}


def test_spark_settings_parse_and_fail_clearly() -> None:
    settings = Settings.from_env({"EVENTFOLD_SPARK_CONF":
                                  "spark.executor.memory=2g,spark.submit.pyFiles=a.zip\\,b.zip"})
    assert settings.spark_settings == {"spark.executor.memory": "2g",
                                       "spark.submit.pyFiles": "a.zip,b.zip"}
    with pytest.raises(ConfigError, match="EVENTFOLD_SPARK_CONF"):
        Settings.from_env({"EVENTFOLD_SPARK_CONF": "spark.executor.memory"})


def test_executors_get_the_database_password_from_their_environment() -> None:
    url = "postgresql+psycopg://app:s3cret@db.internal:5432/events"
    assert split_password(url) == ("postgresql+psycopg://app@db.internal:5432/events", "s3cret")
    assert spark_conf(Settings(database_url=url))[EXECUTOR_PASSWORD] == "s3cret"
    assert EXECUTOR_PASSWORD not in spark_conf(Settings(database_url=url.replace(":s3cret", "")))
    given = Settings(database_url=url, spark_conf="spark.executorEnv.PGPASSWORD=other")
    assert spark_conf(given)[EXECUTOR_PASSWORD] == "other"


def test_a_local_master_keeps_two_idle_python_workers_per_core() -> None:
    assert session_conf("local[3]", {}, {})[IDLE_PYTHON_WORKERS] == "6"
    assert session_conf("local", {}, {})[IDLE_PYTHON_WORKERS] == "2"
    assert IDLE_PYTHON_WORKERS not in session_conf("spark://cluster:7077", {}, {})
    assert session_conf("local[3]", {IDLE_PYTHON_WORKERS: "9"}, {})[IDLE_PYTHON_WORKERS] == "9"


def test_live_batches_share_one_pool_served_before_the_replays() -> None:
    """The allocation file Eventfold sets declares the pools the host uses: live batches in
    one FIFO pool (served in the order they came, whatever the projection's name), ahead of
    the replays' pool; a team's own file wins."""
    import xml.etree.ElementTree as ET
    from pathlib import Path

    allocation = session_conf("local[2]", {}, {})["spark.scheduler.allocation.file"]
    pools = {p.get("name"): {c.tag: c.text for c in p}
             for p in ET.parse(Path(allocation)).getroot()}
    assert set(pools) == {LIVE_POOL, REPLAY_POOL}
    assert pools[LIVE_POOL]["schedulingMode"] == pools[REPLAY_POOL]["schedulingMode"] == "FIFO"
    assert int(pools[LIVE_POOL]["minShare"]) >= 10_000 > int(pools[REPLAY_POOL]["minShare"])
    mine = {"spark.scheduler.allocation.file": "/etc/spark/pools.xml"}
    assert session_conf("local[2]", mine, {})["spark.scheduler.allocation.file"] == (
        "/etc/spark/pools.xml")


def test_the_pools_file_is_on_disk_when_eventfold_runs_from_a_zip(tmp_path) -> None:
    """``spark-submit --py-files eventfold.zip``: the driver imports Eventfold from the zip,
    where Spark's scheduler cannot read the file; it gets a copy on disk."""
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    from tests.packaging import ROOT

    shipped = tmp_path / "eventfold.zip"
    with zipfile.ZipFile(shipped, "w") as archive:
        for package, folder in (("eventfold", "eventfold"), ("eventfold/outbox", "outbox"),
                                ("eventfold/projections", "projections")):
            for path in (ROOT / folder).rglob("*"):
                if path.suffix in (".py", ".xml") and "__pycache__" not in path.parts:
                    archive.write(path, f"{package}/{path.relative_to(ROOT / folder)}")
    found = subprocess.run(
        [sys.executable, "-c", "import eventfold.projections.execution.spark as s; "
         "print(s.__file__); print(s.pools_file())"],
        env={"PYTHONPATH": str(shipped), "PATH": "/usr/bin:/bin"}, cwd=tmp_path,
        capture_output=True, text=True, check=True, timeout=120)
    module, pools = found.stdout.split()
    assert module.startswith(str(shipped))  # imported from the zip
    assert Path(pools).is_file() and not pools.startswith(str(shipped))
    assert Path(pools).read_bytes() == (ROOT / "projections/execution/pools.xml").read_bytes()


def test_a_local_driver_maps_the_class_archive_only_when_it_was_built(tmp_path,
                                                                      monkeypatch) -> None:
    from eventfold.projections.execution.class_archive import (
        DRIVER_JAVA_OPTIONS,
        archive_path,
        driver_java_option,
    )

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert archive_path().parent == tmp_path / "eventfold"
    assert driver_java_option(master_is_local=True) == {}  # not built: nothing changes
    archive_path().parent.mkdir(parents=True)
    archive_path().write_bytes(b"")
    assert driver_java_option(master_is_local=True) == {
        DRIVER_JAVA_OPTIONS: f"-XX:SharedArchiveFile={archive_path()}"}
    assert driver_java_option(master_is_local=False) == {}  # a cluster's driver may be elsewhere
