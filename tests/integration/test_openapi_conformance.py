"""Both APIs answer as their OpenAPI documents say, checked by an independent fuzzer:
schemathesis (pinned in the dev extra) with its default checks, over its examples, coverage
and fuzzing phases, against `eventfold serve commands` and `serve reads` of two examples, with
no token and with EVENTFOLD_API_TOKEN set. Its requests write to the real event store: the
store may grow only by the events of the 201s it saw."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from eventfold.local_stack.process import free_port, port_is_open, wait_until
from tests.pipeline_helpers import catch_up
from tests.support.cli import cli_processes, stack_env

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
TOKEN = "conformance-token"


def fuzz(url: str, report: Path, token: str | None, seed: int) -> list[dict]:
    """Run schemathesis against the API at ``url``: its HAR entries (every request and
    response). Fails the test with its own report if any check failed."""
    auth = ["--header", f"Authorization: Bearer {token}"] if token else []
    result = subprocess.run(
        [str(SCHEMATHESIS), "run", f"{url}/openapi.json", "--phases",
         "examples,coverage,fuzzing", "--max-examples", "30", "--seed", str(seed), "--no-color",
         "--report", "har", "--report-har-path", str(report), *auth],
        capture_output=True, text=True, timeout=600, check=False, cwd=report.parent)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout, result.stdout[-3000:]
    return json.loads(report.read_text())["log"]["entries"]


def appended_by(entries: list[dict]) -> int:
    """Events the 201 answers among ``entries`` report appended."""
    return sum(len(json.loads(e["response"]["content"]["text"])["event_ids"])
               for e in entries if e["response"]["status"] == 201)


def stored_events(engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM events")).scalar_one())


@pytest.mark.parametrize(("example", "tokens"), [("orders", (None, TOKEN)),
                                                 ("point_of_sale", (None,))],
                         ids=["orders", "point_of_sale"])
def test_both_apis_answer_as_their_openapi_documents_say(example, tokens, stack_settings, spark,
                                                         engine, tmp_path) -> None:
    """The token guard is the same for every app: one example is fuzzed with it too."""
    app = importlib.import_module(f"examples.{example}").app
    app.runtime(stack_settings).setup()
    for seed, token in enumerate(tokens):
        commands_port, reads_port = free_port(), free_port()
        env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP=f"examples.{example}:app",
                        EVENTFOLD_COMMAND_API_PORT=str(commands_port),
                        EVENTFOLD_READ_API_PORT=str(reads_port), EVENTFOLD_REQUEST_LOG="false",
                        **({"EVENTFOLD_API_TOKEN": token} if token else {}))
        mode = "token" if token else "open"
        (tmp_path / mode).mkdir()
        with cli_processes(env, tmp_path / mode, ["serve", "commands"],
                           ["serve", "reads"]) as processes:
            for port, process in zip((commands_port, reads_port), processes, strict=True):
                wait_until(lambda port=port: port_is_open(port), what=f"port {port}",
                           timeout_s=120, pid=process.pid)
            before = stored_events(engine)
            entries = fuzz(f"http://127.0.0.1:{commands_port}",
                           tmp_path / mode / "commands.har", token, seed)
            assert {e["response"]["status"] for e in entries} >= {201, 422}
            assert stored_events(engine) - before == appended_by(entries)
            # The read API after the projections have folded what the fuzzer wrote.
            for projection in app.projections:
                if projection.has_state:
                    catch_up(spark, stack_settings, projection)
            reads = fuzz(f"http://127.0.0.1:{reads_port}", tmp_path / mode / "reads.har",
                         token, seed)
            assert 200 in {e["response"]["status"] for e in reads}
            if token:
                assert 401 in {e["response"]["status"] for e in reads}
