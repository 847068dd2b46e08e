"""The systemd deployment: `make install` into a staged root, verify, security, sandbox fit.

The units are checked as installed, in a staged root that holds this host's own systemd
units (sysinit.target ...), so `systemd-analyze verify --root` judges the real files.
The sandbox fit tests run the daemon the way the unit does and check what the unit
would forbid: every system call against the SystemCallFilter, every socket family
against RestrictAddressFamilies, and the whole life under W^X memory
(MemoryDenyWriteExecute, via the kernel's PR_SET_MDWE).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.kits.daemonkit import REPO, Daemon, NotifySocket, deploy
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.console.operator import OperatorConsole

SYSTEMD_DIR = REPO / "systemd"
HOST_UNITS = next(
    (p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir()),
    None,
)
needs_systemd = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None or HOST_UNITS is None,
    reason="systemd-analyze and the host's units are needed",
)
EXPOSURE_TARGET = 2.0
NOBODY = 65534


def _stage(tmp_path: Path, *, broker: bool = True) -> Path:
    """`make install` into a staged root, plus what the host would already have."""
    root = tmp_path / "root"
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "root.toml").write_text("# a rendered config\n")
    args = [f"DESTDIR={root}", "INSTALL_VENV=no", f"AGENT_CONFIGS={bundle}"]
    if broker:
        args.append("BROKER=1")
    result = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), "install", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert HOST_UNITS is not None
    shutil.copytree(HOST_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    (root / "bin").symlink_to("usr/bin")
    # What the venv and the distribution provide on a real host.
    for binary in ("opt/vox-mqtt/bin/vox-agent", "opt/vox-mqtt/bin/vox", "usr/sbin/mosquitto"):
        _stub(root / binary)
    for tool in ("kill", "mkdir", "chown"):
        _stub(root / "usr/bin" / tool)
    (root / "etc/vox/broker").mkdir(parents=True)
    (root / "etc/vox/broker/mosquitto.conf").write_text("")
    return root


def _stub(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _verify(root: Path, *units: str) -> str:
    """Return everything verify said; it exits 0 on some parse errors, so output counts."""
    result = _analyze("verify", f"--root={root}", *units)
    return (result.stdout + result.stderr).strip() + ("" if result.returncode == 0 else " (rc)")


@needs_systemd
def test_make_install_stages_units_user_and_configs(tmp_path: Path) -> None:
    root = _stage(tmp_path)
    unit = root / "etc/systemd/system/vox-agent@.service"
    assert unit.read_text() == (SYSTEMD_DIR / "vox-agent@.service").read_text()
    exporter = root / "etc/systemd/system/vox-exporter.service"
    assert exporter.read_text() == (SYSTEMD_DIR / "vox-exporter.service").read_text()
    web = root / "etc/systemd/system/vox-web.service"
    assert web.read_text() == (SYSTEMD_DIR / "vox-web.service").read_text()
    assert web.stat().st_mode & 0o777 == 0o644
    assert (root / "opt/vox-mqtt/share/doc/vox-alerts.yml").is_file()
    assert os.readlink(root / "usr/local/bin/vox-agent") == "/opt/vox-mqtt/bin/vox-agent"
    assert (root / "etc/systemd/system/mosquitto.service.d/vox.conf").is_file()
    assert "vox:x:" in (root / "etc/passwd").read_text()
    assert "vox:x:" in (root / "etc/group").read_text()
    assert (root / "etc/vox/root.toml").stat().st_mode & 0o777 == 0o640


@needs_systemd
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    root = _stage(tmp_path)
    assert _verify(root, "vox-agent@coordinator.service", "mosquitto.service") == ""
    assert _verify(root, "vox-exporter.service") == ""
    assert _verify(root, "vox-web.service") == ""


@needs_systemd
def test_verify_is_able_to_fail(tmp_path: Path) -> None:
    root = _stage(tmp_path)
    unit = root / "etc/systemd/system/vox-agent@.service"
    unit.write_text(unit.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    assert "restart specifier" in _verify(root, "vox-agent@x.service")
    (root / "opt/vox-mqtt/bin/vox-agent").unlink()
    assert "/usr/local/bin/vox-agent" in _verify(root, "vox-agent@x.service")


def _exposure(root: Path, unit: str) -> float:
    result = _analyze("security", "--offline=true", f"--root={root}", "--threshold=100", unit)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    return float(found.group(1))


@needs_systemd
def test_agent_unit_exposure_is_ok(tmp_path: Path) -> None:
    if "--offline" not in _analyze("security", "--help").stdout:
        pytest.skip("systemd-analyze security --offline needs systemd >= 250")
    root = _stage(tmp_path)
    exposure = _exposure(root, "vox-agent@coordinator.service")
    print(f"systemd-analyze security vox-agent@coordinator.service: {exposure}")
    assert exposure <= EXPOSURE_TARGET
    exporter = _exposure(root, "vox-exporter.service")
    print(f"systemd-analyze security vox-exporter.service: {exporter}")
    assert exporter <= EXPOSURE_TARGET
    # The drop-in hardens the distribution's broker unit too.
    assert _exposure(root, "mosquitto.service") < 5.0


def _unit_settings(path: Path) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_agent_unit_lifecycle_settings() -> None:
    unit = _unit_settings(SYSTEMD_DIR / "vox-agent@.service")
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "WatchdogSec": "30",
        "Restart": "on-failure",
        "RestartPreventExitStatus": "2 77",
        "StateDirectory": "vox/%i",
        "ConfigurationDirectory": "vox",
        "User": "vox",
        "UMask": "0077",
        "ExecStart": "/usr/local/bin/vox-agent --config /etc/vox/%i.toml",
        # `systemctl reload` applies a changed bundle live (docs/operations.md).
        "ExecReload": "/bin/kill -HUP $MAINPID",
    }
    for key, value in expected.items():
        assert unit[key] == [value], key
    assert "StartLimitBurst" in unit
    assert "StartLimitIntervalSec" in unit
    # psutil's host metrics read /proc/meminfo, /proc/stat and /proc/loadavg.
    assert "ProcSubset" not in unit
    grace = float(unit["TimeoutStopSec"][0])
    assert grace > 10.0  # the default agent.shutdown_grace, plus the SHUTDOWN publish


def test_exporter_unit_shares_the_agent_hardening() -> None:
    agent = _unit_settings(SYSTEMD_DIR / "vox-agent@.service")
    exporter = _unit_settings(SYSTEMD_DIR / "vox-exporter.service")
    assert exporter["ExecStart"] == [
        "/usr/local/bin/vox exporter --config /etc/vox/exporter.toml --listen 127.0.0.1:9733"
    ]
    assert exporter["User"] == ["vox"]
    assert exporter["RestartPreventExitStatus"] == ["2"]
    hardening = [k for k in agent if k.startswith(("Protect", "Private", "Restrict", "System"))]
    hardening += ["NoNewPrivileges", "CapabilityBoundingSet", "MemoryDenyWriteExecute"]
    for key in hardening:
        assert exporter.get(key) == agent[key], key


# --- the daemon inside the sandbox the unit draws ---------------------------------------------


@cache
def _syscall_groups() -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    current = ""
    for line in _analyze("syscall-filter").stdout.splitlines():
        if line.startswith("@"):
            current = line.strip()
            groups[current] = set()
        elif line.strip() and not line.strip().startswith("#") and current:
            groups[current].add(line.strip())
    return groups


def _expand(name: str) -> set[str]:
    names: set[str] = set()
    for member in _syscall_groups()[name]:
        names |= _expand(member) if member.startswith("@") else {member}
    return names


def _allowed_syscalls() -> set[str]:
    """Return what the unit's SystemCallFilter lines allow."""
    allowed: set[str] = set()
    for value in _unit_settings(SYSTEMD_DIR / "vox-agent@.service")["SystemCallFilter"]:
        deny = value.startswith("~")
        names = set().union(
            *(_expand(n) if n.startswith("@") else {n} for n in value[deny:].split())
        )
        allowed = allowed - names if deny else allowed | names
    return allowed


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temp dir an unprivileged user can reach (pytest's own is 0700 to root)."""
    path = Path(tempfile.mkdtemp(prefix="vox-sandbox-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# What the daemon imports, found by importing it in a child (never __main__ modules).
_IMPORTS_PROBE = """
import importlib, pkgutil, sys
import agent_daemon.__main__, agent_daemon.daemon, tests.kits.roles_for_tests, vox_mqtt
for info in pkgutil.walk_packages(vox_mqtt.__path__, "vox_mqtt."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
for module in list(sys.modules.values()):
    if getattr(module, "__file__", None):
        print(module.__file__)
"""


def _readable_runtime(dest: Path) -> tuple[str, Path]:
    """Copy what the daemon imports where an unprivileged user can read it.

    A checkout, and the venv in it, may sit under a 0700 directory (a home, `mktemp -d`)
    that the unit's user cannot enter, as `vox` could not on a host. Return the
    interpreter to run (the venv's base, outside the checkout) and the PYTHONPATH.
    """
    code = dest / "code"
    (code / "tests" / "kits").mkdir(parents=True)
    files = subprocess.run(
        [sys.executable, "-c", _IMPORTS_PROBE],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split("\n")
    sites = [Path(p) for p in sys.path if p.endswith("site-packages")]
    tops = {
        site / Path(file).relative_to(site).parts[0]
        for file in files
        if file
        for site in sites
        if Path(file).is_relative_to(site)
    }
    skip = shutil.ignore_patterns("__pycache__")
    for top in tops:
        if top.is_dir():
            shutil.copytree(top, code / top.name, ignore=skip)
        else:
            shutil.copy2(top, code / top.name)
    for package in ("vox_mqtt", "agent_daemon"):
        shutil.copytree(REPO / package, code / package, ignore=skip)
    (code / "tests" / "__init__.py").touch()
    (code / "tests" / "kits" / "__init__.py").touch()
    shutil.copy2(REPO / "tests" / "kits" / "roles_for_tests.py", code / "tests" / "kits")
    for path in (code, *code.rglob("*")):
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
    return os.path.realpath(sys.executable), code


async def _echo(console_config: Path) -> None:
    async with OperatorConsole(console_config) as console:
        result = await console.send_command("echo", {"text": "sandboxed"}, wait=20)
    assert result.details["result"]["text"] == "sandboxed"


def _run_lifecycle(
    tmp_path: Path,
    broker_factory: Callable[..., LocalBroker],
    wrap: list[str],
) -> tuple[Daemon, NotifySocket, Path, str]:
    """Run the daemon through READY, watchdog, SIGHUP and SIGTERM as an unprivileged user.

    Return the daemon, its notify socket, its work dir and the interpreter it ran.
    """
    dep = deploy(tmp_path)
    broker_factory(dep.conf_text, port=dep.port)
    work = tmp_path / "run"
    work.mkdir(mode=0o777)
    work.chmod(0o777)
    notify = NotifySocket(work / "notify.sock")
    (work / "notify.sock").chmod(0o777)
    prefix: list[str] = []
    python, pythonpath = sys.executable, REPO
    if os.geteuid() == 0:
        python, pythonpath = _readable_runtime(tmp_path)
        # As the unit does (User=vox): SQLite, for one, chowns its files only when root.
        for path in (dep.root_config.parent, dep.state_dir):
            path.mkdir(exist_ok=True)
            for item in (path, *path.rglob("*")):
                os.chown(item, NOBODY, NOBODY)
        prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(pythonpath),
        "NOTIFY_SOCKET": str(notify.path),
        "WATCHDOG_USEC": "2000000",
    }
    wrapped = [*wrap, *prefix]
    daemon = Daemon(
        dep.root_config, work / "daemon.log", env, prefix=wrapped, python=python, cwd=work
    )
    notify.process = daemon.process
    pid = daemon.process.pid
    try:
        notify.wait_for("READY=1")
        pid = _daemon_pid(daemon.process.pid, traced=wrap[:1] == ["strace"])
        asyncio.run(_echo(dep.operator_config))
        notify.wait_for("WATCHDOG=1", count=2)
        os.kill(pid, signal.SIGHUP)
        daemon.wait_log("is valid and unchanged")
        os.kill(pid, signal.SIGTERM)
        assert daemon.wait(60) == 0, daemon.log()
        pid = 0
    except AssertionError:
        print(f"--- daemon log ---\n{daemon.log()}")
        raise
    finally:
        # A killed strace leaves its tracee running: end the daemon itself.
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        daemon.kill()
        notify.close()
    assert "Traceback" not in daemon.log()
    assert dep.retained_status()["error_code"] == "SHUTDOWN"
    return daemon, notify, work, python


def _daemon_pid(pid: int, *, traced: bool) -> int:
    """Return the daemon's pid: strace's child when traced (wrappers exec in place)."""
    if not traced:
        return pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is needed")
@needs_systemd
def test_daemon_syscalls_fit_the_unit_filter(
    open_tmp: Path, broker_factory: Callable[..., LocalBroker]
) -> None:
    trace = open_tmp / "run" / "strace.txt"
    *_, python = _run_lifecycle(open_tmp, broker_factory, ["strace", "-f", "-qq", "-o", str(trace)])
    text = trace.read_text()
    # systemd switches user before it executes the daemon: count from that execve on.
    start = re.search(rf'^\d+\s+execve\("{re.escape(python)}".*= 0$', text, re.MULTILINE)
    assert start, "the trace does not show the daemon's execve"
    text = text[start.start() :]
    used = set(re.findall(r"^\d+\s+(?:<\.\.\. )?([a-z0-9_]+)[( ]", text, re.MULTILINE))
    assert {"execve", "connect", "sendto"} <= used  # the trace saw the real work
    assert sorted(used - _allowed_syscalls()) == []
    families = set(re.findall(r"socket\((AF_[A-Z0-9]+)", text))
    allowed = set(
        _unit_settings(SYSTEMD_DIR / "vox-agent@.service")["RestrictAddressFamilies"][0].split()
    )
    assert families <= allowed


PR_SET_MDWE, PR_GET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 66, 1


def _mdwe_supported() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_GET_MDWE, 0, 0, 0, 0) >= 0)


MDWE_WRAPPER = f"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl({PR_SET_MDWE}, {PR_MDWE_REFUSE_EXEC_GAIN}, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "PR_SET_MDWE")
os.execvp(sys.argv[1], sys.argv[1:])
"""


@pytest.mark.slow
@pytest.mark.skipif(not _mdwe_supported(), reason="PR_SET_MDWE needs Linux >= 6.3")
def test_daemon_lives_without_writable_executable_memory(
    open_tmp: Path, broker_factory: Callable[..., LocalBroker]
) -> None:
    wrapper = [sys.executable, "-c", MDWE_WRAPPER]
    daemon, *_ = _run_lifecycle(open_tmp, broker_factory, wrapper)
    assert "stopped: SHUTDOWN published" in daemon.log()
    # The control: under the same wrapper a W+X mapping is refused, so the rule was on.
    probe = "import mmap; mmap.mmap(-1, 4096, prot=mmap.PROT_READ|mmap.PROT_WRITE|mmap.PROT_EXEC)"
    refused = subprocess.run(
        [*wrapper, sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    assert refused.returncode != 0
    assert "PermissionError" in refused.stderr
