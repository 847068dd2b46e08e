"""What a change of the fleet file means: per agent, for the broker, and in which order.

An agent is its id: the id is its MQTT username, its topics and its messages' source, so
agents of two fleet files are matched by id and a name is only a label (docs/operations.md).
A changed name with the same id is a rename; a name that keeps its place with a new id is a
new identity under an old name ("re-identified": the old identity retires, the new one
starts). A new secret for an unchanged id is not a fleet-file change at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any
from uuid import UUID

from vox_mqtt.broker.acl import Identity, fleet_identities
from vox_mqtt.protocol.hierarchy import AgentSpec, Fleet

__all__ = [
    "Action",
    "AgentAction",
    "BrokerChange",
    "Change",
    "ChangeKind",
    "FleetDiff",
    "Phase",
    "diff_fleets",
]

# Fields of an agent whose change only a restart applies (everything but the tree's links).
_TREE_FIELDS = frozenset({"name", "id", "master_id", "line"})


class ChangeKind(StrEnum):
    """What happened to one agent (or the operator) between two fleet files."""

    ADDED = "added"
    RETIRED = "retired"
    MOVED = "moved"
    RENAMED = "renamed"
    REIDENTIFIED = "reidentified"
    RECONFIGURED = "reconfigured"
    OPERATOR_RENAMED = "operator-renamed"
    BROKERS = "brokers"  # the fleet's [[brokers]] (sites) changed


class Action(StrEnum):
    """What an agent's host must do for the change."""

    RELOAD = "reload"  # new bundle, `systemctl reload`: children or names changed
    RESTART = "restart"  # new bundle, `systemctl restart`: identity, master or config changed
    START = "start"  # a new agent (or a new identity): bundle, `systemctl enable --now`
    RETIRE = "retire"  # stop it, then `vox fleet retire` clears what it left on the broker


class Phase(IntEnum):
    """The safe order of a change: each phase only after the one before it is done."""

    FORGET = 1  # masters that only lose children forget them while the broker still allows
    RETIRE = 2  # retired agents stop; their leftovers go while their credentials still work
    BROKER = 3  # the broker learns the new tree
    START = 4  # new, moved, renamed and reconfigured agents come up with their bundles
    LEARN = 5  # masters that gain children learn them, now that the broker allows it


@dataclass(frozen=True, kw_only=True)
class Change:
    """One change of one agent, in a line a person can read."""

    kind: ChangeKind
    name: str
    id: UUID
    text: str
    old_name: str | None = None
    old_id: UUID | None = None
    old_master: str | None = None
    new_master: str | None = None
    fields: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Return the change as JSON-ready data."""
        data: dict[str, Any] = {"kind": self.kind.value, "name": self.name, "id": str(self.id)}
        optional = {
            "old_name": self.old_name,
            "old_id": None if self.old_id is None else str(self.old_id),
            "old_master": self.old_master,
            "new_master": self.new_master,
        }
        data.update({key: value for key, value in optional.items() if value is not None})
        if self.fields:
            data["fields"] = list(self.fields)
        data["text"] = self.text
        return data


@dataclass(frozen=True, kw_only=True)
class AgentAction:
    """What one agent's host does, in which phase, and why."""

    name: str  # the unit instance after the change (the old one for RETIRE)
    id: UUID
    action: Action
    phase: Phase
    reasons: tuple[str, ...]
    old_name: str | None = None  # RESTART of a renamed agent: the unit that stops

    def as_dict(self) -> dict[str, Any]:
        """Return the action as JSON-ready data."""
        data: dict[str, Any] = {
            "name": self.name,
            "id": str(self.id),
            "action": self.action.value,
            "phase": int(self.phase),
            "reasons": list(self.reasons),
        }
        if self.old_name is not None:
            data["old_name"] = self.old_name
        return data


