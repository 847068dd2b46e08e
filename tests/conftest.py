"""Shared fixtures: a real Mosquitto on a free loopback port, its log shown on failure."""

from __future__ import annotations

import getpass
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

from vox_mqtt.broker.local import LocalBroker, free_port

if TYPE_CHECKING:
    from tests.kits.faultkit import Processes

BrokerFactory = Callable[[str], LocalBroker]

# Property tests measure no speed: on a loaded machine Hypothesis's own timing checks (slow
# input generation, per-example deadlines) tripped on a busy core, not on the code under
# test (test_mqtt_decode, test_metrics and test_plan each failed so once, then passed).
settings.register_profile(
    "suite", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False
)
settings.load_profile("suite")

# Set in the controller's environment at configure time, so every process the run starts
# (xdist workers, brokers, daemons, their children) inherits it; see pytest_sessionfinish.
RUN_MARKER = "VOX_TEST_RUN"


def pytest_configure(config: pytest.Config) -> None:
    """In the controller (or a run without xdist): mark this run's processes."""
    import os
    import uuid

    if not hasattr(config, "workerinput"):
        os.environ[RUN_MARKER] = uuid.uuid4().hex
    # A shell without job control starts a background job (`make test &` in a script, nohup)
    # with SIGINT ignored, and every process below inherits that: the `vox` commands the tests
    # interrupt then ignored their Ctrl-C, as vox_mqtt/_entry.py means them to in a background
    # job, and 19 tests failed. The suite's processes take SIGINT as a terminal's would.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> Iterator[None]:
    """Fail the run if a process it started outlives it; report and kill each one."""
    import os

    import psutil

    yield  # xdist's own pytest_sessionfinish stops its workers inside this
    marker = os.environ.get(RUN_MARKER)
    if hasattr(session.config, "workerinput") or marker is None:
        return
    # The workers are this process's children: give one still exiting the time to end.
    psutil.wait_procs(psutil.Process().children(), timeout=10)
    left, lines = [], []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue  # this process, or one already dead that its parent reaps
            if proc.environ().get(RUN_MARKER) != marker:
                continue
            lines.append(f"pid {proc.pid}: {' '.join(proc.cmdline())}")
            proc.kill()
            left.append(proc)
        except psutil.Error:
            continue  # gone meanwhile, or not readable: not one of ours
    if not left:
        return
    psutil.wait_procs(left, timeout=10)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_sep("=", "processes the test run left running (now killed)", red=True)
        for line in lines:
            reporter.write_line(line)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# `vox broker reload` watches a broker 20 s after each reload (docs/broker.md); the tests
# that check the watch ask for it with --watch, every other reload in the suite (and the
# `vox` processes tests start) skips it.
os.environ.setdefault("VOX_RELOAD_WATCH", "0")
# The suite's verbs log in as the operator themselves (`--one-shot`, docs/operations.md):
# many tests also hold an OperatorConsole of their own between two verbs, which a resident
# console would have to share the operator's session with. The console's own tests
# (test_console_home.py) run their verbs without this.
os.environ.setdefault("VOX_CONSOLE", "one-shot")


