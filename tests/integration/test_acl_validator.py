"""parse_acl_file accepts exactly what Mosquitto 2.0.11 accepts: checked against the real broker."""

from __future__ import annotations

import getpass
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vox_mqtt.broker.aclcheck import parse_acl_file
from vox_mqtt.broker.local import find_mosquitto, free_port
from vox_mqtt.protocol.errors import ConfigError


def mosquitto_accepts(acl: str, directory: Path) -> bool:
    """Start mosquitto with this acl_file; True once it runs, False if it stops on an error."""
    directory.mkdir(parents=True, exist_ok=True)
    acl_path, log_path = directory / "acl", directory / "log"
    acl_path.write_bytes(acl.encode("utf-8"))
    conf = directory / "mosquitto.conf"
    conf.write_text(
        f"listener {free_port()} 127.0.0.1\nallow_anonymous true\nuser {getpass.getuser()}\n"
        f"acl_file {acl_path}\nlog_dest stderr\nlog_type error\nlog_type information\n"
    )
    with log_path.open("wb") as log:
        proc = subprocess.Popen([find_mosquitto(), "-c", str(conf)], stderr=log, stdout=log)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = log_path.read_text(errors="replace")
            if " running" in text:
                return True
            if proc.poll() is not None:
                # Read again: it may have written its last lines after the read above.
                text = log_path.read_text(errors="replace")
                assert "acl" in text.lower(), text  # it failed for the ACL, not something else
                return False
            time.sleep(0.005)
        raise AssertionError(f"mosquitto neither ran nor failed:\n{log_path.read_text()}")
    finally:
        # SIGKILL, not SIGTERM: Mosquitto logs "running" just before it arms the flag its
        # SIGTERM handler clears, so a SIGTERM sent on that line can be lost and it runs on.
        proc.kill()
        proc.wait()


def ours_accepts(acl: str) -> bool:
    try:
        parse_acl_file(acl)
    except ConfigError:
        return False
    return True


CASES = [
    "user a\ntopic read vox/#\n",
    "topic\tread\tvox/#\n",  # tabs are not separators
    "topic read vox/#\t\n",  # trailing whitespace is trimmed
    "\ttopic read vox/#\n",
    "  # an indented comment is no comment\n",
    "# a comment\n\n   \n\t\n",
    "topic read\n",  # one word: a topic named 'read'
    "topic\n",
    "topic \n",
    "topic\t\n",
    "user\n",
    "user   \n",
    "user\tbob\n",
    "user bob smith\ntopic write a b\n",
    "foo bar\n",
    "TOPIC read x\n",
    "topic read vox/+x\n",
    "topic read vox/#/a\n",
    "topic read vox/a+\n",
    "topic read +/+/#\n",
    "topic deny vox/#\n",
    "topic denied vox/#\n",
    "topic read  vox/#\n",
    "topic  read vox/#\n",
    "topic read \tvox/#\n",
    "topic read vox/a\tb\n",
    "topic read vox/#\r\n",
    "topic read vox/#",
    "pattern read vox/%u/#\n",
    "pattern write vox/x/#\n",
    "pattern readwrite\n",
    "\ufefftopic read vox/#\n",
    "user a\ntopic read vox/#\nuser\n",
    "user a\ntopic Read vox/#\n",
]


@pytest.mark.parametrize("acl", CASES, ids=range(len(CASES)))
def test_curated_lines_parse_as_mosquitto_parses_them(acl: str, tmp_path: Path) -> None:
    assert ours_accepts(acl) == mosquitto_accepts(acl, tmp_path)


_WORDS = [
    "topic",
    "pattern",
    "user",
    "read",
    "write",
    "readwrite",
    "deny",
    "bob",
    "vox/#",
    "vox/+/s",
    "a/#/b",
    "x+",
    "#",
    "+",
    "%u",
    "TOPIC",
    "# c",
]
_GAPS = [" ", "  ", "\t", " \t", "\r", "\v"]
_line = st.tuples(
    st.sampled_from(["", " ", "\t"]),
    st.lists(st.tuples(st.sampled_from(_WORDS), st.sampled_from(_GAPS)), min_size=0, max_size=4),
).map(lambda parts: parts[0] + "".join(w + g for w, g in parts[1]).rstrip(" ")[:80])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(_line, min_size=1, max_size=4))
def test_generated_files_parse_as_mosquitto_parses_them(lines: list[str], tmp_path: Path) -> None:
    acl = "\n".join(lines) + "\n"
    assert ours_accepts(acl) == mosquitto_accepts(acl, tmp_path / str(abs(hash(acl))))


def test_problems_name_the_line_and_the_tab(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_acl_file(
            "user a\ntopic read vox/#\ntopic\tread\tvox/#\ntopic bogus x\n", source="acl"
        )
    assert caught.value.problems[0].startswith("acl:3: ")
    assert "tabs are not separators" in caught.value.problems[0]
    assert caught.value.problems[1].startswith("acl:4: access must be")


def test_likely_mistakes_parse_but_warn() -> None:
    parsed = parse_acl_file("topic read\nuser a\npattern write vox/x\ntopic read vox/a\tb\n")
    assert len(parsed.warnings) == 4
    assert parsed.entries[0].topic == "read"
    assert parsed.entries[0].read
    assert parsed.entries[0].write


def test_entries_keep_user_access_and_deny() -> None:
    parsed = parse_acl_file("user a\ntopic read r\ntopic write w\ntopic deny d\nuser b\ntopic x\n")
    assert [(e.user, e.topic, e.read, e.write, e.deny) for e in parsed.entries] == [
        ("a", "r", True, False, False),
        ("a", "w", False, True, False),
        ("a", "d", False, False, True),
        ("b", "x", True, True, False),
    ]
    assert parsed.users == {"a", "b"}
