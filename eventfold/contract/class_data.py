"""Java's application class-data sharing, for every JVM Eventfold starts on a machine of its
own: the broker and the Connect worker of the local stack, a local Spark driver.

A JVM started with ``recording_options`` writes, as it exits, the classes it loaded; one
started later with ``mapping_options`` maps that archive instead of loading and verifying
them from the jars, and starts sooner. The JVM checks an archive against its own build and
class path and ignores a stale one, saying so in one warning line. A recording is written
beside the archive under a name of the recording process (``recording_of``) and moved into
place whole (``keep_recording``), whoever else records the same archive.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def find_java() -> str | None:
    """The ``java`` of ``JAVA_HOME``, else the one on ``PATH``; None when there is neither."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    return candidate if candidate and Path(candidate).exists() else None


def mapping_options(archive: Path) -> list[str]:
    """The JVM options that map ``archive``: none while it was not recorded."""
    return [f"-XX:SharedArchiveFile={archive}"] if archive.is_file() else []


def recording_of(archive: Path) -> Path:
    """Where this process has a JVM record ``archive`` before it is kept."""
    return archive.with_name(f"{archive.name}.{os.getpid()}.partial")


def clear_abandoned_recordings(archive: Path) -> None:
    """Remove the recordings of ``archive`` left by processes that are gone (a build cut
    short); another live process's recording stays."""
    for recording in archive.parent.glob(f"{archive.name}.*.partial"):
        pid = recording.name[len(archive.name) + 1:-len(".partial")]
        if pid.isdigit() and not _alive(int(pid)):
            recording.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def recording_options(recording: Path) -> list[str]:
    """The JVM options that write the classes the JVM loaded to ``recording`` as it exits."""
    return [f"-XX:ArchiveClassesAtExit={recording}"]


def keep_recording(recording: Path, archive: Path, detail: str = "") -> None:
    """Move a finished ``recording`` into place as ``archive``. Raises RuntimeError, with
    ``detail`` (what the recording JVM said), when it was not written."""
    if not recording.is_file():
        raise RuntimeError(f"the class-data archive {archive} was not written: its JVM did not "
                           f"stop cleanly. {detail}".strip())
    recording.replace(archive)