# The suite's workers take whole modules in the order they are collected (`make test`:
# pytest -n 4 --dist loadfile --no-loadscope-reorder). These modules, the heaviest in a full
# run on two cores (seconds per module, its tests' setup, call and teardown summed), go out
# first, heaviest first; every other module follows in file order. Without it xdist handed
# modules out by their number of tests, so a module of one 100 s test started last and ran
# alone at the end. A module missing here only runs later; one listed but gone is skipped.
RUN_FIRST = (
    "tests/integration/test_bench_smoke.py",  # 142 s, 26 tests
    "tests/integration/test_site_partition.py",  # 90 s: its site is cut for 60 s
    "tests/integration/test_bench_smoke_scale.py",
    "tests/integration/test_fleet_changes.py",
    "tests/integration/test_broker_outage.py",
    "tests/integration/test_site_storms.py",
    "tests/integration/test_daemon.py",
    "tests/integration/test_demo.py",
    "tests/integration/test_shutdown_bounded.py",
    "tests/integration/test_web_doors.py",
    "tests/integration/test_request_life_follow.py",
    "tests/integration/test_flood_offline_operator.py",
    "tests/integration/test_exporter_resilience.py",
    "tests/integration/test_status_truth.py",
    "tests/integration/test_explorers_at_once.py",
    "tests/integration/test_demo_sites.py",
    "tests/integration/test_console_home.py",
    "tests/integration/test_federation_faults.py",
    "tests/integration/test_request_life_core_kill.py",
    "tests/integration/test_liveness_faults.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put RUN_FIRST's modules first, in its order; the sort is stable within a module."""
    rank = {module: index for index, module in enumerate(RUN_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(RUN_FIRST)))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Keep each phase's report on the item so fixtures can tell a failed test."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


# A failing test shows the end of its broker's log, not the whole of it: a log at
# `log_type all` under a load test ran to 200,000 lines, the failure buried in it.
BROKER_LOG_LINES = 200


def broker_log_report(broker: LocalBroker) -> str:
    """Return the last BROKER_LOG_LINES lines of a broker's log and where the whole file is."""
    lines = broker.log_text().splitlines()
    shown = lines[-BROKER_LOG_LINES:]
    head = f"last {len(shown)} of {len(lines)} lines" if len(lines) > len(shown) else "whole"
    return (
        f"\n--- mosquitto log, {head}: {broker.log_path} ---\n"
        + "\n".join(shown)
        + f"\n--- end of the mosquitto log ({broker.log_path}) ---"
    )


def plain_conf(port: int, directory: Path) -> str:
    """Return a minimal anonymous config listening on 127.0.0.1:port."""
    return (
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        f"user {getpass.getuser()}\n"
        "set_tcp_nodelay true\n"
        "persistence true\n"
        f"persistence_location {directory}/\n"
        "log_dest stderr\n"
        "log_type error\nlog_type warning\nlog_type notice\n"
    )


@pytest.fixture
def broker_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., LocalBroker]]:
    """Start Mosquitto from config text; `{port}` and `{dir}` in it are filled in."""
    started: list[LocalBroker] = []

    def start(conf_text: str | None = None, *, port: int | None = None) -> LocalBroker:
        directory = tmp_path_factory.mktemp("broker")
        port = port or free_port()
        text = plain_conf(port, directory) if conf_text is None else conf_text
        conf = directory / "mosquitto.conf"
        conf.write_text(text.replace("{port}", str(port)).replace("{dir}", str(directory)))
        broker = LocalBroker(conf, port=port)
        started.append(broker)
        broker.start()
        return broker

    yield start
    failed = getattr(request.node, "report_call", None)
    for broker in started:
        broker.stop()
        if failed is not None and failed.failed:
            print(broker_log_report(broker))


@pytest.fixture
def plain_broker(broker_factory: Callable[..., LocalBroker]) -> LocalBroker:
    """Return a running anonymous broker, for transport-level tests."""
    return broker_factory()


@pytest.fixture(scope="module")
def module_broker_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., LocalBroker]]:
    """Like broker_factory, but the brokers live for the whole test module."""
    started: list[LocalBroker] = []
    failed_before = request.session.testsfailed

    def start(conf_text: str, *, port: int) -> LocalBroker:
        directory = tmp_path_factory.mktemp("broker")
        conf = directory / "mosquitto.conf"
        conf.write_text(conf_text.replace("{port}", str(port)).replace("{dir}", str(directory)))
        broker = LocalBroker(conf, port=port)
        started.append(broker)
        broker.start()
        return broker

    yield start
    for broker in started:
        broker.stop()
        if request.session.testsfailed > failed_before:
            print(broker_log_report(broker))


@pytest.fixture
def secure_broker_factory(
    broker_factory: Callable[..., LocalBroker], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., object]:
    """Start the fleet's secured broker: factory(fleet, fmt="acl", pki_dir=None, explorer=True).

    Returns a tests.kits.brokerkit.SecureBroker: .broker (LocalBroker), .dir (BrokerDir),
    .creds(name_or_uuid) for the plain listener, .tls_creds(...) for the TLS one.
    """
    from tests.kits.brokerkit import start_secure_broker

    def start(fleet: object, **kwargs: object) -> object:
        out_dir = tmp_path_factory.mktemp("fleet-broker")
        return start_secure_broker(broker_factory, fleet, out_dir, **kwargs)  # type: ignore[arg-type]

    return start


@pytest.fixture
def processes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Processes]:
    """Run agent daemons for one test; stop them after it, showing their logs if it failed."""
    from tests.kits.faultkit import Processes

    procs = Processes(tmp_path)
    yield procs
    failed = getattr(request.node, "report_call", None)
    procs.close(show_logs=failed is not None and failed.failed)
