"""What a changed config file means to a running agent: a live change of children, or a restart.

Only the tree below the agent may change live (docs/operations.md): its children and the
names of its master and children; and its broker secret (a re-key), which the session
uses from its next connection on. Its own identity, its master, its broker's address and
everything its parts were built from (roles, settings, intervals) take a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from vox_mqtt.fleet.config import DaemonFile

__all__ = ["ReloadPlan", "plan_reload"]

# Keys a reload applies without reconnecting.
_LIVE_KEYS = frozenset({"agent.children", "agent.master_name", "broker.password"})


@dataclass(frozen=True, kw_only=True)
class ReloadPlan:
    """The difference between the running config and the one on disk."""

    restart_keys: tuple[str, ...] = ()  # dotted keys only a restart applies
    added: Mapping[UUID, str] = field(default_factory=dict)
    removed: Mapping[UUID, str] = field(default_factory=dict)
    renamed: Mapping[UUID, tuple[str, str]] = field(default_factory=dict)
    master_name: tuple[str, str] | None = None  # (old, new)
    secret_changed: bool = False  # the broker secret: used from the next connection on

    @property
    def live(self) -> bool:
        """Return whether there is something to apply live (and nothing that needs a restart)."""
        return not self.restart_keys and bool(
            self.added or self.removed or self.renamed or self.master_name or self.secret_changed
        )

    @property
    def unchanged(self) -> bool:
        """Return whether the file says what the agent runs."""
        return not self.restart_keys and not self.live

    def summary(self) -> str:
        """Return the live change in one line: `children +a -b, b->c; master 'x'`."""
        parts = [f"+{name}" for name in sorted(self.added.values())]
        parts += [f"-{name}" for name in sorted(self.removed.values())]
        parts += [f"{old}->{new}" for old, new in sorted(self.renamed.values())]
        text = f"children {' '.join(parts)}" if parts else ""
        if self.master_name is not None:
            text += ("; " if text else "") + f"master renamed {self.master_name[1]!r}"
        if self.secret_changed:
            text += ("; " if text else "") + "a new broker secret, used from the next connection on"
        return text


def _dump(file: DaemonFile) -> dict[str, dict[str, Any]]:
    data = file.model_dump()
    return {"agent": data["agent"], "broker": data["broker"]}


def plan_reload(
    old: DaemonFile,
    new: DaemonFile,
    *,
    old_secret: str | None = None,
    new_secret: str | None = None,
) -> ReloadPlan:
    """Compare the running config with the file on disk (and the secrets they name)."""
    a, b = _dump(old), _dump(new)
    restart = [
        f"{section}.{key}"
        for section in ("agent", "broker")
        for key in sorted(set(a[section]) | set(b[section]))
        if a[section].get(key) != b[section].get(key) and f"{section}.{key}" not in _LIVE_KEYS
    ]
    was, now = dict(old.agent.children), dict(new.agent.children)
    master_name = (
        (old.agent.master_name, new.agent.master_name)
        if old.agent.master_name != new.agent.master_name
        else None
    )
    return ReloadPlan(
        restart_keys=tuple(restart),
        added={child: name for child, name in now.items() if child not in was},
        removed={child: name for child, name in was.items() if child not in now},
        renamed={
            child: (was[child], name)
            for child, name in now.items()
            if child in was and was[child] != name
        },
        master_name=master_name,
        secret_changed=old_secret != new_secret,
    )
