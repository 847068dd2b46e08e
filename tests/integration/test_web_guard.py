"""`vox web` refuses to be reachable from elsewhere without a token (docs/web.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.kits.fleetproc import REPO, child_env


def vox_web(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vox_mqtt.cli", "web", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )


def test_a_non_loopback_bind_without_a_token_refuses_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "operator.toml"  # never read: the refusal comes first
    for listen in ("0.0.0.0:0", "192.0.2.1:8080", "[::]:0"):
        done = vox_web("--config", str(config), "--listen", listen)
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert "refusing to listen on" in lines[0]
        assert "without a token" in lines[0]
        assert "Traceback" not in done.stderr
        assert done.stdout == ""


def test_a_short_or_unreadable_token_file_is_refused(tmp_path: Path) -> None:
    short = tmp_path / "token"
    short.write_text("abc\n")
    done = vox_web("--listen", "0.0.0.0:0", "--token-file", str(short))
    assert done.returncode == 2
    assert "at least 16 characters" in done.stderr
    done = vox_web("--listen", "0.0.0.0:0", "--token-file", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert "cannot read it" in done.stderr
    assert "Traceback" not in done.stderr
