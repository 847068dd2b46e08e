"""What the web console shows (docs/web.md): the rows of the tree, the war room, and what
changed since the last push to the browsers.

`WebState` wraps the `FleetObserver` the console reads with: every message it takes marks
the agent (or the war room) changed, and `flush()` returns what changed since the last
call, at most every push interval, so a thousand heartbeating agents cost the browser one
batch a quarter second. The rows are plain JSON data; the browser puts every string of
them in the page as text (`textContent`), never as markup.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from vox_mqtt.console.commandform import command_specs, params_of_status
from vox_mqtt.observe.metrics import parse_snapshot, quantile
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.observe.status import ACTIVE, AgentLiveness
from vox_mqtt.observe.summary import MISBEHAVING, SUMMARY_ABOVE, summarise
from vox_mqtt.observe.warroom import Incident
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.errors import TopicError
from vox_mqtt.protocol.sitelinks import LinkWatch, parse_link_topic
from vox_mqtt.transport.session import Inbound

__all__ = [
    "HISTORY_POINTS",
    "HISTORY_STEP",
    "RESOLVED_FILE",
    "RESOLVED_KEPT",
    "WebState",
    "agent_row",
    "bind_problem",
    "incident_row",
    "is_loopback",
    "same_secret",
]

RESOLVED_KEPT: Final = 3600.0  # resolved incidents are listed for the last hour
SUMMARY_EVERY: Final = 1.0  # seconds between two summaries of a big fleet to the browsers
SILENCE_GRACE: Final = 1.0  # past the longest heartbeat interval, silence means the link
RESOLVED_FILE: Final = "resolved.jsonl"  # where, in the operator's state dir, they outlive it
_RESOLVED_MAX: Final = 500
# The war room's posts as they came (new and resolved), numbered, for `vox warroom --follow`
# through the console: a follower asks for those after the last number it printed.
POSTS_KEPT: Final = 1000
HISTORY_STEP: Final = 30.0  # one chart point per agent every 30 s ...
HISTORY_POINTS: Final = 120  # ... over the last hour


def is_loopback(host: str) -> bool:
    """Return whether a listen address only this host can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_problem(host: str, token: str | None, tls: bool = False) -> str | None:
    """Return why the console may not listen on host with this token, or None (docs/web.md).

    Loopback is served as is; any other address needs a token or TLS.
    """
    if token is not None and len(token) < 16:
        return "--token must be at least 16 characters (or use --generate-token)"
    if token is None and not tls and not is_loopback(host):
        return (
            f"refusing to listen on {host} without a token: anyone who reaches it would see "
            "the fleet; give --token-file FILE or --generate-token (or --tls-cert and "
            "--tls-key), or listen on 127.0.0.1"
        )
    return None


def same_secret(given: str | None, expected: str) -> bool:
    """Compare a presented token with the expected one in constant time."""
    return given is not None and secrets.compare_digest(given.encode(), expected.encode())


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def agent_row(entry: AgentLiveness, now: float, site: str | None = None) -> dict[str, Any]:
    """Return one agent's line of the tree as JSON-ready data (figures only while ACTIVE)."""
    metrics = entry.metrics or {}
    live = entry.status == ACTIVE
    snapshot = parse_snapshot(metrics.get("agent")) if live else None
    rate = errors = p50 = None
    if snapshot is not None:
        rate = snapshot.messages_per_s
        errors = snapshot.errors()
        handler = snapshot.histograms.get("command_handler_seconds")
        p50 = None if handler is None else quantile(handler, 0.5)
    age = entry.heartbeat_age(now)
    return {
        "id": str(entry.id),
        "name": entry.name,
        "master_id": None if entry.master_id is None else str(entry.master_id),
        "status": entry.status,
        "error_code": entry.error_code,
        "misbehaving": entry.misbehaving(now),
        "rejected": entry.rejected if entry.misbehaving(now) else None,
        "epoch": entry.epoch,
        "version": entry.version,
        "interval": entry.heartbeat_interval,
        "age_s": None if age is None else round(age, 3),
        "commands": list(entry.commands),
        "cpu": _number(metrics.get("cpu_percent")) if live else None,
        "mem": _number(metrics.get("memory_percent")) if live else None,
        "disk": _number(metrics.get("disk_percent")) if live else None,
        "rss": _number(metrics.get("process_rss_bytes")) if live else None,
        "rate": rate,
        "errors": errors,
        "p50_ms": None if p50 is None else round(p50 * 1000, 2),
        "site": site,
    }


