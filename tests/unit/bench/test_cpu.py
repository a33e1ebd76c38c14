"""The benches' CPU per event by component: what a real child process burns is found under its
component while it runs and under ``reaped`` once waited for, and figures per event add up."""

from __future__ import annotations

import subprocess
import sys

from bench.common import (
    CoreMeter,
    component_of,
    cpu_between,
    cpu_by_component,
    describe_cpu,
    per_event_us,
)

BURN = ("import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
        "print('burnt', flush=True)\ntime.sleep(30)\n")


def test_a_child_s_cpu_counts_under_its_component_then_as_reaped() -> None:
    before = cpu_by_component()
    # "pyspark.worker" in its command line: counted as one of Spark's Python workers
    child = subprocess.Popen([sys.executable, "-c", BURN, "pyspark.worker"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "burnt\n"
        assert component_of(child.pid) == "spark_python"
        running = cpu_between(before, cpu_by_component())
    finally:
        child.kill()
        child.wait()
    assert running["spark_python"] >= 0.25
    assert running["reaped"] < 0.25
    assert cpu_between(before, cpu_by_component())["reaped"] >= 0.25


def test_a_named_tree_counts_under_its_name_for_a_core_meter() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURN, "pyspark.worker"],
                             stdout=subprocess.PIPE, text=True)
    try:
        meter = CoreMeter({"host": [child.pid]})
        assert child.stdout is not None and child.stdout.readline() == "burnt\n"
        used = meter.used()
        named = cpu_by_component({"host": [child.pid]})
    finally:
        child.kill()
        child.wait()
    # other tests' processes (a stack, Spark's workers) may share this tree: only the child
    # is named
    assert used["host"] > 0
    assert named["host"] >= 0.25


def test_a_running_child_is_found_by_its_command_line() -> None:
    child = subprocess.Popen([sys.executable, "-c", "print('up', flush=True); "
                              "import time; time.sleep(30)",
                              "org.apache.kafka.connect.cli.ConnectDistributed"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"  # exec'd
        assert component_of(child.pid) == "connect"
    finally:
        child.kill()
        child.wait()


def test_figures_per_event_and_their_total() -> None:
    figures = per_event_us({"postgres": 3.0, "broker": 1.0, "connect": 0.0}, 1_000_000)
    assert figures == {"postgres": 3.0, "broker": 1.0, "total": 4.0}
    assert describe_cpu(figures) == "total 4.0 µs: postgres 3.0, broker 1.0"
    assert cpu_between({"a": 2.0, "gone": 1.0}, {"a": 5.0, "new": 1.5}) == {"a": 3.0,
                                                                            "new": 1.5}
