"""The agent's pure decisions: which inbound message it accepts, which child serves a command."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Final
from uuid import UUID

from vox_mqtt.observe.status import RETIRED, AgentLiveness
from vox_mqtt.protocol.commandspec import PARAMS_BUDGET, within_budget
from vox_mqtt.protocol.lifecycle import MSG_CANCEL_REQUEST, MSG_COMMAND_PROGRESS, MSG_STATUS_QUERY
from vox_mqtt.protocol.messages import (
    MSG_ACKNOWLEDGED,
    MSG_COMMAND_REQUEST,
    ErrorCode,
    MessageAcknowledged,
    VOXMessage,
)
from vox_mqtt.protocol.topics import InboxTopic

__all__ = [
    "MIN_CHILD_SHARE",
    "WRONG_ANSWERER",
    "advertised_params",
    "advertisement",
    "answered_request",
    "answerer_problem",
    "child_share",
    "choose_child",
    "down_commands",
    "down_levels",
    "inactive_reason",
    "verify",
]

# However many children a master has, each may advertise at least this many commands.
MIN_CHILD_SHARE: Final = 16
# What only an agent's master may send it, besides commands.
_FROM_MASTER: Final = frozenset({MSG_CANCEL_REQUEST, MSG_STATUS_QUERY})
# The reason an answer from an agent its request was not sent to is refused (a metric label
# of `rejected`, and the outcome of its ledger row): docs/security.md, F24.
WRONG_ANSWERER: Final = "WRONG_ANSWERER"


def verify(
    message: VOXMessage,
    topic: InboxTopic,
    *,
    me: UUID,
    master_id: UUID | None,
    peers: frozenset[UUID],
) -> str | None:
    """Return why a message may not be accepted, or None (docs/topics.md)."""
    if topic.target != me:
        return f"arrived on another agent's inbox ({topic.target})"
    if message.source != topic.source:
        return f"source {message.source} does not match the sender {topic.source}"
    if message.target != me:
        return f"target {message.target} is not this agent"
    if message.source not in peers:
        return f"{message.source} is neither this agent's master nor a child"
    if message.type == MSG_COMMAND_REQUEST and message.source != master_id:
        # Commands only flow down the tree; a child may report, never command.
        return "command_request from a child: commands come only from the master"
    if message.type in _FROM_MASTER and message.source != master_id:
        # Only the master that sent a request may ask about it or stop it (docs/messages.md).
        return f"{message.type} from a child: only this agent's master may send it"
    if message.type == MSG_COMMAND_PROGRESS and message.source == master_id:
        return "command_progress from the master: progress comes only from a child"
    return None


def answered_request(message: VOXMessage) -> UUID | None:
    """Return the sent message this one answers, acknowledges or reports on, if any.

    An acknowledgement names it in `in_response_to`; an answer, a progress report, a cancel
    or status report and a reply to an event in `reply_to`. A command_request's `reply_to`
    is its provenance (the request it was delegated from), never an answer.
    """
    if message.type == MSG_ACKNOWLEDGED:
        return message.payload_as(MessageAcknowledged).in_response_to
    if message.type == MSG_COMMAND_REQUEST:
        return None
    return message.reply_to


def answerer_problem(message: VOXMessage, sent_to: UUID | None) -> str | None:
    """Return why a message may not settle the request it names, or None (docs/security.md, F24).

    `sent_to` is the agent the named request went to, None when it is not one this agent
    sent (then there is nothing it could settle). Only that agent may acknowledge it, answer
    it or report on it: a sibling that learned its id (a compromised leaf) may not.
    """
    if sent_to is None or message.source == sent_to:
        return None
    named = answered_request(message)
    return (
        f"{message.type} for {named} from {message.source}, which it was not sent to"
        f" (it went to {sent_to})"
    )


def choose_child(
    command: str,
    children: Iterable[AgentLiveness | None],
    *,
    load: Mapping[UUID, int],
    tiebreak: Callable[[], float] = random.random,
) -> tuple[UUID | None, ErrorCode | None]:
    """Pick a child for a command: healthy first, then least busy; else an error code.

    No healthy child lists it: TARGET_INACTIVE when the agents that serve it are down
    (`down_levels`: REQ-001-US-002-008, routing to offline agents), NO_ROUTE when
    nothing below serves it at all (docs/liveness.md, routing uses liveness).
    """
    listed = [c for c in children if c is not None]
    healthy = [c for c in listed if c.healthy and command in c.commands]
    if healthy:
        best = min(healthy, key=lambda c: (load.get(c.id, 0), tiebreak()))
        return best.id, None
    return None, ErrorCode.TARGET_INACTIVE if down_levels(command, listed) else ErrorCode.NO_ROUTE


def down_levels(
    command: str, children: Iterable[AgentLiveness | None]
) -> list[AgentLiveness | None]:
    """Return where the agents that serve a command are down, as a master sees its children.

    A child that is not healthy and listed the command (now, or in its last ACTIVE status:
    an INACTIVE child lists none) holds it itself: its level is this master's children,
    given as None. A healthy child that lists the command among its `commands_down` (what
    an agent below it served while ACTIVE and nobody ACTIVE below serves now) names its
    own level. A retired child is gone, not down. Empty: nothing below serves it.
    """
    levels: list[AgentLiveness | None] = []
    for child in children:
        if child is None or child.error_code == RETIRED:
            continue
        if not child.healthy and command in (*child.commands, *(child.advertised or ())):
            if None not in levels:
                levels.append(None)
        elif command in child.commands_down:
            levels.append(child)
    return levels


def inactive_reason(command: str, me: str, levels: Sequence[AgentLiveness | None]) -> str:
    """Say in one line that a command's agents are down, and at which level (TARGET_INACTIVE).

    Names this agent's children's level or the children below which they are down, never
    the agents that hold the command: those are the level below's to name.
    """
    where = [f"among {me}'s children" if lv is None else f"below {lv.name}" for lv in levels]
    return (
        f"every agent that serves {command!r} {' and '.join(where) or f'below {me}'} is down "
        "(INACTIVE or STALE)"
    )


def down_commands(
    children: Iterable[AgentLiveness | None], serving: Collection[str], limit: int
) -> list[str]:
    """Return what a master reports as `commands_down`: served below, by nobody ACTIVE now.

    The commands its children that are down listed in their last ACTIVE status and those
    its healthy children report down, less what it advertises (`serving`), sorted, at
    most `limit` (docs/liveness.md).
    """
    down: set[str] = set()
    for child in children:
        if child is None or child.error_code == RETIRED:
            continue
        down.update(child.commands_down)
        if not child.healthy:
            down.update(child.advertised or ())
    return sorted(down - set(serving))[:limit]


def child_share(own: int, children: int, limit: int) -> int:
    """Return how many commands one child may advertise to its master (docs/liveness.md).

    The room a master's advertisement has after its own commands, split evenly between
    its children (at least MIN_CHILD_SHARE each): within their shares all of them fit.
    """
    room = max(0, limit - own)
    return max(MIN_CHILD_SHARE, room // max(1, children))


def advertisement(
    own: Collection[str], children: Mapping[UUID, Sequence[str]], limit: int
) -> tuple[list[str], int]:
    """Return what a master advertises, sorted, and how many child commands did not fit.

    Its own commands first; then its children's, taken in turns (each child's next
    command in each round, children in id order) so that when they cannot all fit, each
    keeps an equal part: no child's list can push out a sibling's commands.
    """
    chosen = set(sorted(own)[:limit])
    if not children:  # a leaf's own commands (asked at every liveness tick)
        return sorted(chosen), 0
    queues = [sorted(set(commands) - chosen) for _, commands in sorted(children.items())]
    offered = set().union(*queues) if queues else set()
    depth = 0
    while len(chosen) < limit and any(depth < len(q) for q in queues):
        for queue in queues:
            if depth < len(queue) and len(chosen) < limit:
                chosen.add(queue[depth])
        depth += 1
    return sorted(chosen), len(offered - chosen)


def advertised_params(
    chosen: Collection[str],
    own: Mapping[str, Mapping[str, Any]],
    children: Mapping[UUID, Mapping[str, Mapping[str, Any]]],
    budget: int = PARAMS_BUDGET,
) -> tuple[dict[str, dict[str, Any]], int]:
    """Return the `params` entries a status carries for its advertised commands, and the cut.

    Its own commands' entries first; then its children's, taken in turns as the commands
    are (`advertisement`), so that no child's large schemas crowd out a sibling's. Only
    entries: never which child serves a command (docs/liveness.md, "Parameter schemas").
    """
    listed = set(chosen)
    order = [(c, own[c]) for c in sorted(own) if c in listed]
    queues = [
        [(c, e) for c, e in sorted(entries.items()) if c in listed and c not in own]
        for _, entries in sorted(children.items())
    ]
    for depth in range(max((len(q) for q in queues), default=0)):
        order.extend(q[depth] for q in queues if depth < len(q))
    return within_budget(order, budget)
