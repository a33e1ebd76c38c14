"""The README's "Your first Eventfold app", step by step, as a new user runs it: in an empty
directory outside the repository, with Eventfold installed from its wheel into a fresh
virtualenv (so nothing of the checkout is on the path), through the `eventfold` console
script: init, stack install, stack up, setup, serve commands, one command over HTTP,
projection run --once, serve reads, the row read back, the generated test, stack down.

The fresh virtualenv takes Eventfold's dependencies (Spark, Kafka and Postgres clients) from
the project's own virtualenv through a path file, so that the test does not download half a
gigabyte, and the stack's jars from the checkout's set-up (``EVENTFOLD_JARS_DIR``); Eventfold
itself comes only from the wheel.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
import venv
from pathlib import Path

import requests

from eventfold.local_stack import LocalStack
from eventfold.local_stack.process import free_port, port_is_open, stop_pid, wait_until
from tests.packaging import ROOT


def fresh_virtualenv(where: Path, wheel: Path) -> Path:
    """A virtualenv with the wheel installed; its ``bin`` directory."""
    venv.EnvBuilder(with_pip=True).create(where)
    bin_dir = where / "bin"
    purelib = subprocess.run(
        [str(bin_dir / "python"), "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    # The dependencies, not Eventfold: a path line adds the directory, and its own path files
    # (the checkout's editable install among them) are not read.
    Path(purelib, "eventfold-test-dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps",
                    str(wheel)], check=True, capture_output=True, timeout=300)
    return bin_dir


def test_a_first_app_from_an_empty_directory(tmp_path, eventfold_wheel) -> None:
    bin_dir = fresh_virtualenv(tmp_path / "venv", eventfold_wheel)
    work = tmp_path / "shop"
    work.mkdir()
    assert not str(work).startswith(str(ROOT))
    commands_port, reads_port = free_port(), free_port()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("EVENTFOLD_", "PYTHON", "VIRTUAL_ENV"))}
    # The stack's jars (and their class-data archives) of the checkout, which set-up fetched
    # and recorded: fetching them again into the wheel's directory would take a minute and
    # test nothing more (the wheel's pom: test_layout.py).
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
               EVENTFOLD_JARS_DIR=str(ROOT / "local_stack" / "jars"),
               EVENTFOLD_COMMAND_API_PORT=str(commands_port),
               EVENTFOLD_READ_API_PORT=str(reads_port))

    def eventfold(*args: str, timeout: float = 300) -> str:
        result = subprocess.run(["eventfold", *args], cwd=work, env=env, capture_output=True,
                                text=True, timeout=timeout, check=False)
        assert result.returncode == 0, f"eventfold {' '.join(args)}:\n{result.stdout}\n" \
                                       f"{result.stderr[-4000:]}"
        return result.stdout

    where = subprocess.run([str(bin_dir / "python"), "-c", "import eventfold; "
                            "print(eventfold.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(tmp_path / "venv")), where  # the wheel's, not the checkout's
    servers: list[subprocess.Popen[bytes]] = []
    try:
        assert "wrote myapp.py, eventfold.toml, test_myapp.py" in eventfold("init")
        assert "jars:" in eventfold("stack", "install")
        eventfold("stack", "up")
        eventfold("setup")
        servers.append(subprocess.Popen(["eventfold", "serve", "commands"], cwd=work, env=env,
                                        stdout=(tmp_path / "commands.log").open("wb"),
                                        stderr=subprocess.STDOUT))
        wait_until(lambda: port_is_open(commands_port), what="the command API", timeout_s=60,
                   pid=servers[0].pid)
        posted = requests.post(f"http://127.0.0.1:{commands_port}/commands/Deposit",
                               json={"account": "alice", "amount": 100}, timeout=10)
        assert posted.status_code == 201, posted.text
        eventfold("projection", "run", "balances", "--once")
        servers.append(subprocess.Popen(["eventfold", "serve", "reads"], cwd=work, env=env,
                                        stdout=(tmp_path / "reads.log").open("wb"),
                                        stderr=subprocess.STDOUT))
        wait_until(lambda: port_is_open(reads_port), what="the read API", timeout_s=60,
                   pid=servers[1].pid)
        row = requests.get(f"http://127.0.0.1:{reads_port}/read-models/balances/rows/alice",
                           params={"min_version": posted.json()["version"]}, timeout=30)
        assert row.status_code == 200, row.text
        assert row.json()["row"]["balance"] == 100
        tests = subprocess.run([str(bin_dir / "python"), "-m", "pytest", "-q",
                                "-p", "no:cacheprovider", "test_myapp.py"], cwd=work, env=env,
                               capture_output=True, text=True, timeout=120, check=False)
        assert tests.returncode == 0 and "3 passed" in tests.stdout, tests.stdout[-3000:]
        eventfold("stack", "down")
    finally:
        for server in servers:
            stop_pid(server.pid, what="eventfold serve", timeout_s=30)
        LocalStack(work / ".eventfold" / "stack").down()  # by PID, whatever happened above

