"""Liveness as an observer knows it: the state words and the FleetView of each agent.

What a status must keep to be taken is observe/statusbounds.py's; what an agent puts of
itself in its own status is observe/selfreport.py's (docs/liveness.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Final
from uuid import UUID

from pydantic import ValidationError

from vox_mqtt.observe.metricbounds import metrics_problem
from vox_mqtt.observe.selfreport import EpochCounter, host_metrics
from vox_mqtt.observe.statusbounds import (
    ADVERT_CHANGE_BURST,
    ADVERT_CHANGE_RATE,
    WILL_EXPIRY,
    ChangeBudget,
    Timeliness,
    clock_problem,
    describe,
    replayed,
    status_age,
)
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.commandspec import taken_params
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, AgentStatus, VOXMessage

# WILL_EXPIRY, EpochCounter, Timeliness and host_metrics (statusbounds.py, selfreport.py)
# stay importable from here for agent/liveness.py, which reads them with the view.
__all__ = [
    "ACTIVE",
    "DEGRADED",
    "INACTIVE",
    "LEDGER_UNAVAILABLE",
    "MISBEHAVING_HOLD",
    "RETIRED",
    "SHUTDOWN",
    "STALE",
    "UNKNOWN",
    "VM_CONNECTION_LOST",
    "WILL_EXPIRY",
    "AgentLiveness",
    "EpochCounter",
    "FleetView",
    "FleetWord",
    "StatusChange",
    "Timeliness",
    "host_metrics",
]

log = logging.getLogger("vox_mqtt.liveness")

ACTIVE: Final = "ACTIVE"
INACTIVE: Final = "INACTIVE"
DEGRADED: Final = "DEGRADED"  # connected, but refusing work it could not record
STALE: Final = "STALE"
UNKNOWN: Final = "UNKNOWN"
VM_CONNECTION_LOST: Final = "VM_CONNECTION_LOST"
SHUTDOWN: Final = "SHUTDOWN"
# The last status an agent ever has, said by `vox fleet retire`: it left the fleet for good.
RETIRED: Final = "RETIRED"
LEDGER_UNAVAILABLE: Final = "LEDGER_UNAVAILABLE"
# An agent whose status broke a bound gets no work and keeps its incident this long.
MISBEHAVING_HOLD: Final = 60.0


@dataclass(kw_only=True)
class AgentLiveness:
    """What an observer knows of one agent's liveness."""

    id: UUID
    name: str = ""
    master_id: UUID | None = None  # whom its status reports to (the operator for the root)
    status: str = UNKNOWN
    error_code: str | None = None
    epoch: int = -1
    started_at: str = ""
    heartbeat_interval: float = 0.0
    commands: tuple[str, ...] = ()
    # What each of those commands takes ({"doc", "schema"}), as its status said, in bounds.
    params: dict[str, dict[str, Any]] = dataclass_field(default_factory=dict)
    metrics: dict[str, Any] | None = None
    version: str = ""
    last_heartbeat: str = ""  # emitted_at of the last status message, as the sender wrote it
    retained: bool = False  # the last status was a retained copy found at subscribe time
    # On the observer's monotonic clock; may be below zero for an old retained status.
    received_at: float = 0.0
    ledger_head: tuple[int, str] | None = None  # the newest its status reported
    # received_at is when the loss happened, by the broker's clock (a retained will with its
    # expiry left) or by our own (a will that arrived live): docs/liveness.md.
    lost_at_known: bool = False
    # The last status refused as out of bounds: why, and until when (monotonic) the agent
    # counts as misbehaving and gets no work.
    rejected: str | None = None
    misbehaving_until: float = 0.0
    # The commands of its last ACTIVE status (kept while it is down), and how many more
    # changes of them it may make now.
    advertised: tuple[str, ...] | None = None
    # What its last ACTIVE status said agents below it served and nobody ACTIVE there serves
    # now (kept while it is down): routing answers TARGET_INACTIVE for them (agent/rules.py).
    commands_down: tuple[str, ...] = ()
    changes: ChangeBudget = dataclass_field(default_factory=ChangeBudget)
    epoch_of_commands: int = -1  # the epoch of the full status `commands` came from
    # The newest sequence taken of its full status (False) and its presence (True), with the
    # epoch and start it counts within: an older or equal one is a replay (docs/security.md).
    sequences: dict[bool, tuple[int, str, int]] = dataclass_field(default_factory=dict)

    def misbehaving(self, now: float | None = None) -> bool:
        """Return whether a status of this agent was refused within the hold time."""
        return (time.monotonic() if now is None else now) < self.misbehaving_until

    @property
    def seen(self) -> bool:
        """Return whether any status of this agent has arrived."""
        return bool(self.last_heartbeat)

    def heartbeat_age(self, now: float | None = None) -> float | None:
        """Return seconds since the last status message, on the observer's clock."""
        if not self.seen:
            return None
        return max(0.0, (time.monotonic() if now is None else now) - self.received_at)

    @property
    def healthy(self) -> bool:
        """Return whether the agent is ACTIVE, its heartbeat fresh, its statuses believable."""
        return self.status == ACTIVE and not self.misbehaving()

    def as_dict(self, now: float | None = None) -> dict[str, Any]:
        """Return a JSON-ready snapshot."""
        age = self.heartbeat_age(now)
        return {
            "id": str(self.id),
            "name": self.name,
            "master_id": None if self.master_id is None else str(self.master_id),
            "status": self.status,
            "healthy": self.healthy,
            "error_code": self.error_code,
            "epoch": self.epoch,
            "started_at": self.started_at,
            "heartbeat_interval": self.heartbeat_interval,
            "heartbeat_age_s": None if age is None else round(age, 3),
            "last_heartbeat": self.last_heartbeat,
            "commands": list(self.commands),
            "params": {c: p for c, p in self.params.items() if c in self.commands},
            "metrics": self.metrics or {},
            "version": self.version,
            "rejected": self.rejected if self.misbehaving(now) else None,
        }


