"""The only place VOX topic strings and filters are built or parsed (docs/topics.md)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final
from uuid import UUID

from vox_mqtt.protocol.errors import TopicError

__all__ = [
    "LINK_FILTER",
    "LIVENESS_FILTERS",
    "PREFIX",
    "PRESENCE_FILTER",
    "STATUS_FILTER",
    "WARROOM_FILTER",
    "WARROOM_ID",
    "InboxTopic",
    "StatusTopic",
    "WarroomTopic",
    "child_liveness",
    "inbox",
    "inbox_filter",
    "link",
    "liveness_topics",
    "parse_topic",
    "presence",
    "status",
    "warroom",
    "warroom_filter",
    "with_presences",
]

PREFIX: Final = "vox"
# The war room is no agent: its posts carry this fixed id as `target`, so that an
# agent never needs to know who reads them (root and operator do).
WARROOM_ID: Final = UUID("00000000-0000-4000-8000-000000000911")
WARROOM_FILTER: Final = f"{PREFIX}/warroom/#"
# Every agent's retained status: what the operator's console and observers read.
STATUS_FILTER: Final = f"{PREFIX}/+/status"
# Every agent's retained presence (alive, epoch): its children read it, and its will lands
# there (docs/liveness.md); a watcher of the whole fleet reads both filters.
PRESENCE_FILTER: Final = f"{PREFIX}/+/presence"
LIVENESS_FILTERS: Final = (STATUS_FILTER, PRESENCE_FILTER)
# A site broker's bridge keeps its state ("1" up, "0" down) here (docs/federation.md).
LINK_FILTER: Final = f"{PREFIX}/link/+"


@dataclass(frozen=True, slots=True)
class InboxTopic:
    """`vox/<target>/inbox/<source>`: a message from source to target."""

    target: UUID
    source: UUID

    @property
    def topic(self) -> str:
        """Return the topic string."""
        return inbox(self.target, self.source)


@dataclass(frozen=True, slots=True)
class StatusTopic:
    """`vox/<agent>/status` (its full report) or `vox/<agent>/presence` (alive, epoch)."""

    agent: UUID
    presence: bool = False  # the presence topic, which its children may read too

    @property
    def topic(self) -> str:
        """Return the topic string."""
        return presence(self.agent) if self.presence else status(self.agent)


@dataclass(frozen=True, slots=True)
class WarroomTopic:
    """`vox/warroom/<source>/<subject>`: one open incident, retained until resolved."""

    source: UUID
    subject: UUID

    @property
    def topic(self) -> str:
        """Return the topic string."""
        return warroom(self.source, self.subject)


# Topics and ids already worked out: an agent writes to and hears from the same few peers, and
# a UUID's text is built anew at every str(). Bounded: emptied when full.
_INBOXES: dict[tuple[UUID | str, UUID | str], str] = {}
_IDS: dict[str, UUID] = {}
_REMEMBERED: Final = 4096


def inbox(target: UUID | str, source: UUID | str) -> str:
    """Return the topic on which source writes to target (ids as UUIDs or their str())."""
    topic = _INBOXES.get((target, source))
    if topic is None:
        if len(_INBOXES) >= _REMEMBERED:
            _INBOXES.clear()
        topic = _INBOXES[target, source] = f"{PREFIX}/{target}/inbox/{source}"
    return topic


def inbox_filter(agent: UUID | str) -> str:
    """Return the filter an agent subscribes to for its whole inbox."""
    return f"{PREFIX}/{agent}/inbox/+"


def status(agent: UUID | str) -> str:
    """Return the agent's retained status topic."""
    return f"{PREFIX}/{agent}/status"


def presence(agent: UUID | str) -> str:
    """Return the agent's retained presence topic: alive or not, its epoch, nothing more."""
    return f"{PREFIX}/{agent}/presence"


def child_liveness(child: UUID) -> list[str]:
    """Return what a master reads of one child: its full status and its presence (the will)."""
    return [status(child), presence(child)]


def liveness_topics(
    agent: UUID, master: UUID | None, children: Iterable[UUID], *, own: bool
) -> list[str]:
    """Return the liveness topics an agent subscribes to (docs/topics.md).

    Its master's presence only: the master's full status names the master's own master
    and its other children's commands, which a child must not learn.
    """
    out = [] if master is None else [presence(master)]
    for child in sorted(children):
        out += child_liveness(child)
    if own:
        # Our own too: a late will of an older session landing there is answered with our
        # birth at once (Liveness._on_own_status).
        out += [status(agent), presence(agent)]
    return out


def with_presences(filters: Iterable[str]) -> list[str]:
    """Return the filters with each status filter's presence beside it (once).

    A running agent's full status says no state: its presence, where the will lands, does
    (docs/liveness.md, "Which topic tells"). Whoever asks for statuses gets both.
    """
    out = list(filters)
    for wanted in list(out):
        if wanted.startswith(f"{PREFIX}/") and wanted.endswith("/status"):
            twin = wanted[: -len("status")] + "presence"
            if twin not in out:
                out.append(twin)
    return out


def warroom(source: UUID | str, subject: UUID | str) -> str:
    """Return the war-room topic of source's incident about subject."""
    return f"{PREFIX}/warroom/{source}/{subject}"


def warroom_filter(source: UUID | None = None) -> str:
    """Return the filter for the whole war room, or for one source's incidents."""
    return WARROOM_FILTER if source is None else f"{PREFIX}/warroom/{source}/+"


def link(bridge: UUID) -> str:
    """Return the retained topic of a bridge's state, its notification topic."""
    return f"{PREFIX}/link/{bridge}"


def _uuid(level: str, topic: str) -> UUID:
    known = _IDS.get(level)
    if known is not None:
        return known
    value = _parsed_uuid(level, topic)
    if len(_IDS) >= _REMEMBERED:
        _IDS.clear()
    _IDS[level] = value  # only a canonical spelling gets here
    return value


def _parsed_uuid(level: str, topic: str) -> UUID:
    try:
        value = UUID(level)
    except ValueError:
        raise TopicError(f"{topic!r}: {level!r} is not a UUID") from None
    if str(value) != level:
        # Only the canonical spelling: the ACL matches topic strings literally.
        raise TopicError(f"{topic!r}: {level!r} is not a canonical lower-case UUID")
    return value


def parse_topic(topic: str) -> InboxTopic | StatusTopic | WarroomTopic:
    """Parse a VOX topic; raise TopicError for anything outside the scheme."""
    levels = topic.split("/")
    if len(levels) < 3 or levels[0] != PREFIX:
        raise TopicError(f"{topic!r} is not a VOX topic")
    if levels[1] == "warroom" and len(levels) == 4:
        return WarroomTopic(_uuid(levels[2], topic), _uuid(levels[3], topic))
    if len(levels) == 3 and levels[2] in ("status", "presence"):
        return StatusTopic(_uuid(levels[1], topic), presence=levels[2] == "presence")
    if len(levels) == 4 and levels[2] == "inbox":
        return InboxTopic(_uuid(levels[1], topic), _uuid(levels[3], topic))
    raise TopicError(f"{topic!r} is not a VOX topic")
