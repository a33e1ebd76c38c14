"""`eventfold status` and `projection status` as an operator and a script use them: the
screen, the JSON, and exit codes that say what is wrong (0 healthy, 3 a component away, 5 a
projection stale), against the real stack."""

from __future__ import annotations

from eventfold.local_stack.process import free_port
from tests.pipeline_helpers import wait_until_in_topic
from tests.support.cli import eventfold, stack_env, status_json


def test_status_says_what_is_wrong_by_its_exit_code(inventory_app, stack_settings, tmp_path,
                                                    unique) -> None:
    from examples.inventory import ReceiveStock

    env = stack_env(stack_settings, tmp_path)
    bus = inventory_app.runtime(stack_settings).command_bus()
    bus.execute(ReceiveStock(product=f"{unique}-1", quantity=1))
    wait_until_in_topic(stack_settings, "Product", f"{unique}-1", 1)
    caught_up = eventfold("projection", "run", "inventory_totals", "--once", env=env)
    assert caught_up.returncode == 0, caught_up.stderr[-3000:]
    code, healthy = status_json(env)
    assert code == 0 and healthy["healthy"], healthy["problems"]
    assert healthy["connector"]["state"] == "RUNNING"
    assert healthy["connector"]["slot"]["active"] is True
    [totals] = healthy["projections"]
    assert totals["name"] == "inventory_totals" and not totals["stale"]
    assert totals["last_batch_age_s"] is not None

    screen = eventfold("status", env=env, timeout=120)
    assert screen.returncode == 0
    for shown in ("Postgres", "Kafka", "connector eventfold-outbox", "inventory_totals",
                  "Healthy."):
        assert shown in screen.stdout, screen.stdout

    # Events wait and no batch came for longer than the threshold: stale, exit code 5.
    bus.execute(ReceiveStock(product=f"{unique}-2", quantity=2))
    for _ in range(60):  # until CDC has published the event
        code, stale = status_json(env, "--stale-after", "0")
        if code == 5:
            break
    assert code == 5, stale
    assert any("projection inventory_totals" in p["what"] for p in stale["problems"])
    projection = eventfold("projection", "status", "inventory_totals", "--stale-after", "0",
                           env=env, timeout=120)
    assert projection.returncode == 5 and "STALE" in projection.stdout, projection.stdout
    screen = eventfold("status", "--stale-after", "0", env=env, timeout=120)
    assert screen.returncode == 5 and "Unhealthy (exit code 5)" in screen.stdout

    # A component that does not answer: exit code 3, naming it.
    away = {**env, "EVENTFOLD_CONNECT_URL": f"http://127.0.0.1:{free_port()}"}
    code, unreachable = status_json(away)
    assert code == 3
    assert unreachable["connector"]["reachable"] is False
    assert any(p["what"].startswith("connector") for p in unreachable["problems"])