def incident_row(incident: Incident, received: float) -> dict[str, Any]:
    """Return a war-room post as JSON-ready data; received is the console's wall clock."""
    row = incident.as_dict()
    row["received"] = received
    return row


class WebState:
    """The observer's fleet as the browser sees it, with what changed since the last flush."""

    def __init__(
        self,
        observer: FleetObserver,
        *,
        top: UUID,
        top_name: str,
        links: LinkWatch | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        resolved_file: Path | None = None,
    ) -> None:
        self.observer = observer
        self.top = top
        self.top_name = top_name
        self.links = links
        self._clock = clock
        self._wall = wall
        self._dirty: set[UUID] = set()
        self._warroom_dirty = False
        self._opened: dict[tuple[UUID, UUID], float] = {}  # when this console first heard each
        self._resolved: deque[dict[str, Any]] = deque(maxlen=_RESOLVED_MAX)
        self._posts: deque[tuple[int, Incident]] = deque(maxlen=POSTS_KEPT)
        self._posted = 0  # how many posts came (the number of the last one)
        self._history: dict[UUID, deque[tuple[float, float | None, float | None]]] = {}
        self._history_at: dict[UUID, float] = {}
        self.connected = False  # whether the console's broker link is up
        # Wall clock: since when the link is down (None: up); before the first connection,
        # since the console started: nothing was known before either.
        self.down_since: float | None = wall()
        # A link that says it is up but brings nothing (a frozen broker: TCP stays open until
        # the keepalive runs out) is silent past every heartbeat interval: since the last
        # message, nothing is known (docs/web.md).
        self._heard_at = clock()
        self._heard_wall = wall()
        self.silent_since: float | None = None
        self._summary_at = float("-inf")
        self._params: dict[UUID, dict[str, Any]] = {}  # what each status says of its commands
        # The resolved incidents outlive a restart of the console in this file (docs/web.md).
        self.resolved_file = resolved_file
        self._load_resolved()
        observer.on_incident = self._incident
        observer.view.add_listener(lambda entry, _old, _new: self._dirty.add(entry.id))

    def wall(self) -> float:
        """Return the console's wall clock (seconds since the epoch)."""
        return self._wall()

    # --- intake ---------------------------------------------------------------------------

    def take(self, inbound: Inbound) -> None:
        """Apply one message of the console's subscriptions and mark what it changed."""
        self._heard_at, self._heard_wall = self._clock(), self._wall()
        if self.silent_since is not None:
            self.silent_since = None
            self._warroom_dirty = True
            self._dirty.update(a.id for a in self.observer.view.agents())
        if self.links is not None and parse_link_topic(inbound.topic) is not None:
            if self.links.take(inbound.topic, inbound.payload) is not None:
                self._dirty.update(a.id for a in self.observer.view.agents())
            return
        self.observer.take(inbound)
        try:
            topic = topics.parse_topic(inbound.topic)
        except TopicError:
            return
        if isinstance(topic, topics.StatusTopic):
            self._dirty.add(topic.agent)
            self._remember(topic.agent)
            self._keep_params(topic.agent, inbound.payload)
        elif isinstance(topic, topics.WarroomTopic):
            self._warroom_dirty = True

    def link(self, up: bool) -> None:
        """Note the broker link went up or down.

        A resolution clears its retained post (docs/liveness.md): one missed while the link
        was down would leave the incident open here for good. So the open incidents are
        forgotten when it drops; the reconnect brings every retained one back.
        """
        if up:
            self.down_since = None
            self._heard_at, self._heard_wall = self._clock(), self._wall()
        elif self.connected or self.down_since is None:
            self.down_since = self._wall()
        self.connected = up
        self._warroom_dirty = True
        if not up:
            self.observer.incidents.clear()

    def link_state(self) -> tuple[bool, float | None]:
        """Return whether anything is known now, and since when it is not (wall clock)."""
        if not self.connected:
            return False, self.down_since
        if self.silent_since is not None:
            return False, self.silent_since
        return True, None

    def _watch_silence(self) -> None:
        """Call the link silent once no status came for longer than every heartbeat."""
        if not self.connected or self.silent_since is not None:
            return
        intervals = [
            a.heartbeat_interval for a in self.observer.view.agents() if a.status == ACTIVE
        ]
        if not intervals:
            return  # nobody is expected to speak
        if self._clock() - self._heard_at > max(intervals) + SILENCE_GRACE:
            self.silent_since = self._heard_wall
            self._warroom_dirty = True

    def _keep_params(self, agent: UUID, payload: bytes) -> None:
        """Keep what a full status says of its commands' parameters (the send form's)."""
        entry = self.observer.view.get(agent)
        if entry is None or entry.misbehaving() or b'"commands"' not in payload:
            return  # a refused status, or a presence message: it says nothing of them
        params = params_of_status(payload)
        if params is None:
            self._params.pop(agent, None)
        else:
            self._params[agent] = params

    def command_specs(self, agent: UUID, commands: list[str]) -> dict[str, Any]:
        """Return the parameters the agent describes of these commands (commandform.py)."""
        return command_specs(self._params.get(agent), commands)

    def posts_since(self, seen: int) -> tuple[int, int, list[Incident]]:
        """Return (the last post's number, how many after `seen` are no longer kept, the
        posts after `seen` that are). A negative `seen` asks for none: where to start."""
        if seen < 0:
            return self._posted, 0, []
        kept = [incident for number, incident in self._posts if number > seen]
        missed = max(0, self._posted - seen - len(kept))
        return self._posted, missed, kept

    def _incident(self, incident: Incident) -> None:
        self._warroom_dirty = True
        self._posted += 1
        self._posts.append((self._posted, incident))
        now = self._wall()
        if incident.failure.resolved:
            row = self._named(incident_row(incident, now))
            row["opened"] = self._opened.pop(incident.key, None)
            self._resolved.append(row)
            self._save_resolved()
        else:
            self._opened.setdefault(incident.key, now)

    def name_of(self, agent: str | None) -> str | None:
        """Return the name of an agent by its id's text, when this console knows it."""
        if agent is None:
            return None
        if agent == str(self.top):
            return self.top_name
        try:
            entry = self.observer.view.get(UUID(agent))
        except ValueError:
            return None
        return entry.name if entry is not None and entry.name else None

    def names(self) -> dict[str, str]:
        """Return id -> name of every agent this console knows, and its top's."""
        out = {str(e.id): e.name for e in self.observer.view.agents() if e.name}
        out.setdefault(str(self.top), self.top_name)
        return out

    def root_of_top(self) -> UUID | None:
        """Return the agent whose status reports to the top (the root, for the operator)."""
        return next((e.id for e in self.observer.view.agents() if e.master_id == self.top), None)

    def _named(self, row: dict[str, Any]) -> dict[str, Any]:
        for key in ("subject", "source"):
            row[f"{key}_name"] = self.name_of(row.get(key)) or row.get(f"{key}_name")
        return row

    def _load_resolved(self) -> None:
        """Read back the incidents resolved within the hour before this console started."""
        if self.resolved_file is None:
            return
        try:
            text = self.resolved_file.read_text(encoding="utf-8")
        except OSError:
            return
        now = self._wall()
        seen: set[tuple[Any, ...]] = set()
        for line in text.splitlines():
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                continue  # a torn line
            if not isinstance(row, dict) or not isinstance(row.get("received"), int | float):
                continue
            key = (row.get("subject"), row.get("error_code"), row.get("emitted_at"))
            if now - float(row["received"]) <= RESOLVED_KEPT and key not in seen:
                seen.add(key)
                self._resolved.append(row)

    def _save_resolved(self) -> None:
        """Write the last hour's resolved incidents (a whole new file, renamed over the old)."""
        if self.resolved_file is None:
            return
        now = self._wall()
        kept = [r for r in self._resolved if now - float(r["received"]) <= RESOLVED_KEPT]
        text = "".join(json.dumps(r, default=str) + "\n" for r in kept)
        tmp = self.resolved_file.with_name(f".{self.resolved_file.name}.{os.getpid()}")
        with contextlib.suppress(OSError):  # a read-only state dir: kept in memory only
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self.resolved_file)

    def _remember(self, agent: UUID) -> None:
        """Keep one chart point per agent every HISTORY_STEP seconds (docs/web.md)."""
        entry = self.observer.view.get(agent)
        if entry is None or entry.status != ACTIVE:
            return
        now = self._wall()
        if now - self._history_at.get(agent, 0.0) < HISTORY_STEP:
            return
        self._history_at[agent] = now
        metrics = entry.metrics or {}
        snapshot = parse_snapshot(metrics.get("agent"))
        rate = None if snapshot is None else snapshot.messages_per_s
        points = self._history.setdefault(agent, deque(maxlen=HISTORY_POINTS))
        points.append((now, _number(metrics.get("process_rss_bytes")), rate))

    # --- what the browser is sent ---------------------------------------------------------

    def _site_of(self, agent: UUID) -> str | None:
        if self.links is None:
            return None
        return next((link.site for link in self.links.map.links if agent in link.behind), None)

    def _shown(self, entries: list[AgentLiveness]) -> list[AgentLiveness]:
        seen = [a for a in entries if a.seen or a.misbehaving()]
        return seen if self.links is None else self.links.overlay(seen)

    def rows(self, ids: set[UUID] | None = None) -> list[dict[str, Any]]:
        """Return the rows of these agents (every agent seen when None)."""
        view = self.observer.view
        if ids is None:
            entries = view.agents()
        else:
            entries = [e for e in (view.get(i) for i in ids) if e is not None]
        now = self._clock()
        return [agent_row(e, now, self._site_of(e.id)) for e in self._shown(entries)]

    def summary(self, above: int = SUMMARY_ABOVE) -> dict[str, Any] | None:
        """Return the fleet summarised when it has more than `above` agents (else None)."""
        entries = self._shown(self.observer.view.agents())
        if len(entries) <= above:
            return None
        now = self._clock()
        return summarise(
            (
                (
                    e.name or str(e.id),
                    MISBEHAVING if e.misbehaving(now) else e.status,
                    self._site_of(e.id),
                )
                for e in entries
            ),
            refs=[str(e.id) for e in entries],
        ).as_dict()

    def warroom(self) -> dict[str, Any]:
        """Return the open incidents and those resolved within the last hour."""
        now = self._wall()
        open_rows = []
        for incident in self.observer.incidents.values():
            row = incident_row(incident, self._opened.get(incident.key, now))
            open_rows.append(self._named(row))
        open_rows.sort(key=lambda r: str(r["emitted_at"]))
        resolved = [r for r in self._resolved if now - float(r["received"]) <= RESOLVED_KEPT]
        return {"open": open_rows, "resolved": resolved[::-1]}

    def snapshot(self) -> dict[str, Any]:
        """Return everything the page draws at first paint."""
        self.observer.view.refresh()
        return {
            "top": {"id": str(self.top), "name": self.top_name},
            "agents": self.rows(),
            "summary": self.summary(),
            "warroom": self.warroom(),
            "links": self._links(),
            "connected": self.link_state()[0],
            "down_since": self.link_state()[1],
            "now": self._wall(),
        }

    def _links(self) -> list[dict[str, Any]]:
        if self.links is None:
            return []
        rows = []
        for link in self.links.map.links:
            up = self.links.up.get(link.id)
            rows.append(
                {"site": link.site, "state": "UNKNOWN" if up is None else ("UP" if up else "DOWN")}
            )
        return rows

    def flush(self) -> dict[str, Any] | None:
        """Return what changed since the last flush (None when nothing did)."""
        self.observer.view.refresh()  # a heartbeat grown too old turns STALE here
        self._watch_silence()
        dirty, self._dirty = self._dirty, set()
        warroom, self._warroom_dirty = self._warroom_dirty, False
        if not dirty and not warroom:
            return None
        batch: dict[str, Any] = {"agents": self.rows(dirty), "now": self._wall()}
        now = self._clock()
        big = len(self.observer.view.agents()) > SUMMARY_ABOVE
        if dirty and big and now - self._summary_at >= SUMMARY_EVERY:
            self._summary_at = now
            batch["summary"] = self.summary()  # a big fleet: its counts, not every row
        if warroom:
            batch["warroom"] = self.warroom()
            batch["links"] = self._links()
            batch["connected"], batch["down_since"] = self.link_state()
        return batch

    def agent_page(self, agent: UUID) -> dict[str, Any] | None:
        """Return one agent's page: its row, children, chart points and open incidents."""
        entry = self.observer.view.get(agent)
        if entry is None or not (entry.seen or entry.misbehaving()):
            return None
        now = self._clock()
        children = self.observer.view.get_children(agent)
        incidents = [
            incident_row(i, self._opened.get(i.key, self._wall()))
            for i in self.observer.incidents.values()
            if agent in i.key
        ]
        return {
            "agent": agent_row(self._shown([entry])[0], now, self._site_of(agent)),
            "children": [agent_row(c, now) for c in sorted(children, key=lambda c: c.name)],
            "history": [
                {"at": at, "rss": rss, "rate": rate}
                for at, rss, rate in self._history.get(agent, ())
            ],
            "incidents": incidents,
        }
