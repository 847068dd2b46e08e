"""The seed fleet running the freelance example's roles, and job mail to drop into its intake."""

from __future__ import annotations

import sqlite3
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from examples.freelance import Analyst, Coordinator, MailWatcher, Root
from tests.kits.agentkit import start_agents
from tests.kits.brokerkit import SEED_TREE, SecureBroker, tree_fleet
from vox_mqtt.agent.roles import Role
from vox_mqtt.console.operator import OperatorConsole
from vox_mqtt.fleet.config import BrokerSection, ConsoleFile, OperatorSection
from vox_mqtt.protocol.hierarchy import Fleet

NOTE = "Client: Netwire\nProject O-26-XXXXX-TRA-YYY"


def job_mail(
    start: str = "2026-01-12T09:00:00+00:00",
    end: str = "2026-01-12T17:00:00+00:00",
    *,
    effort: int = 60,
    price: str = "30 USD",
    sender: str = "Ana <ana@netwire.example>",
) -> str:
    return (
        f"From: {sender}\nSubject: Translation\nStart: {start}\nEnd: {end}\n"
        f"Effort-Minutes: {effort}\nPrice: {price}\n\n{NOTE}\n"
    )


def next_monday(hour: int = 0, *, weeks: int = 1) -> datetime:
    """Return a Monday at least `weeks` weeks ahead at this UTC hour: a job not yet expired."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today + timedelta(days=7 - today.weekday() + 7 * weeks, hours=hour)


def future_mail(start_hour: int, end_hour: int, effort: int, price: int, *, weeks: int = 1) -> str:
    """Return a job mail for a window of a future Monday (the kit's coordinator works Mondays)."""
    start, end = next_monday(start_hour, weeks=weeks), next_monday(end_hour, weeks=weeks)
    return job_mail(start.isoformat(), end.isoformat(), effort=effort, price=f"{price} USD")


def drop(intake: Path, name: str, text: str) -> None:
    """Write a mail file the way the format asks: a hidden temp file, then a rename."""
    tmp = intake / f".{name}.tmp"
    tmp.write_text(text)
    tmp.rename(intake / name)


@pytest.fixture
def seed_fleet() -> Fleet:
    return tree_fleet(SEED_TREE)


def console_for(secure: SecureBroker, state: Path) -> OperatorConsole:
    fleet = secure.fleet
    creds = secure.creds(fleet.operator_name)
    file = ConsoleFile(
        operator=OperatorSection(
            name=fleet.operator_name,
            id=fleet.operator_id,
            root_id=fleet.root.id,
            state_dir=state,
            request_timeout=10,
        ),
        broker=BrokerSection(
            port=secure.dir.port, username=creds.username, password=creds.password, keepalive=5
        ),
    )
    return OperatorConsole(file, base=state)


class Fixture:
    """The seed fleet running the freelance roles, and the operator's console."""

    def __init__(self, secure: SecureBroker, tmp: Path) -> None:
        self.secure = secure
        self.tmp = tmp
        self.intake = tmp / "intake"
        self.agents: dict[str, Any] = {}
        self.console: OperatorConsole | None = None

    async def start(
        self, stack: AsyncExitStack, names: list[str] | None = None, *, console: bool = True
    ) -> None:
        watcher = MailWatcher(
            settings={"intake_dir": str(self.intake), "poll_interval": 0.05, "settle": 0.05}
        )
        roles: dict[str, list[Role]] = {
            "root": [Root(settings={"ask_timeout": 15})],  # loaded machines: a hop may take seconds
            "coordinator": [Coordinator(settings={"work_week": {"mon": ["09:00-17:00"]}})],
            "specialist_a": [Analyst(), watcher],
            "specialist_b": [Analyst()],
        }
        self.agents.update(await start_agents(stack, self.secure, self.tmp, roles, names))
        if self.console is None and console:
            self.console = await stack.enter_async_context(
                console_for(self.secure, self.tmp / "operator")
            )

    def inbox(self) -> list[dict[str, Any]]:
        assert self.console is not None
        return [n for n in self.console.notifications() if n["type"] == "job_detected"]

    def ledger_rows(self, name: str) -> list[sqlite3.Row]:
        db = sqlite3.connect(self.tmp / name / "logs.db")
        try:
            db.row_factory = sqlite3.Row
            return list(db.execute("SELECT * FROM logs ORDER BY id"))
        finally:
            db.close()

    def received_jobs(self, name: str) -> list[sqlite3.Row]:
        return [
            r
            for r in self.ledger_rows(name)
            if r["message_type"] == "job_detected" and r["action"] == "received"
        ]


@pytest.fixture
def fleet_fixture(secure_broker_factory: Any, seed_fleet: Fleet, tmp_path: Path) -> Fixture:
    return Fixture(secure_broker_factory(seed_fleet), tmp_path)