@dataclass(frozen=True, kw_only=True)
class StatusChange:
    """An agent moved from one liveness state to another."""

    agent: AgentLiveness
    old: str
    new: str


@dataclass(frozen=True, kw_only=True)
class FleetWord:
    """What the fleet file or the signed bundle says of an agent: its name and its master.

    A view takes both from here, never from the agent's own status (docs/security.md, F26);
    None where the reader's bundle does not say (an agent knows nothing above its master).
    """

    name: str | None = None
    master: UUID | None = None


StatusHook = Callable[[AgentLiveness, str, str], None]
RejectHook = Callable[[AgentLiveness, str], None]


class FleetView:
    """Keep the liveness of a set of agents from their retained status messages."""

    def __init__(
        self,
        *,
        stale_after: float = 3.0,
        on_status_change: StatusHook | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._agents: dict[UUID, AgentLiveness] = {}
        self._forgotten: set[UUID] = set()  # former children: what still comes of them is old
        self.stale_after = stale_after  # in heartbeat intervals
        # Each is told of every change (liveness reacts, a console may draw it).
        self.listeners: list[StatusHook] = []
        if on_status_change is not None:
            self.listeners.append(on_status_change)
        self.reject_listeners: list[RejectHook] = []
        self._clock = clock
        # How many commands a watched agent may advertise (its master's share for it,
        # docs/liveness.md), or None for no bound beyond the status model's.
        self.share_of: Callable[[UUID], int | None] = lambda _agent: None
        # An agent's name and master by the fleet (F26), None when the reader cannot know;
        # and whose a name is, among the identities the reader knows.
        self.fleet_word: Callable[[UUID], FleetWord | None] = lambda _agent: None
        self.named: Callable[[str], UUID | None] = lambda _name: None
        # Signed statuses are dated by their emitted_at too (F23); None: signatures off,
        # where emitted_at proves nothing (docs/security.md, replays).
        self.timeliness: Timeliness | None = None
        self.not_current = 0  # statuses of life too old to be taken (F23), counted

    def add_reject_listener(self, hook: RejectHook) -> None:
        """Tell hook of every status refused as out of bounds, with the reason."""
        self.reject_listeners.append(hook)

    def add_listener(self, hook: StatusHook) -> None:
        """Tell hook of every status change from now on."""
        self.listeners.append(hook)

    def watch(self, agent_id: UUID, name: str = "") -> AgentLiveness:
        """Start knowing an agent, UNKNOWN until its status arrives."""
        self._forgotten.discard(agent_id)
        word = self.fleet_word(agent_id)
        if word is not None and word.name:
            name = word.name  # the fleet's name, whatever a status claims (F26)
        entry = self._agents.get(agent_id)
        if entry is None:
            entry = self._agents[agent_id] = AgentLiveness(id=agent_id, name=name)
        elif name and (not entry.name or (word is not None and word.name)):
            entry.name = name
        if word is not None and word.master is not None:
            entry.master_id = word.master
        return entry

    def forget(self, agent_id: UUID) -> None:
        """Stop knowing an agent (no longer a child); its statuses are ignored until watched."""
        self._agents.pop(agent_id, None)
        self._forgotten.add(agent_id)

    def get(self, agent_id: UUID) -> AgentLiveness | None:
        """Return what is known of an agent."""
        return self._agents.get(agent_id)

    def agents(self) -> list[AgentLiveness]:
        """Return every watched agent."""
        return list(self._agents.values())

    def get_children(self, agent_id: UUID) -> list[AgentLiveness]:
        """Return the agents whose status says they report to agent_id."""
        return [a for a in self._agents.values() if a.master_id == agent_id]

    def liveness_snapshot(self) -> dict[str, dict[str, Any]]:
        """Return every agent's liveness as JSON-ready data, by id."""
        now = self._clock()
        return {str(a.id): a.as_dict(now) for a in self._agents.values()}

    def update(
        self,
        message: VOXMessage,
        *,
        retained: bool = False,
        presence: bool = False,
        expiry_left: float | None = None,
    ) -> StatusChange | None:
        """Apply a status message; return the change it made, if any.

        presence: it came on the presence topic, which says alive or not and the epoch but
        no master, commands or figures: only the liveness is taken from it.
        expiry_left: the MQTT message expiry the broker says is left (a retained will's
        tells when the broker published it: WILL_EXPIRY).
        """
        if message.type != MSG_AGENT_STATUS or message.source in self._forgotten:
            return None
        try:
            # Validated once per message: parse and new_message already did (and kept it).
            report = message.payload_as(AgentStatus)
        except ValidationError as exc:
            self._reject(message.source, describe(exc))
            return None
        entry = self.watch(message.source, report.name)
        problem = self._claim_problem(message, report, presence=presence)
        if problem is None:
            problem = self._out_of_bounds(entry, report, message.emitted_at, presence=presence)
        if problem is None and presence and report.status is None:
            problem = "a presence without a state"
        if problem is not None:
            self._reject(message.source, problem)
            return None
        age = status_age(message.emitted_at)
        if not self._current(report, age):
            self.not_current += 1
            log.info(
                "a status of %s not taken: emitted %.0fs ago, older than the replay window",
                entry.name or entry.id,
                age,
            )
            return None
        if report.status is None:
            return self._take_report(entry, message, report, age, retained=retained)
        if not self._supersedes(entry, report) or replayed(entry.sequences.get(presence), report):
            return None
        if report.sequence is not None:
            entry.sequences[presence] = (report.epoch, report.started_at, report.sequence)
        now = self._clock()
        if report.status == ACTIVE and not presence:
            listed = tuple(report.commands)
            if entry.advertised is not None and listed != entry.advertised:
                entry.changes.take(now)
            entry.advertised = listed
        received_at, entry.lost_at_known = self._dated(report, age, now, retained, expiry_left)
        if not (self.fleet_word(entry.id) or FleetWord()).name:
            entry.name = report.name  # nothing better known (signatures off, an agent's look)
        entry.error_code = report.error_code
        entry.epoch = report.epoch
        entry.started_at = report.started_at
        entry.heartbeat_interval = report.heartbeat_interval
        entry.version = report.version
        entry.last_heartbeat = message.emitted_at
        entry.received_at = received_at
        entry.retained = retained
        if report.status != ACTIVE:
            entry.commands = ()
        elif presence and entry.epoch_of_commands != report.epoch:
            # A birth seen first on the presence: its commands come with its full status.
            entry.commands = ()
        if not presence:
            self._take_master(entry, message.target)
            if report.status == ACTIVE:
                entry.commands = tuple(report.commands)
                entry.params = taken_params(report.params, entry.commands)
                entry.epoch_of_commands = report.epoch
                # Only an error code's choice hangs on it: cut to the share, never refused.
                share, down = self.share_of(entry.id), report.commands_down
                entry.commands_down = tuple(down if share is None else down[:share])
            entry.metrics = report.metrics or entry.metrics
            head = report.ledger_head
            entry.ledger_head = None if head is None else (head.row, head.hash)
        new_status: str = report.status
        if new_status == ACTIVE and self._is_stale(entry, now):
            new_status = STALE
        return self._set_status(entry, new_status)

    def _out_of_bounds(
        self, entry: AgentLiveness, report: AgentStatus, emitted_at: str, *, presence: bool
    ) -> str | None:
        """Return why a well-formed status is still not to be believed, or None."""
        problem = metrics_problem(report.metrics)
        if problem is not None:
            return problem
        if report.status in (ACTIVE, None) and not presence:
            problem = self._advertisement_problem(entry, report)
            if problem is not None:
                return problem
        return clock_problem(entry.epoch, report, emitted_at)

    def _claim_problem(
        self, message: VOXMessage, report: AgentStatus, *, presence: bool
    ) -> str | None:
        """Say why a status claims another name or master than the fleet's (F26), or None."""
        word = self.fleet_word(message.source)
        if word is None:
            return None
        if word.name is not None and report.name != word.name:
            # Another identity's name is an impersonation. Any other name is shown as the
            # fleet's and refused nowhere: a renamed agent restarts under its new name
            # before its master and the operator's bundle learn it (docs/operations.md).
            owner = self.named(report.name)
            if owner is not None and owner != message.source:
                return (
                    f"claims the name {report.name[:64]!r} of another identity;"
                    f" the fleet names it {word.name!r}"
                )
        # The root may address its status to the war room; nobody may name another master.
        if (
            not presence
            and word.master is not None
            and message.target not in (word.master, topics.WARROOM_ID)
        ):
            return f"claims {message.target} as its master; the fleet says {word.master}"
        return None

    def _take_master(self, entry: AgentLiveness, target: UUID) -> None:
        word = self.fleet_word(entry.id)
        if word is not None and word.master is not None:
            entry.master_id = word.master  # the fleet's, never the status's claim (F26)
        elif target != topics.WARROOM_ID or entry.master_id is None:
            entry.master_id = target

    def _current(self, report: AgentStatus, age: float) -> bool:
        """Tell whether a status may be taken by its age (F23, docs/security.md).

        A status that says the agent lives (ACTIVE, DEGRADED or a report) and is older
        than the replay window plus the skew by its own signed emitted_at is a replay: it
        could not have been verified as current. An INACTIVE is taken whatever its age: the
        will is built at connect, hours before the broker publishes it, and believing an
        agent down is the safe side.
        """
        t = self.timeliness
        return t is None or report.status == INACTIVE or age <= t.window + t.skew

    def _dated(
        self,
        report: AgentStatus,
        age: float,
        now: float,
        retained: bool,
        expiry_left: float | None,
    ) -> tuple[float, bool]:
        """Return when a status counts from on our monotonic clock, and whether that is
        known to be the loss's own time (a will by the broker's clock, or live)."""
        will = report.status == INACTIVE and report.sequence is None
        if will and expiry_left is not None and 0 < expiry_left <= WILL_EXPIRY:
            # A will with the expiry the broker counts down from its publish (WILL_EXPIRY):
            # the broker's clock says when the loss happened, retained or live.
            return now - (WILL_EXPIRY - expiry_left), True
        if retained:
            # A retained status found at subscribe time is as old as its emitted_at says.
            return now - age, not will
        t = self.timeliness
        if t is not None and report.status != INACTIVE:
            # Signed: a live status is also as old as its emitted_at says, less the clock
            # skew we allow (F23): a captured heartbeat replayed later is not fresh news.
            return now - max(0.0, age - t.skew), True
        # Afterwards only our own clock counts (hosts' clocks drift).
        return now, True

    def _take_report(
        self,
        entry: AgentLiveness,
        message: VOXMessage,
        report: AgentStatus,
        age: float,
        *,
        retained: bool,
    ) -> StatusChange | None:
        """Take a running agent's full status without a state word (docs/liveness.md).

        It brings what the presence does not carry (commands, figures, ledger head, master)
        and never the liveness, which is the presence's alone: its state, epoch and
        heartbeat time stay as the presence set them.
        """
        older = report.epoch < entry.epoch and report.started_at <= entry.started_at
        if older or replayed(entry.sequences.get(False), report):
            return None  # a session before the one held (its state dir kept), or a replay
        if report.sequence is not None:
            entry.sequences[False] = (report.epoch, report.started_at, report.sequence)
        now = self._clock()
        listed = tuple(report.commands)
        if entry.advertised is not None and listed != entry.advertised:
            entry.changes.take(now)
        entry.advertised = listed
        if not (self.fleet_word(entry.id) or FleetWord()).name:
            entry.name = report.name
        self._take_master(entry, message.target)
        entry.version = report.version
        entry.metrics = report.metrics or entry.metrics
        head = report.ledger_head
        entry.ledger_head = None if head is None else (head.row, head.hash)
        # A dead session's leftover lists nothing: what it served is gone with it.
        down = entry.status == INACTIVE and report.epoch <= entry.epoch
        entry.commands = () if down else listed
        entry.params = taken_params(report.params, entry.commands)
        entry.epoch_of_commands = report.epoch
        # What agents below it serve and nobody ACTIVE there does now: a running agent's
        # status carries no state word, so this is where it is taken (kept while the agent
        # is down: its master still answers TARGET_INACTIVE for them, docs/liveness.md).
        share, below = self.share_of(entry.id), report.commands_down
        entry.commands_down = tuple(below if share is None else below[:share])
        if not entry.seen:
            # Before any presence: known to exist, its liveness still UNKNOWN.
            entry.heartbeat_interval = report.heartbeat_interval
        if entry.status != ACTIVE or entry.epoch != report.epoch:
            return None
        # A report of the session held ACTIVE is a sign of life, as its presence is.
        fresh, _ = self._dated(report, age, now, retained, None)
        entry.received_at = max(entry.received_at, fresh)
        return None

    def _advertisement_problem(self, entry: AgentLiveness, report: AgentStatus) -> str | None:
        """Say why a status's commands are more than its share, or change too fast."""
        share = self.share_of(entry.id)
        if share is not None and len(report.commands) > share:
            return (
                f"advertises {len(report.commands)} commands, more than its share of"
                f" {share} in its master's advertisement"
            )
        changed = entry.advertised is not None and tuple(report.commands) != entry.advertised
        if changed and not entry.changes.allows(self._clock()):
            return (
                f"changes its commands faster than {ADVERT_CHANGE_BURST} at once,"
                f" then {ADVERT_CHANGE_RATE:g} per second"
            )
        return None

    def misbehaved(self, agent_id: UUID, reason: str) -> None:
        """Hold an agent as misbehaving for what else it sent (a flood of events, F25)."""
        self._reject(agent_id, reason)

    def _reject(self, agent_id: UUID, reason: str) -> None:
        """Refuse a status: the agent gets no work for a while and listeners are told."""
        entry = self.watch(agent_id)
        entry.rejected = reason
        entry.misbehaving_until = time.monotonic() + MISBEHAVING_HOLD
        for hook in self.reject_listeners:
            hook(entry, reason)

    def _supersedes(self, entry: AgentLiveness, report: AgentStatus) -> bool:
        if report.epoch > entry.epoch:
            return True
        if report.epoch == entry.epoch:
            # Same session: a will or shutdown after its own heartbeats is news; an ACTIVE
            # after that session's INACTIVE is a reordered leftover, unless it started later:
            # an agent whose state dir was wiped begins again at the epoch it had.
            if entry.status == INACTIVE and report.status == ACTIVE:
                return report.started_at > entry.started_at
            return True
        # An older epoch is a delayed will of a superseded session, unless the agent's
        # state dir was wiped: then a later start on the same host's clock wins.
        return report.status == ACTIVE and report.started_at > entry.started_at

    def _is_stale(self, entry: AgentLiveness, now: float) -> bool:
        age = entry.heartbeat_age(now)
        return (
            entry.heartbeat_interval > 0
            and age is not None
            and age > self.stale_after * entry.heartbeat_interval
        )

    def refresh(self) -> list[StatusChange]:
        """Mark agents whose heartbeat is too old as STALE; return the changes."""
        now = self._clock()
        changes = []
        for entry in self._agents.values():
            if entry.status == ACTIVE and self._is_stale(entry, now):
                change = self._set_status(entry, STALE)
                if change is not None:
                    changes.append(change)
        return changes

    def _set_status(self, entry: AgentLiveness, new: str) -> StatusChange | None:
        old = entry.status
        entry.status = new
        if old == new:
            return None
        for hook in list(self.listeners):
            hook(entry, old, new)
        return StatusChange(agent=entry, old=old, new=new)

    def commands_by(self, agent_ids: Iterable[UUID]) -> dict[UUID, tuple[str, ...]]:
        """Return the commands each healthy agent among these advertises."""
        found: dict[UUID, tuple[str, ...]] = {}
        for agent_id in agent_ids:
            entry = self._agents.get(agent_id)
            if entry is not None and entry.healthy:
                found[agent_id] = entry.commands
        return found

    def commands_of(self, agent_ids: Iterable[UUID]) -> set[str]:
        """Return the commands advertised by the healthy agents among these."""
        commands: set[str] = set()
        for agent_id in agent_ids:
            entry = self._agents.get(agent_id)
            if entry is not None and entry.healthy:
                commands.update(entry.commands)
        return commands
