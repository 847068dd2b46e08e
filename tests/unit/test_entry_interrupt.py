"""SIGINT while a command runs: KeyboardInterrupt, except inside an import (vox_mqtt/_entry.py)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import FrameType

import pytest

from vox_mqtt._entry import _importing


def test_a_frame_inside_an_import_is_told_apart_from_one_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "vox_probe_module.py").write_text(
        "import sys\nFRAME = sys._getframe()\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = importlib.import_module("vox_probe_module")
        inside: FrameType = module.FRAME
        assert _importing(inside)
    finally:
        sys.modules.pop("vox_probe_module", None)
    assert not _importing(sys._getframe())
    assert not _importing(None)
