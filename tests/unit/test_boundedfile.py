"""Files a config names: regular and bounded, read without blocking (FIFO, device, size)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vox_mqtt.protocol.boundedfile import FileRefused, check_regular, read_regular


def test_a_regular_file_within_its_bound_is_read(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, limit=100) == b"x" * 100
    assert check_regular(path, limit=100) is None


def test_a_larger_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_bytes(b"x" * 101)
    with pytest.raises(FileRefused, match="101 bytes, more than the 100"):
        read_regular(path, limit=100)
    assert "more than the 100" in (check_regular(path, limit=100) or "")


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    with pytest.raises(FileRefused, match="a FIFO, not a regular file"):
        read_regular(path, limit=100)
    assert "a FIFO" in (check_regular(path, limit=100) or "")


def test_a_device_and_a_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FileRefused, match="/dev/zero: a device"):
        read_regular(Path("/dev/zero"), limit=100)
    assert "a directory" in (check_regular(tmp_path, limit=100) or "")


def test_a_missing_file_is_the_caller_s_to_explain(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "none", limit=100)
    assert check_regular(tmp_path / "none", limit=100) is None
