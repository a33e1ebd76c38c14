"""Prometheus metrics as a team scrapes them: the command API (two worker processes), the read
API and a streaming `projection run` with its metrics port, all CLI processes on the real
stack. The figures must match what the test did: commands by status, conflicts, group
commits, records folded, lag back to zero, the connector running, read-your-writes waits."""

from __future__ import annotations

import httpx

from eventfold.local_stack.process import free_port, port_is_open, wait_until
from tests.pipeline_helpers import wait_for
from tests.support.cli import cli_processes, scrape, stack_env, total

Samples = list[tuple[str, dict[str, str], float]]


def test_each_process_reports_what_it_did(inventory_app, stack_settings, tmp_path,
                                          unique) -> None:
    commands_port, reads_port, run_port = free_port(), free_port(), free_port()
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_COMMAND_API_PORT=str(commands_port),
                    EVENTFOLD_READ_API_PORT=str(reads_port), EVENTFOLD_HTTP_WORKERS="2",
                    EVENTFOLD_METRICS_PORT=str(run_port),
                    EVENTFOLD_TRIGGER_INTERVAL="200 milliseconds")
    commands, reads = f"http://127.0.0.1:{commands_port}", f"http://127.0.0.1:{reads_port}"
    run = f"http://127.0.0.1:{run_port}"
    with cli_processes(env, tmp_path, ["serve", "commands"], ["serve", "reads"],
                       ["projection", "run", "inventory_totals"]) as processes:
        for port, what in ((commands_port, "command API"), (reads_port, "read API"),
                           (run_port, "projection run's metrics")):
            wait_until(lambda port=port: port_is_open(port), what=what, timeout_s=120,
                       pid=processes[[commands_port, reads_port, run_port].index(port)].pid)
        wait_for(lambda: httpx.get(f"{run}/health", timeout=5).status_code == 200,
                 "the projection's query to run", timeout_s=180)

        with httpx.Client(base_url=commands, timeout=30) as client:
            products = [f"{unique}-{n}" for n in range(4)]
            for n in range(20):
                response = client.post("/commands/ReceiveStock",
                                       json={"product": products[n % 4], "quantity": 1})
                assert response.status_code == 201, response.text
            stale = client.post("/commands/ReceiveStock", json={
                "product": products[0], "quantity": 1, "expected_version": 1})
            assert stale.status_code == 409, stale.text
            assert client.post("/commands/ReceiveStock", json={
                "product": products[0], "quantity": 0}).status_code == 422
            assert client.post("/no/such/path").status_code == 404

        written = scrape(commands)
        route = {"api": "commands", "route": "/commands/ReceiveStock", "method": "POST"}
        assert total(written, "eventfold_http_requests_total", **route, status="201") == 20
        assert total(written, "eventfold_http_requests_total", **route, status="409") == 1
        assert total(written, "eventfold_http_requests_total", **route, status="422") == 1
        assert total(written, "eventfold_http_requests_total", route="unmatched",
                     status="404") == 1
        assert total(written, "eventfold_http_request_duration_seconds_count", **{
            k: route[k] for k in ("api", "route")}) == 22
        assert total(written, "eventfold_command_conflicts_total", command="ReceiveStock",
                     outcome="rejected") == 1
        assert total(written, "eventfold_group_commit_appends_sum") >= 20

        def caught_up() -> bool:
            samples = scrape(run)
            lag = [v for name, labels, v in samples
                   if name == "eventfold_projection_lag_events"
                   and labels["topic"] == "eventfold.events.Product"]
            return bool(lag) and sum(lag) == 0 and total(
                samples, "eventfold_projection_records_total",
                projection="inventory_totals") >= 20
        wait_for(caught_up, "the run's lag to reach 0 after folding the commands",
                 timeout_s=120)
        folded = scrape(run)
        assert total(folded, "eventfold_projection_batch_duration_seconds_count",
                     projection="inventory_totals") >= 1
        phases = {labels["phase"] for name, labels, _ in folded
                  if name == "eventfold_projection_batch_phase_seconds_count"
                  and labels["projection"] == "inventory_totals"}
        assert {"fold", "commit", "task_read", "task_fold"} <= phases, phases
        assert total(folded, "eventfold_projection_last_batch_timestamp_seconds",
                     projection="inventory_totals") > 0
        assert total(folded, "eventfold_connector_state", state="RUNNING") == 1
        assert total(folded, "eventfold_connector_tasks", state="RUNNING") == 1
        assert total(folded, "eventfold_replication_slot_active") == 1
        assert any(name == "eventfold_replication_slot_retained_wal_bytes"
                   for name, _, _ in folded)

        row = f"{reads}/read-models/inventory_totals/rows/{products[0]}"
        fresh = httpx.get(row, params={"min_version": 5, "wait_ms": 5000}, timeout=30)
        assert fresh.status_code == 200 and fresh.json()["row"]["quantity"] == 5, fresh.text
        late = httpx.get(row, params={"min_version": 99, "wait_ms": 100}, timeout=30)
        assert late.status_code == 504
        served = scrape(reads)
        assert total(served, "eventfold_read_your_writes_waits_total",
                     kind="read_model", outcome="timed_out") == 1
        assert total(served, "eventfold_read_your_writes_waits_total", kind="read_model") == 2
        assert total(served, "eventfold_http_requests_total", api="reads",
                     route="/read-models/inventory_totals/rows/{key}", status="200") == 1
        wait_for(lambda: total(scrape(reads), "eventfold_ktable_restored",
                               ktable="inventory_totals") == 1,
                 "the answering worker's KTable store to be restored", timeout_s=60)
