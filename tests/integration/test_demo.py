"""The README's first command, verbatim: `bash scripts/demo.sh` sets up, then runs the
inventory example end to end through the `eventfold` console script."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from eventfold.local_stack import LocalStack
from tests.packaging import ROOT, readme_commands

DEMO_LOG = "EVENTFOLD_DEMO_LOG"
"""Where a run of the README's first command that just happened (CI's, .ci/run) wrote what
it printed: the test judges that, rather than running the demo a second time."""


def test_demo_prints_totals_that_match_in_read_model_and_ktable(tmp_path) -> None:
    if ran := os.environ.get(DEMO_LOG):
        output = Path(ran).read_text()
        assert "stopping the stack" in output, output[-3000:]
    else:
        output = _run_the_demo(tmp_path)
        assert not (tmp_path / "demo" / "stack.json").exists(), "the demo must stop its stack"
    rows = dict(re.findall(r"^\s+(apples|pears|plums)\s+(\d+\s+\d+\s+\d+)$", output, re.M))
    assert {k: v.split() for k, v in rows.items()} == {
        "apples": ["24", "24", "24"], "pears": ["7", "7", "7"], "plums": ["11", "11", "11"]}
    # Readable: the table comes last, no request log lines, no client shouting at a
    # stopped broker.
    assert output.rstrip().splitlines()[-1].split() == ["plums", "11", "11", "11"], output[-2000:]
    assert "eventfold.requests" not in output
    assert "Connection refused" not in output, output[-3000:]
    assert "rejected (malformed JSON): 422" in output
    assert "rejected (stale expected_version): 409" in output
    assert "min_version=" in output and "answered after" in output  # read-your-writes
    assert "top 2 by quantity" in output


def _run_the_demo(tmp_path: Path) -> str:
    stack_dir = tmp_path / "stack"
    env = {**os.environ, "EVENTFOLD_STACK_DIR": str(stack_dir)}
    try:
        result = subprocess.run(
            ["bash", "-c", readme_commands()[0]], cwd=ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=900, check=False,
        )
    finally:
        LocalStack(Path(stack_dir).parent / "demo").down()  # by PID, even if the demo hung
    assert result.returncode == 0, result.stdout[-5000:]
    return result.stdout
