"""CI runs what the README tells a new user to run, as written: its two first commands."""

from __future__ import annotations

from tests.packaging import ROOT, readme_commands


def test_ci_runs_the_readme_commands_verbatim() -> None:
    demo, tests = readme_commands()
    assert (demo, tests) == ("bash scripts/demo.sh", "bash scripts/test.sh")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith(f"{demo} ") or line == demo for line in ci)
    assert any(line.startswith(f"exec {tests} ") or line == f"exec {tests}" for line in ci)
