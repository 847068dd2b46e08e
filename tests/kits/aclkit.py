"""The access docs/topics.md grants each identity, written out independently of vox_mqtt.acl."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from uuid import UUID

from vox_mqtt.broker.acl import Kind, fleet_identities
from vox_mqtt.protocol.hierarchy import Fleet


@dataclass(frozen=True)
class Who:
    """One identity as docs/topics.md sees it."""

    name: str
    id: UUID
    kind: str  # agent | operator | look (the operator's read-only looks)
    master: UUID | None
    children: frozenset[UUID]

    @property
    def peers(self) -> frozenset[UUID]:
        return self.children | ({self.master} if self.master else frozenset())


def people(fleet: Fleet) -> dict[str, Who]:
    out = {
        fleet.operator_name: Who(
            fleet.operator_name, fleet.operator_id, "operator", None, frozenset({fleet.root.id})
        )
    }
    for look in (i for i in fleet_identities(fleet) if i.kind is Kind.LOOK):
        out[look.name] = Who(look.name, look.id, "look", None, frozenset())
    for agent in fleet:
        master = agent.master_id or fleet.operator_id
        kids = frozenset(a.id for a in fleet if a.master_id == agent.id)
        out[agent.name] = Who(agent.name, agent.id, "agent", master, kids)
    return out


def expected_write(who: Who, topic: str, root: UUID) -> bool:
    """Inbox: only under its own id, only to master/children; own status; posts about self/kids."""
    levels = topic.split("/")
    if len(levels) == 4 and levels[0] == "vox" and levels[2] == "inbox":
        return levels[3] == str(who.id) and UUID(levels[1]) in who.peers
    if len(levels) == 3 and levels[0] == "vox" and levels[2] in ("status", "presence"):
        return who.kind == "agent" and levels[1] == str(who.id)
    if len(levels) == 4 and levels[:2] == ["vox", "warroom"]:
        # Posts about itself or one of its own children, never about anyone else.
        subject = UUID(levels[3])
        return (
            who.kind == "agent"
            and levels[2] == str(who.id)
            and (subject == who.id or subject in who.children)
        )
    return False


def expected_read(who: Who, topic: str, root: UUID) -> bool:
    """Own inbox; status of self and children, presence of them and the master (operator: all).

    The war room: root and operator. A master's full status names its own master and its
    other children's commands: its children read only its presence.
    """
    levels = topic.split("/")
    if len(levels) == 4 and levels[0] == "vox" and levels[2] == "inbox":
        return levels[1] == str(who.id)
    if len(levels) == 3 and levels[0] == "vox" and levels[2] == "status":
        subject = UUID(levels[1])
        return who.kind in ("operator", "look") or subject == who.id or subject in who.children
    if len(levels) == 3 and levels[0] == "vox" and levels[2] == "presence":
        subject = UUID(levels[1])
        return who.kind in ("operator", "look") or subject == who.id or subject in who.peers
    if len(levels) >= 3 and levels[:2] == ["vox", "warroom"]:
        # The whole war room, so that topics.WARROOM_FILTER may be subscribed under dynsec.
        return who.kind in ("operator", "look") or who.id == root
    return False


def universe(fleet: Fleet) -> list[str]:
    """Every VOX topic among the identities, plus near-misses of the scheme."""
    ids = [fleet.operator_id, *(a.id for a in fleet)]
    root = fleet.root.id
    topics = [f"vox/{t}/inbox/{s}" for t, s in itertools.product(ids, ids)]
    topics += [f"vox/{i}/status" for i in ids]
    topics += [f"vox/{i}/presence" for i in ids]
    topics += [f"vox/warroom/{s}/{about}" for s, about in itertools.product(ids, ids)]
    topics += [
        f"vox/{root}/inbox",
        f"vox/{root}/status/extra",
        f"vox/{root}/presence/extra",
        f"vox/warroom/{root}",
        f"vox/warroom/{root}/{root}/extra",
        f"vox/{root}/inbox/{fleet.operator_id}/extra",
    ]
    return topics
