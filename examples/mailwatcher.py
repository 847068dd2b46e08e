"""The MailWatcher role: e-mail files in an intake folder become job_detected messages."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from uuid import NAMESPACE_URL, uuid5

from vox_mqtt.agent.roles import Role
from vox_mqtt.agent.tracking import SentState, TrackedRequest
from vox_mqtt.protocol.domain import MSG_JOB_DETECTED
from vox_mqtt.protocol.errors import VoxError
from vox_mqtt.protocol.messages import VOXMessage
from vox_mqtt.protocol.signing import seal_note

from ._settings import positive_seconds
from .intake import IntakeError, decode_mail, read_bytes

__all__ = ["PROCESSED", "REJECTED", "MailWatcher"]

log = logging.getLogger("examples.freelance")

PROCESSED: Final = "processed"
REJECTED: Final = "rejected"
# Names a writer uses while a file is not complete yet (write, then rename).
_UNFINISHED = re.compile(r"^\.|\.(tmp|part|swp)$|~$")


class MailWatcher(Role):
    """Watch an intake folder: each e-mail file becomes a job_detected to the master.

    Settings: intake_dir (absolute, or relative to the agent's state dir; default
    "intake"), poll_interval (seconds, default 0.2), settle (seconds a file must be
    unchanged before it is read, default 0.3), retry_after (seconds, default 5).
    A file moves to processed/ only once the master acknowledged its job_detected,
    and to rejected/ (with NAME.reason beside it) when it is not a valid job.
    """

    def __init__(self, *, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(settings=settings)
        intake = self.settings.get("intake_dir", "intake")
        if not isinstance(intake, str) or not intake:
            raise ValueError("setting intake_dir must be a folder path")
        self._intake_setting = Path(intake).expanduser()
        self.poll_interval = positive_seconds(self.settings, "poll_interval", 0.2)
        self.settle = positive_seconds(self.settings, "settle", 0.3)
        self.retry_after = positive_seconds(self.settings, "retry_after", 5.0)
        self._in_flight: set[str] = set()
        self._retry_at: dict[str, float] = {}
        self._waiters: set[asyncio.Task[None]] = set()

    @property
    def intake_dir(self) -> Path:
        """Return the folder watched for e-mail files."""
        if self._intake_setting.is_absolute():
            return self._intake_setting
        return Path(self.agent.config.state_dir) / self._intake_setting

    async def start(self) -> None:
        """Create the intake folder and its processed/ and rejected/ subfolders."""
        for folder in (self.intake_dir, self.intake_dir / PROCESSED, self.intake_dir / REJECTED):
            folder.mkdir(parents=True, exist_ok=True)
        log.info("%s: watching %s for e-mail files", self.agent.name, self.intake_dir)
        signing = self.agent.config.broker.signing
        if signing is None or signing.seal_to is None:
            log.info(
                "%s: no operator key in this fleet: note_to_human goes in clear", self.agent.name
            )

    async def run(self) -> None:
        """Scan the intake folder every poll_interval until the agent stops."""
        while True:
            try:
                await self.scan()
            except OSError as exc:
                log.error("%s: cannot scan %s: %s", self.agent.name, self.intake_dir, exc)
            await asyncio.sleep(self.poll_interval)

    async def stop(self) -> None:
        """Stop waiting for acknowledgements: unacknowledged files stay in the intake."""
        for task in list(self._waiters):
            task.cancel()
        if self._waiters:
            await asyncio.wait(list(self._waiters), timeout=2)

    async def scan(self) -> None:
        """Take every complete, settled file of the intake folder once."""
        now = time.time()
        for path in sorted(self.intake_dir.iterdir()):
            name = path.name
            if name in self._in_flight or _UNFINISHED.search(name) or not path.is_file():
                continue
            if self._retry_at.get(name, 0.0) > time.monotonic():
                continue
            try:
                if now - path.stat().st_mtime < self.settle:
                    continue  # maybe still being written: look again next scan
            except FileNotFoundError:
                continue  # taken away meanwhile
            await self.take(path)

    async def take(self, path: Path) -> None:
        """Send one file's job_detected, or reject the file."""
        try:
            raw = await asyncio.to_thread(read_bytes, path)
            mail = decode_mail(raw)
        except IntakeError as exc:
            self._reject(path, str(exc))
            return
        details = mail.job.model_dump(mode="json")
        # Sealed to the operator: no agent on the way and no broker can read it (docs/security.md).
        details["note_to_human"] = seal_note(
            details["note_to_human"], self.agent.config.broker.signing
        )
        message = self._job_message(path, raw, mail.sender, details)
        tracked = await self.agent.send_message(message, expects_reply=False)
        self._in_flight.add(path.name)
        log.info(
            "%s: %s -> job_detected %s to %s",
            self.agent.name,
            path.name,
            message.message_id,
            self.agent.config.master_name,
        )
        task = asyncio.ensure_future(self._settle_file(path, tracked))
        self._waiters.add(task)
        task.add_done_callback(self._waiters.discard)

    def _job_message(
        self, path: Path, content: bytes, sender: str, details: dict[str, Any]
    ) -> VOXMessage:
        master = self.agent.config.master_id
        if master is None:
            raise VoxError(f"{self.agent.name} has no master to notify")
        # The id is derived from the file, so a re-send after a crash is the same message
        # and the master's ledger dedupes it instead of seeing a second job.
        digest = hashlib.sha256(path.name.encode() + b"\0" + content).hexdigest()
        message_id = uuid5(NAMESPACE_URL, f"vox-intake:{self.agent.id}:{digest}")
        emitted = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        return VOXMessage(
            message_id=message_id,
            message_source=sender,
            emitted_at=emitted.isoformat(timespec="milliseconds"),
            source=self.agent.id,
            target=master,
            type=MSG_JOB_DETECTED,
            details=details,
        )

    async def _settle_file(self, path: Path, tracked: TrackedRequest) -> None:
        try:
            await tracked.done.wait()
            if tracked.state is SentState.COMPLETED:
                target = _free_name(path.parent / PROCESSED, path.name)
                os.replace(path, target)
                log.info(
                    "%s: %s acknowledged by %s; moved to %s",
                    self.agent.name,
                    path.name,
                    self.agent.config.master_name,
                    target,
                )
            else:
                self._retry_at[path.name] = time.monotonic() + self.retry_after
                log.warning(
                    "%s: %s not acknowledged (%s: %s); kept in the intake, retry in %gs",
                    self.agent.name,
                    path.name,
                    tracked.error_code,
                    tracked.error,
                    self.retry_after,
                )
        except OSError as exc:
            log.error("%s: cannot move %s: %s", self.agent.name, path.name, exc)
        finally:
            self._in_flight.discard(path.name)

    def _reject(self, path: Path, reason: str) -> None:
        if not path.exists():
            return  # taken away meanwhile: nothing to keep
        reason = " ".join(reason.split())
        log.warning("%s: rejected intake file %s: %s", self.agent.name, path.name, reason)
        folder = path.parent / REJECTED
        target = _free_name(folder, path.name)
        try:
            target.with_name(target.name + ".reason").write_text(reason + "\n", encoding="utf-8")
            os.replace(path, target)
        except OSError as exc:
            log.error("%s: cannot move %s to %s: %s", self.agent.name, path.name, folder, exc)


def _free_name(folder: Path, name: str) -> Path:
    """Return folder/name, or folder/name.N when a file of that name is already there."""
    target = folder / name
    counter = 1
    while target.exists():
        target = folder / f"{name}.{counter}"
        counter += 1
    return target
