"""F2: which files on a broker host would SIGHUP a TLS broker (broker/hupguard.py)."""

from __future__ import annotations

from pathlib import Path

from vox_mqtt.broker.hupguard import (
    effective_exec_reload,
    logrotate_text,
    reload_problems,
    takes_certificates,
)

REPO = Path(__file__).resolve().parents[2]
DROP_IN = (REPO / "systemd" / "mosquitto.service.d" / "vox.conf").read_text()
BROKER = Path("/etc/vox/broker")
TLS_CONF = "listener 8883\ncafile /x/ca.crt\nuse_identity_as_username true\n"
PLAIN_CONF = "listener 1883\npassword_file /x/passwd\n"
DEBIAN_UNIT = "[Service]\nExecStart=/usr/sbin/mosquitto -c /etc/mosquitto/mosquitto.conf\n"
DEBIAN_UNIT += "ExecReload=/bin/kill -HUP $MAINPID\nRestart=on-failure\n"
DEBIAN_LOGROTATE = """/var/log/mosquitto/mosquitto.log {
\trotate 7
\tpostrotate
\t\tif invoke-rc.d mosquitto status > /dev/null 2>&1; then \\
\t\t\tinvoke-rc.d mosquitto reload > /dev/null 2>&1; \\
\t\tfi;
\tendscript
}
"""
OLD_LOGROTATE = "/var/log/mosquitto/mosquitto.log {\n\tpostrotate\n"
OLD_LOGROTATE += "\t\t/usr/bin/killall -HUP mosquitto\n\tendscript\n}\n"


def problems(
    conf: str = TLS_CONF, units: tuple[str, ...] = (DEBIAN_UNIT,), logrotate: str | None = None
) -> list[str]:
    return reload_problems(conf_text=conf, broker_dir=BROKER, unit_texts=units, logrotate=logrotate)


def test_a_tls_listener_takes_certificates_as_usernames() -> None:
    assert takes_certificates(TLS_CONF)
    assert takes_certificates("use_subject_as_username true")
    assert not takes_certificates(PLAIN_CONF)
    assert not takes_certificates("# use_identity_as_username true\n")
    assert not takes_certificates("use_identity_as_username false\n")


def test_the_drop_in_replaces_the_units_kill() -> None:
    assert effective_exec_reload([DEBIAN_UNIT]) == ["/bin/kill -HUP $MAINPID"]
    [command] = effective_exec_reload([DEBIAN_UNIT, DROP_IN])
    assert command.startswith("/usr/local/bin/vox broker reload /etc/vox/broker ")
    assert effective_exec_reload([DEBIAN_UNIT, "ExecReload=\n"]) == []
    assert effective_exec_reload(["ExecReload=a\n", "ExecReload=b\n"]) == ["a", "b"]


def test_a_tls_broker_without_the_drop_in_is_warned_about() -> None:
    [line] = problems()
    assert "`systemctl reload mosquitto` would SIGHUP this TLS broker" in line
    assert "ExecReload=/bin/kill -HUP $MAINPID sends SIGHUP" in line
    assert "systemd/mosquitto.service.d/vox.conf" in line


def test_a_tls_broker_with_the_drop_in_is_safe() -> None:
    assert problems(units=(DEBIAN_UNIT, DROP_IN)) == []
    # Debian's logrotate runs `reload`: with the drop-in that is `vox broker reload`.
    assert problems(units=(DEBIAN_UNIT, DROP_IN), logrotate=DEBIAN_LOGROTATE) == []
    assert problems(units=(), logrotate=None) == []  # no unit: nothing reloads it


def test_a_plain_broker_is_signalled_safely() -> None:
    assert problems(conf=PLAIN_CONF, logrotate=OLD_LOGROTATE) == []


def test_reload_lines_that_still_signal_or_miss_the_broker() -> None:
    cases = {
        "ExecReload=/bin/kill -s HUP $MAINPID": "sends SIGHUP",
        "ExecReload=/usr/bin/systemctl kill --signal=SIGHUP mosquitto": "sends SIGHUP",
        "ExecReload=/usr/bin/true": "is not `vox broker reload`",
        "ExecReload=/usr/local/bin/vox broker reload /etc/vox/broker --pid $MAINPID "
        "--tls-sighup": "signals a TLS broker anyway",
        "ExecReload=/usr/local/bin/vox broker reload /srv/other --pid $MAINPID": "/srv/other",
        "ExecReload=/usr/local/bin/vox broker reload 'unclosed": "cannot read",
    }
    for line, why in cases.items():
        [problem] = problems(units=(DEBIAN_UNIT, f"ExecReload=\n{line}\n"))
        assert why in problem, line


def test_a_logrotate_that_signals_or_reloads_unsafely_is_warned_about() -> None:
    [line] = problems(units=(DEBIAN_UNIT, DROP_IN), logrotate=OLD_LOGROTATE)
    assert "logrotate's mosquitto entry sends SIGHUP" in line
    assert "/etc/vox/broker/logrotate.mosquitto" in line
    unit, rotate = problems(logrotate=DEBIAN_LOGROTATE)
    assert "ExecReload=/bin/kill" in unit
    assert "runs `reload` after a rotation" in rotate
    assert problems(units=(DEBIAN_UNIT, DROP_IN), logrotate=logrotate_text()) == []
    assert problems(logrotate=logrotate_text()) == problems()  # it adds no problem


def test_the_rendered_logrotate_entry_copies_and_never_signals() -> None:
    text = logrotate_text()
    assert "\tcopytruncate\n" in text
    assert "postrotate" not in text
    assert "HUP" not in text.split("\n", 3)[3]  # past the comment that names it
