"""A PostgreSQL cluster of the stack's own, configured for logical decoding (Debezium)."""

from __future__ import annotations

import glob
import logging
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path

import psycopg

from eventfold.local_stack.process import StackError, drop_privileges, spawn, wait_until

log = logging.getLogger(__name__)

SUPERUSER = "eventfold"
DATABASE = "eventfold"
SERVER_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "synchronous_commit": "on",
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "fsync": "on",
    "log_min_messages": "warning",
}


def find_bin_dir() -> Path:
    """The directory of the newest installed PostgreSQL server binaries (initdb, postgres)."""
    configured = os.environ.get("EVENTFOLD_PG_BIN")
    installed = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                       key=lambda p: int(Path(p).parent.name), reverse=True)
    on_path = shutil.which("initdb")
    candidates = [configured] if configured else [*installed,
                                                  *([str(Path(on_path).parent)] if on_path else [])]
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    raise StackError(
        "PostgreSQL server binaries (initdb, postgres) not found. Install them with "
        "`apt-get install postgresql` (scripts/setup.sh does) or set EVENTFOLD_PG_BIN."
    )


def _run_as() -> str | None:
    """initdb and postgres refuse to run as root: use Debian's unprivileged `postgres` user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError as exc:
        raise StackError(
            "running as root needs the unprivileged OS user `postgres` "
            "(created by `apt-get install postgresql`)"
        ) from exc
    return "postgres"


def _grant_traverse(directory: Path) -> None:
    """Let the unprivileged server user reach its data directory through private parents
    (pytest's 0700 temp dirs, for one): add the search bit only, never read or write."""
    for ancestor in [directory, *directory.parents]:
        mode = ancestor.stat().st_mode
        if not mode & stat.S_IXOTH:
            log.info("granting o+x on %s so the postgres user can reach its data", ancestor)
            ancestor.chmod(mode | stat.S_IXOTH)


def dsn(port: int, database: str = DATABASE) -> str:
    return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{database}"


def init_cluster(data_dir: Path, log_path: Path) -> None:
    bin_dir = find_bin_dir()
    user = _run_as()
    data_dir.mkdir(parents=True, exist_ok=True)
    if user:
        _grant_traverse(data_dir.parent)
        shutil.chown(data_dir, user=user, group=user)
    data_dir.chmod(0o700)
    result = subprocess.run(
        [str(bin_dir / "initdb"), "-D", str(data_dir), "-U", SUPERUSER, "--auth=trust",
         "-E", "UTF8", "--locale=C", "--no-sync"],
        capture_output=True, text=True, check=False, **drop_privileges(user),
    )
    if result.returncode != 0:
        raise StackError(f"initdb failed ({result.returncode}):\n{result.stderr[-2000:]}")
    with open(data_dir / "postgresql.auto.conf", "a") as conf:
        for key, value in SERVER_SETTINGS.items():
            conf.write(f"{key} = {value}\n")
    log_path.parent.mkdir(parents=True, exist_ok=True)


def start(data_dir: Path, port: int, log_path: Path, timeout_s: float = 60) -> int:
    """Start the server and create the application database; returns the postmaster PID."""
    bin_dir = find_bin_dir()
    user = _run_as()
    if user:  # again at every start: another pytest session resets its temp root to 0700
        _grant_traverse(data_dir.parent)
    process = spawn(
        [str(bin_dir / "postgres"), "-D", str(data_dir), "-p", str(port)],
        log_path,
        user=user,
    )
    wait_until(
        lambda: _accepts_connections(port), what=f"PostgreSQL on port {port}",
        timeout_s=timeout_s, pid=process.pid, log_path=log_path,
    )
    _ensure_database(port)
    return process.pid


def _accepts_connections(port: int) -> bool:
    try:
        with psycopg.connect(dsn(port, "postgres"), connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def _ensure_database(port: int) -> None:
    with psycopg.connect(dsn(port, "postgres"), autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