@dataclass(frozen=True, kw_only=True)
class BrokerChange:
    """Which broker identities and files a change touches (by identity name)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    rules_changed: tuple[str, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()  # (old, new) names of one identity

    @property
    def changed(self) -> bool:
        """Return whether the broker must be re-rendered and reloaded."""
        return bool(self.added or self.removed or self.rules_changed or self.renamed)

    @property
    def files(self) -> tuple[str, ...]:
        """Return the rendered files that change, relative to the broker directory.

        With the dynamic-security format, `acl` and `passwd` are both dynsec.json.
        """
        files: list[str] = []
        if self.added or self.removed or self.rules_changed:
            files.append("acl")
        if self.added or self.removed:
            files.append("passwd")
        # One store holds every identity's secret (docs/broker.md): it changes by entry.
        store = "credentials/secrets.json"
        files += [f"{store}: {name} (new)" for name in self.added]
        files += [f"{store}: {name} (deleted)" for name in self.removed]
        for old, new in self.renamed:
            files += [f"{store}: {old} (deleted)", f"{store}: {new} (new, the same secret)"]
        return tuple(files)

    def as_dict(self) -> dict[str, Any]:
        """Return the broker change as JSON-ready data."""
        return {
            "changed": self.changed,
            "identities_added": list(self.added),
            "identities_removed": list(self.removed),
            "rules_changed": list(self.rules_changed),
            "renamed": [{"old": old, "new": new} for old, new in self.renamed],
            "files": list(self.files),
        }


@dataclass(frozen=True, kw_only=True)
class FleetDiff:
    """What a change of the fleet file means; `refused` says why it cannot be applied live."""

    changes: tuple[Change, ...] = ()
    broker: BrokerChange = dataclasses.field(default_factory=BrokerChange)
    actions: tuple[AgentAction, ...] = ()
    console: tuple[str, ...] = ()  # why the operator's console config must be re-rendered
    # A federated fleet: every broker, upstream first; each is re-rendered on its own host.
    brokers: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """Return whether nothing changes."""
        return not (self.changes or self.broker.changed or self.actions or self.refused)

    def of_kind(self, kind: ChangeKind) -> list[Change]:
        """Return the changes of one kind."""
        return [change for change in self.changes if change.kind == kind]

    def action_of(self, name: str) -> list[AgentAction]:
        """Return the actions of the agent (unit) with this name."""
        return [action for action in self.actions if action.name == name]

    def as_dict(self) -> dict[str, Any]:
        """Return the whole diff as JSON-ready data."""
        return {
            "refused": list(self.refused),
            "changes": [change.as_dict() for change in self.changes],
            "broker": self.broker.as_dict(),
            "agents": [action.as_dict() for action in self.actions],
            "console": list(self.console),
            "brokers": list(self.brokers),
        }


def diff_fleets(old: Fleet, new: Fleet) -> FleetDiff:
    """Compare two valid fleets; refuse changes that cannot be applied to a running fleet."""
    refused = _refusals(old, new)
    if refused:
        return FleetDiff(refused=tuple(refused))
    changes: list[Change] = []
    reidentified = _reidentified(old, new)
    new_ids = {agent.id for agent in new}
    old_ids = {agent.id for agent in old}
    for agent in new:
        if agent.id in old_ids:
            changes += _changes_of(old, new, old.agent(agent.id), agent)
        elif agent.name in reidentified:
            before = old.agent(agent.name)
            changes.append(
                Change(
                    kind=ChangeKind.REIDENTIFIED,
                    name=agent.name,
                    id=agent.id,
                    old_id=before.id,
                    text=f"{agent.name!r} gets a new identity: id {before.id} -> {agent.id}",
                )
            )
        else:
            master = _master_name(new, agent)
            changes.append(
                Change(
                    kind=ChangeKind.ADDED,
                    name=agent.name,
                    id=agent.id,
                    new_master=master,
                    text=f"{agent.name!r} ({agent.id}) is added under {master!r}",
                )
            )
    for agent in old:
        if agent.id not in new_ids and agent.name not in reidentified:
            master = _master_name(old, agent)
            changes.append(
                Change(
                    kind=ChangeKind.RETIRED,
                    name=agent.name,
                    id=agent.id,
                    old_master=master,
                    text=f"{agent.name!r} ({agent.id}) is retired from under {master!r}",
                )
            )
    console: list[str] = []
    if old.operator_name != new.operator_name:
        renamed = f"the operator is renamed {old.operator_name!r} -> {new.operator_name!r}"
        changes.append(
            Change(
                kind=ChangeKind.OPERATOR_RENAMED,
                name=new.operator_name,
                id=new.operator_id,
                old_name=old.operator_name,
                text=renamed,
            )
        )
        console.append(renamed)
    if old.root.name != new.root.name:
        console.append(f"the root is renamed {old.root.name!r} -> {new.root.name!r}")
    sites = _sites_change(old, new)
    if sites is not None:
        changes.append(sites)
    return FleetDiff(
        changes=tuple(changes),
        broker=_broker_change(old, new),
        actions=tuple(_actions(old, new, reidentified)),
        console=tuple(console),
        brokers=_brokers_upstream_first(new) if old.brokers or new.brokers else (),
    )


def _sites_change(old: Fleet, new: Fleet) -> Change | None:
    """Return the change of the fleet's [[brokers]], or None if they are the same."""
    was = {broker.name: broker for broker in old.brokers}
    now = {broker.name: broker for broker in new.brokers}
    parts = [f"+{name}" for name in now if name not in was]
    parts += [f"-{name}" for name in was if name not in now]
    parts += [
        f"~{name}"
        for name in now
        if name in was
        and dataclasses.replace(was[name], line=0) != dataclasses.replace(now[name], line=0)
    ]
    if not parts:
        return None
    return Change(
        kind=ChangeKind.BROKERS,
        name="brokers",
        id=new.operator_id,
        text=f"the fleet's brokers change: {' '.join(parts)} (docs/federation.md)",
    )


