"""The intake file format: one incoming e-mail per file, headers then a free-text body."""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.utils import parseaddr
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from vox_mqtt.protocol.domain import JobDetected, Price
from vox_mqtt.protocol.messages import parse_timestamp

__all__ = [
    "MAX_MAIL_BYTES",
    "IncomingMail",
    "IntakeError",
    "decode_mail",
    "parse_mail",
    "read_bytes",
    "read_mail",
]

MAX_MAIL_BYTES: Final = 64 * 1024
REQUIRED: Final = ("From", "Start", "End", "Effort-Minutes", "Price")
KNOWN: Final = (*REQUIRED, "Subject")

_HEADER = re.compile(r"([A-Za-z][A-Za-z0-9-]*)[ \t]*:[ \t]*(.*)")
_PRICE = re.compile(r"(-?\d+(?:[.,]\d+)?)[ \t]+([A-Za-z]{3})")


class IntakeError(ValueError):
    """A mail file that cannot become a job_detected; the message says why."""


@dataclass(frozen=True, kw_only=True)
class IncomingMail:
    """A valid incoming e-mail: who sent it and the job it describes."""

    sender: str  # the From address: the message_source of the job_detected
    subject: str
    job: JobDetected


def read_mail(path: Path, *, max_bytes: int = MAX_MAIL_BYTES) -> IncomingMail:
    """Read and parse one mail file; raise IntakeError saying what is wrong with it."""
    return decode_mail(read_bytes(path, max_bytes=max_bytes), max_bytes=max_bytes)


def read_bytes(path: Path, *, max_bytes: int = MAX_MAIL_BYTES) -> bytes:
    """Read a mail file, or as much of it as shows it is too big; IntakeError if unreadable."""
    try:
        with path.open("rb") as handle:
            return handle.read(max_bytes + 1)
    except OSError as exc:
        raise IntakeError(f"cannot read the file: {exc.strerror or exc}") from None


def decode_mail(raw: bytes, *, max_bytes: int = MAX_MAIL_BYTES) -> IncomingMail:
    """Parse the bytes of a mail file; raise IntakeError saying what is wrong with them."""
    if len(raw) > max_bytes:
        raise IntakeError(f"the file is over {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IntakeError(f"not UTF-8 text (byte {exc.start})") from None
    return parse_mail(text)


def parse_mail(text: str) -> IncomingMail:
    """Parse the text of a mail file; raise IntakeError listing every problem found."""
    headers, body = _split(text.removeprefix("\ufeff"))
    problems: list[str] = []
    missing = [name for name in REQUIRED if name not in headers]
    if missing:
        problems.append("missing " + ", ".join(f"{name}:" for name in missing))
    sender = _sender(headers.get("From"), problems)
    start = _time(headers, "Start", problems)
    end = _time(headers, "End", problems)
    if start is not None and end is not None and parse_timestamp(end) <= parse_timestamp(start):
        problems.append(f"End: {end} is not after Start: {start}")
    effort = _effort(headers.get("Effort-Minutes"), problems)
    price = _price(headers.get("Price"), problems)
    if problems or start is None or end is None or effort is None or price is None:
        raise IntakeError("; ".join(problems) or "incomplete")
    subject = headers.get("Subject", "")
    # The human reads the subject with the body; agents never parse either.
    note = f"Subject: {subject}\n\n{body}" if subject else body
    try:
        job = JobDetected(
            start_time=start,
            end_time=end,
            estimated_effort_minutes=effort,
            price=price,
            note_to_human=note,
        )
    except ValidationError as exc:  # pragma: no cover - every field was checked above
        raise IntakeError(str(exc.errors(include_url=False)[0]["msg"])) from None
    return IncomingMail(sender=sender, subject=subject, job=job)


def _split(text: str) -> tuple[dict[str, str], str]:
    """Return the known headers (checked for repeats and bad lines) and the body."""
    lines = text.splitlines()
    headers: dict[str, str] = {}
    seen: dict[str, int] = {}
    last: str | None = None
    body_at = len(lines)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            body_at = number
            break
        if line[0] in " \t" and last is not None:
            # RFC 822 folding: a line starting with white space continues the header.
            headers[last] = f"{headers[last]} {line.strip()}".strip()
            continue
        match = _HEADER.fullmatch(line)
        if match is None:
            raise IntakeError(
                f"line {number} is not a 'Name: value' header "
                "(a blank line must separate the headers from the body)"
            )
        name = _canonical(match.group(1))
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1 and name in KNOWN:
            raise IntakeError(f"{name}: appears {seen[name]} times (line {number})")
        last = name
        headers[name] = match.group(2).strip()
    body = "\n".join(lines[body_at:]).strip()
    return {k: v for k, v in headers.items() if k in KNOWN}, body


def _canonical(name: str) -> str:
    """Return a header name as the format spells it (names are case-insensitive)."""
    for known in KNOWN:
        if known.lower() == name.lower():
            return known
    return name


def _sender(value: str | None, problems: list[str]) -> str:
    if value is None:
        return ""
    _, address = parseaddr(value)
    if "@" not in address or any(c.isspace() for c in address):
        problems.append(f"From: {value!r} has no e-mail address")
        return ""
    return address


def _time(headers: dict[str, str], name: str, problems: list[str]) -> str | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        parse_timestamp(value)
    except ValueError as exc:
        problems.append(f"{name}: {exc}")
        return None
    return value


def _effort(value: str | None, problems: list[str]) -> int | None:
    if value is None:
        return None
    if not re.fullmatch(r"[+-]?\d+", value) or int(value) <= 0:
        problems.append(f"Effort-Minutes: {value!r} is not a positive whole number of minutes")
        return None
    return int(value)


def _price(value: str | None, problems: list[str]) -> Price | None:
    if value is None:
        return None
    match = _PRICE.fullmatch(value)
    if match is None:
        problems.append(f"Price: {value!r} is not '<whole amount> <currency>', e.g. '30 USD'")
        return None
    amount, currency = match.groups()
    if amount.startswith("-"):
        problems.append(f"Price: {value!r} is negative")
        return None
    if not amount.isdigit():
        problems.append(f"Price: {value!r} is not a whole number of {currency}")
        return None
    if currency != currency.upper():
        problems.append(f"Price: write the currency in capitals ({currency.upper()})")
        return None
    try:
        return Price(currency=currency, value=int(amount))
    except ValidationError:
        problems.append(f"Price: {currency!r} is not an ISO-4217 currency code")
        return None
