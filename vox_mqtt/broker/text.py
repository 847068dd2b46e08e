"""The exact bytes Mosquitto reads from acl_file and password_file, checked before it does.

Mosquitto 2.0 reads both files with C `fgets` into a 256-byte buffer that it grows
for longer lines, then trims trailing whitespace with `isspace`. Python's text mode
would translate a lone carriage return into a line break, so a validator reading
text sees two harmless lines where Mosquitto sees one line it refuses (and, for the
ACL, then runs with no ACL at all: docs/broker.md). A NUL ends a line for `strlen`
but not for `fgets`, which makes the growing-buffer path glue the next line onto
garbage. So nothing but the bytes is trusted: a file passes only if every reader,
Mosquitto's included, must split it into the same lines.
"""

from __future__ import annotations

import re
from typing import Final

from vox_mqtt.protocol.errors import ConfigError

__all__ = ["MAX_LINE_BYTES", "broker_file_text"]

# One line fits Mosquitto's first fgets buffer (256 bytes with its terminating NUL).
MAX_LINE_BYTES: Final = 254
_NAMES: Final = {0x00: "a NUL byte", 0x09: "a tab", 0x0D: "a carriage return", 0x7F: "DEL"}
_SHOWN_PROBLEMS: Final = 5
# Any byte _line_problem refuses inside a line (the newline itself separates lines).
_CONTROL_BYTE: Final = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]")


def _line_problem(line: bytes) -> str | None:
    if len(line) > MAX_LINE_BYTES:
        return f"{len(line)} bytes long (at most {MAX_LINE_BYTES}: Mosquitto reads it in pieces)"
    for index, byte in enumerate(line):
        if byte < 0x20 or byte == 0x7F:
            name = _NAMES.get(byte, f"control byte 0x{byte:02x}")
            return f"{name} at column {index + 1} (Mosquitto reads this line differently)"
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 at column {exc.start + 1}"
    return None


def broker_file_text(data: bytes, *, source: str) -> str:
    """Return the file's text if Mosquitto must read exactly these lines; else raise ConfigError."""
    # The same checks on the whole file at once; a file that fails is then walked line
    # by line to name each problem (10,000 identities: 100,000 lines, checked in ms).
    if not data.startswith(b"\xef\xbb\xbf") and _CONTROL_BYTE.search(data) is None:
        longest = max(map(len, data.split(b"\n")))
        if longest <= MAX_LINE_BYTES:
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                pass
    problems: list[str] = []
    if data.startswith(b"\xef\xbb\xbf"):
        problems.append(f"{source}:1: starts with a UTF-8 byte order mark (Mosquitto keeps it)")
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        problem = _line_problem(line)
        if problem is not None:
            problems.append(f"{source}:{number}: {problem}")
    if problems:
        extra = len(problems) - _SHOWN_PROBLEMS
        shown = problems[:_SHOWN_PROBLEMS]
        if extra > 0:
            shown.append(f"{source}: {extra} more line(s) with the same kind of problem")
        raise ConfigError(shown)
    return data.decode("utf-8")
