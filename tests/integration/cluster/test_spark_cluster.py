"""Projections on a Spark standalone cluster (a master and two workers of the installed pyspark):
submitted with spark-submit, the application's code and Eventfold shipped to executors that do
not have them, and a worker killed mid-stream without losing or double-counting an event."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from eventfold.local_stack.process import stop_pid
from eventfold.local_stack.spark_cluster import SparkCluster, SparkClusterState, spark_home
from examples import sales
from tests.packaging import ROOT
from tests.pipeline_helpers import (
    folded_total,
    ktable_totals,
    rows,
    sales_totals_of_the_store,
    selling,
    wait_for,
    wait_for_more,
    wait_until_in_topic,
)


@pytest.fixture(scope="module")
def cluster(cluster_stack) -> tuple[SparkCluster, SparkClusterState]:
    """The cluster stack's Spark standalone master and two workers."""
    spark = cluster_stack[0].spark
    state = spark.state()
    assert state is not None
    return spark, state


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, eventfold_wheel) -> dict[str, Path]:
    """What executors get: Eventfold as a zip (its wheel), the application as a zip, and a
    Python that has Eventfold's dependencies but not Eventfold (its site-packages without
    their .pth files, so the editable install is invisible)."""
    out = tmp_path_factory.mktemp("dist")
    eventfold_zip = out / "eventfold.zip"
    shutil.copy(eventfold_wheel, eventfold_zip)  # a pure-Python wheel is a zip Python imports from
    app_zip = out / "app.zip"
    with zipfile.ZipFile(app_zip, "w") as archive:
        for package in ("examples", "tests"):
            for path in (ROOT / package).glob("*.py"):
                archive.write(path, f"{package}/{path.name}")
    python = out / "python-without-eventfold"
    # On an executor (its worker sets SPARK_EXECUTOR_DIRS) the interpreter does not see the
    # installed Eventfold; on the driver's host, which runs the CLI, it does.
    python.write_text(
        "#!/bin/sh\n"
        'if [ -z "$SPARK_EXECUTOR_DIRS" ] && [ -z "$AS_EXECUTOR" ]; then '
        f'exec {sys.executable} "$@"; fi\n'
        f'PYTHONPATH="$PYTHONPATH:{sysconfig.get_paths()["purelib"]}" '
        f'exec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    return {"eventfold": eventfold_zip, "app": app_zip, "python": python}


def test_the_executors_python_lacks_eventfold_but_has_its_dependencies(shipped) -> None:
    python = str(shipped["python"])
    executor = {**os.environ, "AS_EXECUTOR": "1"}
    missing = subprocess.run([python, "-c", "import eventfold"], capture_output=True,
                             text=True, cwd="/", env=executor)
    assert "No module named 'eventfold'" in missing.stderr
    subprocess.run([python, "-c", "import pyspark, confluent_kafka, psycopg, pyarrow, orjson"],
                   check=True, cwd="/", env=executor)


def _environment(stack_settings, shipped, name: str, **extra: str) -> dict[str, str]:
    return {**os.environ, **extra,
            "EVENTFOLD_APP": "tests.renamed_app:app", "EVENTFOLD_TEST_PROJECTION": name,
            "EVENTFOLD_DATABASE_URL": stack_settings.database_url,
            "EVENTFOLD_KAFKA_BOOTSTRAP": stack_settings.kafka.bootstrap_servers,
            "EVENTFOLD_CONNECT_URL": stack_settings.connect_url,
            "PYSPARK_PYTHON": str(shipped["python"]),
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": str(shipped["app"]),
            # Every batch on the executors, however small: they run the shipped code, and a
            # killed worker must take batches with it.
            "EVENTFOLD_DRIVER_BATCH_MAX_ROWS": "0"}


def _record_sales(stack_settings, unique: str, count: int) -> None:
    bus = sales.app.runtime(stack_settings).command_bus()
    for n in range(count):
        bus.execute(sales.RecordSale(product=f"{unique}-{n % 7}", value=n + 1))






def test_spark_submit_runs_a_projection_on_the_cluster_with_shipped_code(
        stack_settings, engine, cluster, shipped, unique) -> None:
    sales.app.runtime(stack_settings).setup()
    _record_sales(stack_settings, unique, 40)
    wait_until_in_topic(stack_settings, "ProductSales", unique, 40)
    name = f"cluster_totals_{unique}"
    cli = importlib.import_module("eventfold.cli").__file__
    _, state = cluster
    submitted = subprocess.run(
        [str(spark_home() / "bin" / "spark-submit"), "--master", state.master_url,
         "--py-files", f"{shipped['eventfold']},{shipped['app']}",
         "--conf", "spark.sql.shuffle.partitions=3", "--conf", "spark.executor.memory=1g",
         str(cli), "projection", "run", name, "--once"],
        env=_environment(stack_settings, shipped, name, SPARK_LOCAL_IP="127.0.0.1"),
        capture_output=True, text=True, timeout=400, cwd=shipped["app"].parent)
    assert submitted.returncode == 0, submitted.stdout[-3000:] + "\n".join(
        line for line in submitted.stderr.splitlines() if " INFO " not in line)[-3000:]
    started = next(line for line in submitted.stdout.splitlines() if "Spark master" in line)
    assert f"Spark master {state.master_url}" in started  # not EVENTFOLD_SPARK_MASTER's default
    assert "spark.sql.shuffle.partitions" in started  # its --conf over our default
    expected = sales_totals_of_the_store(engine, unique)
    assert rows(engine, f"{name}__v1", unique, "total") == expected
    assert ktable_totals(stack_settings, name, unique) == expected


def test_a_worker_killed_mid_stream_loses_and_doubles_nothing(
        stack_settings, engine, cluster, shipped, unique) -> None:
    spark_cluster, state = cluster
    sales.app.runtime(stack_settings).setup()
    name = f"cluster_stream_{unique}"
    log_path = shipped["app"].parent / f"{name}.log"
    with open(log_path, "wb") as log_file:
        runner = subprocess.Popen(
            [sys.executable, "-m", "eventfold.cli", "projection", "run", name],
            env=_environment(
                stack_settings, shipped, name, EVENTFOLD_SPARK_MASTER=state.master_url,
                EVENTFOLD_SPARK_CONF=f"spark.submit.pyFiles={shipped['eventfold']}\\,"
                                     f"{shipped['app']},spark.executor.memory=1g",
                EVENTFOLD_TRIGGER_INTERVAL="200 milliseconds"),
            stdout=log_file, stderr=subprocess.STDOUT, cwd=shipped["app"].parent)
    try:
        table = f"{name}__v1"
        with selling(stack_settings, unique) as sent:
            wait_for(lambda: folded_total(engine, table, unique) > 0,
                     "the first batch on the cluster", timeout_s=180)
            killed = spark_cluster.kill_worker(0)
            killed_at, folded_at_kill = time.monotonic(), folded_total(engine, table, unique)
            wait_for(lambda: folded_total(engine, table, unique) > folded_at_kill,
                     "a batch after the worker was killed", timeout_s=180)
            recovered_s = time.monotonic() - killed_at
            wait_for_more(sent, 150, "after the recovery")
        wait_until_in_topic(stack_settings, "ProductSales", unique, sent())
        stopped_at = time.monotonic()
        wait_for(lambda: rows(engine, table, unique, "total")
                 == sales_totals_of_the_store(engine, unique),
                 "the read model to equal a fold of the event store", timeout_s=180)
        caught_up_s = time.monotonic() - stopped_at
        print(f"\nspark worker {killed.name} (pid {killed.pid}) SIGKILLed mid-stream: first batch "
              f"committed {recovered_s:.1f} s later; {sent()} commands; read model equal to the "
              f"event store's fold {caught_up_s:.1f} s after the last command")
        assert runner.poll() is None, log_path.read_text()[-4000:]
        assert ktable_totals(stack_settings, name, unique) == sales_totals_of_the_store(
            engine, unique)
    finally:
        stop_pid(runner.pid, what="projection run", timeout_s=90)
        spark_cluster.restart_worker(0)