def _brokers_upstream_first(fleet: Fleet) -> tuple[str, ...]:
    by_name = {broker.name: broker for broker in fleet.brokers}

    def depth(name: str) -> int:
        hops, current = 0, by_name[name]
        while current.upstream is not None and current.upstream in by_name and hops < 64:
            hops, current = hops + 1, by_name[current.upstream]
        return hops

    return tuple(sorted(by_name, key=lambda name: (depth(name), name)))


# --- refusals ------------------------------------------------------------------------------


def _refusals(old: Fleet, new: Fleet) -> list[str]:
    problems: list[str] = []
    if old.operator_id != new.operator_id:
        problems.append(
            f"the operator's id changes ({old.operator_id} -> {new.operator_id}): every "
            "console and the root's master would change; render a new fleet instead"
        )
    if old.root.id != new.root.id:
        problems.append(
            f"the root changes ({old.root.name!r} {old.root.id} -> {new.root.name!r} "
            f"{new.root.id}): a fleet keeps its root; render a new fleet instead"
        )
    for agent in new:
        try:
            before = old.agent(agent.id)
        except KeyError:
            continue
        if before.name == agent.name:
            continue
        try:
            now_named = new.agent(before.name)
        except KeyError:
            continue
        if now_named.id != before.id:
            problems.append(
                f"id {agent.id} was {before.name!r} and is now {agent.name!r}, while "
                f"{before.name!r} is now id {now_named.id}: names and ids are swapped; "
                "rename first, then add (one change of the fleet file at a time)"
            )
    return problems


def _reidentified(old: Fleet, new: Fleet) -> set[str]:
    """Return the names kept with a new id that no other agent had before or has now."""
    names: set[str] = set()
    new_ids = {agent.id for agent in new}
    old_ids = {agent.id for agent in old}
    for agent in new:
        try:
            before = old.agent(agent.name)
        except KeyError:
            continue
        if before.id != agent.id and before.id not in new_ids and agent.id not in old_ids:
            names.add(agent.name)
    return names


# --- per agent -----------------------------------------------------------------------------


def _master_name(fleet: Fleet, agent: AgentSpec) -> str:
    return fleet.view_of(agent.id).master_name


