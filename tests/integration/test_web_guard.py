"""`vox web` refuses to be reachable from elsewhere without a token (docs/web.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kits.fleetproc import REPO, child_env
from tests.kits.webkit import self_signed


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


def test_tls_options_are_checked_before_anything_starts(tmp_path: Path) -> None:
    cert, key, _ = self_signed(tmp_path)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    cases = [
        (("--tls-cert", str(cert)), "go together"),
        (("--tls-key", str(key)), "go together"),
        (("--tls-cert", str(cert), "--tls-key", str(junk)), "not a PEM certificate and its key"),
        (("--tls-cert", str(tmp_path / "gone.pem"), "--tls-key", str(key)), "cannot read them"),
    ]
    for args, said in cases:
        done = vox_web("--config", str(tmp_path / "operator.toml"), *args)
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert said in lines[0]
        assert "Traceback" not in done.stderr


def _settings(path: Path) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_the_web_unit_has_the_exporters_hardening() -> None:
    web = _settings(REPO / "systemd" / "vox-web.service")
    exporter = _settings(REPO / "systemd" / "vox-exporter.service")
    assert web["ExecStart"] == [
        "/usr/local/bin/vox web --config /etc/vox/web.toml --listen 127.0.0.1:8080"
    ]
    own = {"ExecStart", "Description", "Documentation"}
    assert {k: v for k, v in web.items() if k not in own} == {
        k: v for k, v in exporter.items() if k not in own
    }


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None or not Path("/usr/lib/systemd/system").is_dir(),
    reason="systemd-analyze and the host's units are needed",
)
def test_the_web_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    shutil.copy(REPO / "systemd" / "vox-web.service", units / "vox-web.service")
    vox = root / "usr/local/bin/vox"
    vox.parent.mkdir(parents=True)
    vox.write_text("#!/bin/sh\n")
    vox.chmod(0o755)
    (root / "bin").symlink_to("usr/bin")
    done = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", "vox-web.service"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (done.stdout + done.stderr).strip() == ""
