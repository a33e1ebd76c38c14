"""Class-data archives: a recording is kept whole, under the archive's name, or not at all."""

from __future__ import annotations

import os
import subprocess

import pytest

from eventfold.contract.class_data import (
    clear_abandoned_recordings,
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



def test_a_recording_left_by_a_process_that_is_gone_is_cleared_another_kept(tmp_path) -> None:
    archive = tmp_path / "broker.jsa"
    build_cut_short = subprocess.Popen(["true"])
    build_cut_short.wait()
    abandoned = archive.with_name(f"{archive.name}.{build_cut_short.pid}.partial")
    ours = recording_of(archive)
    abandoned.write_bytes(b"half")
    ours.write_bytes(b"being written")
    clear_abandoned_recordings(archive)
    assert not abandoned.exists() and ours.exists()