def _config_fields(spec: AgentSpec) -> dict[str, Any]:
    """Return what of an agent only a restart applies: roles, settings, interval, ..."""
    return {
        field.name: getattr(spec, field.name)
        for field in dataclasses.fields(spec)
        if field.name not in _TREE_FIELDS
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _changed_fields(before: AgentSpec, after: AgentSpec) -> tuple[str, ...]:
    """Return the names of the restart-only fields that differ between two specs."""
    a, b = _config_fields(before), _config_fields(after)
    return tuple(key for key in a if _plain(a[key]) != _plain(b.get(key)))


def _changes_of(old: Fleet, new: Fleet, before: AgentSpec, after: AgentSpec) -> list[Change]:
    changes: list[Change] = []
    if before.name != after.name:
        changes.append(
            Change(
                kind=ChangeKind.RENAMED,
                name=after.name,
                id=after.id,
                old_name=before.name,
                text=f"{before.name!r} is renamed {after.name!r} (id {after.id} stays)",
            )
        )
    if before.master_id != after.master_id:
        was, now = _master_name(old, before), _master_name(new, after)
        changes.append(
            Change(
                kind=ChangeKind.MOVED,
                name=after.name,
                id=after.id,
                old_master=was,
                new_master=now,
                text=f"{after.name!r} moves from under {was!r} to under {now!r}",
            )
        )
    fields = _changed_fields(before, after)
    if fields:
        a, b = _config_fields(before), _config_fields(after)
        shown = "; ".join(f"{key} {_plain(a[key])!r} -> {_plain(b[key])!r}" for key in fields)
        changes.append(
            Change(
                kind=ChangeKind.RECONFIGURED,
                name=after.name,
                id=after.id,
                fields=fields,
                text=f"{after.name!r}: {shown}",
            )
        )
    return changes


def _children(fleet: Fleet, agent_id: UUID) -> dict[UUID, str]:
    return {child.id: child.name for child in fleet.children_of(agent_id)}


def _actions(old: Fleet, new: Fleet, reidentified: set[str]) -> list[AgentAction]:
    actions: list[AgentAction] = []
    old_ids = {agent.id for agent in old}
    new_ids = {agent.id for agent in new}
    for agent in old:
        if agent.id not in new_ids:
            why = (
                f"its old identity {agent.id} leaves the fleet"
                if agent.name in reidentified
                else "it leaves the fleet"
            )
            actions.append(
                AgentAction(
                    name=agent.name,
                    id=agent.id,
                    action=Action.RETIRE,
                    phase=Phase.RETIRE,
                    reasons=(why,),
                )
            )
    for agent in new:
        if agent.id not in old_ids:
            why = (
                f"its new identity {agent.id} (stopped in phase {int(Phase.RETIRE)})"
                if agent.name in reidentified
                else f"a new agent under {_master_name(new, agent)!r}"
            )
            actions.append(
                AgentAction(
                    name=agent.name,
                    id=agent.id,
                    action=Action.START,
                    phase=Phase.START,
                    reasons=(why,),
                )
            )
            continue
        action = _action_of(old, new, old.agent(agent.id), agent)
        if action is not None:
            actions.append(action)
    actions.sort(key=lambda item: (item.phase, item.name))
    return actions


def _action_of(old: Fleet, new: Fleet, before: AgentSpec, after: AgentSpec) -> AgentAction | None:
    restart: list[str] = []
    if before.name != after.name:
        restart.append(f"renamed from {before.name!r}")
    if before.master_id != after.master_id:
        restart.append(f"its master is now {_master_name(new, after)!r}")
    restart += [f"{key} changed" for key in _changed_fields(before, after)]
    was, now = _children(old, before.id), _children(new, after.id)
    gained = [now[child] for child in now if child not in was]
    lost = [was[child] for child in was if child not in now]
    renamed = [f"{was[c]!r} -> {now[c]!r}" for c in now if c in was and was[c] != now[c]]
    reload: list[str] = []
    reload += [f"new child {name!r}" for name in gained]
    reload += [f"child {name!r} leaves" for name in lost]
    reload += [f"child renamed {text}" for text in renamed]
    old_master, new_master = _master_name(old, before), _master_name(new, after)
    if before.master_id == after.master_id and old_master != new_master:
        reload.append(f"its master is renamed {old_master!r} -> {new_master!r}")
    if restart:
        return AgentAction(
            name=after.name,
            id=after.id,
            action=Action.RESTART,
            phase=Phase.START,
            reasons=tuple(restart + reload),
            old_name=before.name if before.name != after.name else None,
        )
    if not reload:
        return None
    # A master that gains a child subscribes to its status: only once the broker allows it.
    phase = Phase.LEARN if gained or not lost else Phase.FORGET
    return AgentAction(
        name=after.name, id=after.id, action=Action.RELOAD, phase=phase, reasons=tuple(reload)
    )


# --- the broker ----------------------------------------------------------------------------


def _rules(identity: Identity) -> frozenset[tuple[str, bool, bool]]:
    return frozenset((rule.topic, rule.read, rule.write) for rule in identity.rules)


def _broker_change(old: Fleet, new: Fleet) -> BrokerChange:
    before = {identity.id: identity for identity in fleet_identities(old)}
    after = {identity.id: identity for identity in fleet_identities(new)}
    added = sorted(after[key].name for key in after if key not in before)
    removed = sorted(before[key].name for key in before if key not in after)
    common = [key for key in after if key in before]
    rules = sorted(after[k].name for k in common if _rules(after[k]) != _rules(before[k]))
    renamed = sorted(
        (before[k].name, after[k].name) for k in common if before[k].name != after[k].name
    )
    return BrokerChange(
        added=tuple(added),
        removed=tuple(removed),
        rules_changed=tuple(rules),
        renamed=tuple(renamed),
    )
