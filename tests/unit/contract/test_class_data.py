"""Class-data archives: a recording is kept whole, under the archive's name, or not at all."""

from __future__ import annotations

import os

import pytest

from eventfold.contract.class_data import (
    keep_recording,
    mapping_options,
    recording_of,
    recording_options,
)


def test_a_recording_is_kept_as_the_archive_once_its_jvm_wrote_it(tmp_path) -> None:
    archive = tmp_path / "driver.jsa"
    recording = recording_of(archive)
    assert recording.parent == tmp_path and str(os.getpid()) in recording.name
    assert recording_options(recording) == [f"-XX:ArchiveClassesAtExit={recording}"]
    assert mapping_options(archive) == []  # nothing recorded yet: the JVM starts as before
    with pytest.raises(RuntimeError, match=r"did not stop cleanly\. Error occurred"):
        keep_recording(recording, archive, "Error occurred")
    assert not archive.exists()
    recording.write_bytes(b"classes")
    keep_recording(recording, archive)
    assert archive.read_bytes() == b"classes" and not recording.exists()
    assert mapping_options(archive) == [f"-XX:SharedArchiveFile={archive}"]
