"""Bridge links as an observer sees them: which agents sit behind which link, and which are down.

A site broker's bridge keeps a retained "1" on `vox/link/<bridge>` while it is up and
leaves "0" as its will on the upstream broker (docs/federation.md). An observer that
knows which agents sit behind which bridge marks them `SITE_LINK_LOST` at once instead
of waiting for their heartbeats to go stale, and one incident stands for the whole site.

What an identity may know of the links comes from `vox agent render`, which writes a
`NAME.links.json` beside the config (a master: the links between it and its children;
the operator: every link). Fleets with one broker have no such file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from vox_mqtt.protocol import topics
from vox_mqtt.protocol.boundedfile import MAX_CONFIG_BYTES, read_regular

__all__ = [
    "LINK_FILTER",
    "LINK_SETTLE",
    "SITE_LINK_LOST",
    "UNREACHABLE",
    "LinkMap",
    "LinkWatch",
    "SiteLinkDuty",
    "links_path",
    "parse_link_topic",
]

SITE_LINK_LOST: Final = "SITE_LINK_LOST"
# Seconds a child's fresh loss behind a link waits for the link's own news.
LINK_SETTLE: Final = 3.0
UNREACHABLE: Final = "UNREACHABLE"
LINK_FILTER: Final = topics.LINK_FILTER


def links_path(config: Path) -> Path:
    """Return where the link map of a config lives: beside it, NAME.links.json."""
    return config.with_name(config.stem + ".links.json")


def parse_link_topic(topic: str) -> UUID | None:
    """Return the bridge id of a `vox/link/<bridge>` topic, or None for any other topic."""
    levels = topic.split("/")
    if len(levels) != 3 or levels[0] != topics.PREFIX or levels[1] != "link":
        return None
    try:
        bridge = UUID(levels[2])
    except ValueError:
        return None
    return bridge if str(bridge) == levels[2] else None


@dataclass(frozen=True, kw_only=True)
class Link:
    """One bridge as an identity knows it: its site and the agents behind it (for this one)."""

    id: UUID
    site: str
    behind: frozenset[UUID]
    owner: bool  # this identity posts the one war-room incident about it
    # The most seconds its bridge waits between two tries (restart_timeout's cap): after a
    # restart of the upstream the link is back within it (protocol/storm.py).
    restart_cap: float = 10.0


@dataclass(frozen=True, kw_only=True)
class LinkMap:
    """The links an identity watches."""

    links: tuple[Link, ...] = ()

    @property
    def topics(self) -> list[str]:
        """Return the link topics to subscribe to (exact ones: dynsec refuses a wildcard)."""
        return [topics.link(link.id) for link in self.links]

    def as_json(self) -> dict[str, Any]:
        """Return the map as the JSON a links file holds."""
        return {
            "links": [
                {
                    "id": str(link.id),
                    "site": link.site,
                    "behind": sorted(str(a) for a in link.behind),
                    "owner": link.owner,
                    "restart_cap": link.restart_cap,
                }
                for link in self.links
            ]
        }

    @classmethod
    def from_json(cls, data: Any) -> LinkMap:
        """Build a map from links-file JSON; raise ValueError if it is not one."""
        if not isinstance(data, dict) or not isinstance(data.get("links"), list):
            raise ValueError("not a links file: no `links` list")
        links = []
        for item in data["links"]:
            if not isinstance(item, dict):
                raise ValueError("a link must be an object")
            links.append(
                Link(
                    id=UUID(str(item["id"])),
                    site=str(item.get("site", "")),
                    behind=frozenset(UUID(str(a)) for a in item.get("behind", [])),
                    owner=bool(item.get("owner", False)),
                    restart_cap=float(item.get("restart_cap", 10.0)),
                )
            )
        return cls(links=tuple(links))

    @classmethod
    def beside(cls, config: Path) -> LinkMap | None:
        """Load the map beside a config; None when the fleet has one broker (no file)."""
        path = links_path(config)
        try:
            raw = read_regular(path, limit=MAX_CONFIG_BYTES)
            return cls.from_json(json.loads(raw.decode("utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"{path}: {exc}") from None


@dataclass
class LinkWatch:
    """The last known state of each watched link; who is unreachable because of it."""

    map: LinkMap
    up: dict[UUID, bool] = field(default_factory=dict)

    def take(self, topic: str, payload: bytes) -> tuple[UUID, bool] | None:
        """Apply a link notification; return (bridge, up) when its state changed."""
        bridge = parse_link_topic(topic)
        if bridge is None or bridge not in {link.id for link in self.map.links}:
            return None
        state = payload.strip() == b"1"
        if self.up.get(bridge) == state:
            return None
        self.up[bridge] = state
        return bridge, state

    def down(self) -> list[Link]:
        """Return the links known to be down."""
        return [link for link in self.map.links if self.up.get(link.id) is False]

    def lost_via(self, agent: UUID) -> Link | None:
        """Return a down link the agent sits behind, or None if nothing cuts it off."""
        return next((link for link in self.down() if agent in link.behind), None)

    def overlay(self, agents: Iterable[Any]) -> list[Any]:
        """Return AgentLiveness entries with those behind a down link shown UNREACHABLE."""
        shown = []
        for entry in agents:
            if self.lost_via(entry.id) is not None:
                entry = replace(entry, status=UNREACHABLE, error_code=SITE_LINK_LOST)
            shown.append(entry)
        return shown


class SiteLinkDuty:
    """What a master does about its links: whom to leave alone, which incident to hold open."""

    def __init__(self, links: LinkMap, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.watch = LinkWatch(links)
        self._by_id = {link.id: link for link in links.links}
        self._clock = clock
        self._back_at: dict[UUID, float] = {}
        self._down_at: dict[UUID, float] = {}  # when each link was last heard go down

    @property
    def topics(self) -> list[str]:
        """Return the link topics to subscribe to."""
        return self.watch.map.topics

    def take(self, topic: str, payload: bytes) -> tuple[Link, bool] | None:
        """Apply a link notification; return (link, up) when its state changed."""
        bridge = parse_link_topic(topic)
        was_down = bridge is not None and self.watch.up.get(bridge) is False
        change = self.watch.take(topic, payload)
        if change is None:
            return None
        if not change[1]:
            self._down_at[change[0]] = self._clock()
        if was_down and change[1]:
            # Back from down: the site's agents are reborn within the grace (first news of
            # a link that is up is no return, and starts no grace).
            self._back_at[change[0]] = self._clock()
        return self._by_id[change[0]], change[1]

    def cut_off(self, agent: UUID) -> bool:
        """Return whether the agent sits behind a link that is down."""
        return self.watch.lost_via(agent) is not None

    def holds(self, agent: UUID, received_at: float, grace: float) -> bool:
        """Return whether a child's loss is the site's, not its own, or may yet turn out so.

        True when the child sits behind a link that is down; behind one that came back less
        than `grace` ago (its agents are reborn within it); or
        when its last status is under LINK_SETTLE old: a site broker that stops publishes
        its clients' wills just before its bridge's own "0" arrives.
        """
        now = self._clock()
        for link in self.watch.map.links:
            if agent not in link.behind:
                continue
            if self.watch.up.get(link.id) is False:
                return True
            back_at = self._back_at.get(link.id)
            if back_at is not None and now - back_at < grace:
                return True
            if now - received_at < LINK_SETTLE:
                return True
        return False

    def down_since(self, bridge: UUID) -> float | None:
        """Return when a link was last heard go down (on this clock), None if never."""
        return self._down_at.get(bridge)

    def link(self, subject: UUID) -> Link | None:
        """Return the link a war-room subject names, or None if it is no link of ours."""
        return self._by_id.get(subject)

    def owned_down(self) -> list[Link]:
        """Return the links down whose one incident this agent posts."""
        return [link for link in self.watch.down() if link.owner]

    def known_up(self, subject: UUID) -> bool:
        """Return whether a link has been heard up (not merely never heard of)."""
        return self.watch.up.get(subject) is True
