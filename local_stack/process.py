"""Start a detached child process with its output in a log file, wait for it, stop it by PID."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class StackError(RuntimeError):
    """A local component failed to start or stop; the message says what to do about it."""


_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()
_PICKS_BEFORE_GIVING_UP = 1000


def free_port(avoid: Collection[int] = ()) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, that this process has not
    handed out before, and that is not in ``avoid``.

    Ports are picked before anything binds them (a stack's broker and worker are given theirs
    together), and the kernel picks a port it has just released again now and then, so two
    callers could otherwise be given the same port.
    """
    with _handed_out_lock:
        for _ in range(_PICKS_BEFORE_GIVING_UP):
            port = _kernel_picked_port()
            if port not in _handed_out and port not in avoid:
                _handed_out.add(port)
                return port
    raise StackError(f"no free TCP port on 127.0.0.1 after {_PICKS_BEFORE_GIVING_UP} picks; "
                     f"this process has handed out {len(_handed_out)}")


def _kernel_picked_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_open(port: int, host: str = "127.0.0.1") -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.settimeout(0.2)
        if sock.connect_ex((host, port)) != 0:
            return False
        # Connecting to a free port in the ephemeral range can connect the socket to itself
        # (TCP simultaneous open); that is not a listener.
        return bool(sock.getsockname() != sock.getpeername())


def wait_port_closed(port: int, what: str, timeout_s: float = 30) -> None:
    try:
        wait_until(lambda: not port_is_open(port), what=f"{what}'s port {port} to close",
                   timeout_s=timeout_s)
    except StackError as exc:
        raise StackError(f"{exc} Listening there:\n{_listeners(port)}") from None


def _listeners(port: int) -> str:
    try:
        return subprocess.run(["ss", "-ltnp", f"sport = :{port}"], capture_output=True,
                              text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(ss unavailable: {exc})"


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text[-lines:])


def drop_privileges(user: str | None) -> dict[str, Any]:
    """Popen arguments that run the child as ``user`` with that user's group only (a child
    left in root's group is judged by group permission bits, which private dirs lack)."""
    if user is None:
        return {}
    return {"user": user, "group": user, "extra_groups": []}


def spawn(
    argv: Sequence[str],
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session so that it outlives the CLI that started it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        try:
            return subprocess.Popen(
                list(argv),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                **drop_privileges(user),
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise StackError(f"cannot start {argv[0]}: {exc.strerror}") from exc


def wait_until(
    ready: Callable[[], bool],
    *,
    what: str,
    timeout_s: float,
    pid: int | None = None,
    log_path: Path | None = None,
    interval_s: float = 0.1,
) -> None:
    """Poll ``ready`` until it is true; fail fast if ``pid`` dies, with the log's tail."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        if pid is not None and not pid_alive(pid):
            raise StackError(f"{what} exited during start-up.{_tail_hint(log_path)}")
        time.sleep(interval_s)
    raise StackError(f"{what} not ready after {timeout_s:.0f} s.{_tail_hint(log_path)}")


def _tail_hint(log_path: Path | None) -> str:
    return f" Last lines of {log_path}:\n{log_tail(log_path)}" if log_path else ""


def pid_alive(pid: int) -> bool:
    try:
        waited_pid, _ = os.waitpid(pid, os.WNOHANG)
        if waited_pid == pid:
            return False
    except ChildProcessError:
        pass  # not our child: fall through to the signal probe
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def stop_pid(pid: int, *, what: str, sig: int = signal.SIGTERM, timeout_s: float = 30) -> None:
    """Send ``sig`` to ``pid``, wait for it to exit, SIGKILL it if it will not."""
    if not pid_alive(pid):
        return
    log.info("stopping %s (pid %d)", what, pid)
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    log.warning("%s (pid %d) ignored signal %d for %.0f s; killing it", what, pid, sig, timeout_s)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    while pid_alive(pid):
        time.sleep(0.05)


def process_tree() -> dict[int, list[int]]:
    """Each running process's children, from /proc."""
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue  # it ended while we looked
        tree.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return tree


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a Spark worker's executors, say)."""
    tree = process_tree()
    found, pending = [], list(tree.get(pid, []))
    while pending:
        child = pending.pop()
        found.append(child)
        pending.extend(tree.get(child, []))
    return found
