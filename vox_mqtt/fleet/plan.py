"""The runbook of a fleet change: numbered steps, on which host, with the exact commands.

The order is the phases of fleetdiff.Phase, reasoned out in docs/operations.md: masters
that lose children forget them while the broker still lets them read those children;
retired agents are cleared while their credentials still work; the broker learns the new
tree; agents that start or restart come up; masters that gain children learn them last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vox_mqtt.fleet.diff import Action, AgentAction, FleetDiff, Phase

__all__ = ["Step", "plan_steps"]

_UNIT = "vox-agent@{}"
_PHASE_TITLES = {
    Phase.FORGET: "masters that only lose children forget them",
    Phase.RETIRE: "retired agents stop and leave nothing behind",
    Phase.BROKER: "the broker learns the new tree",
    Phase.START: "new, moved, renamed and reconfigured agents come up",
    Phase.LEARN: "masters that gain children learn them",
}


@dataclass(frozen=True, kw_only=True)
class Step:
    """One numbered step: where it runs, what it does, and its commands."""

    number: int
    phase: Phase
    host: str
    what: str
    commands: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """Return the step as JSON-ready data."""
        return {
            "step": self.number,
            "phase": int(self.phase),
            "host": self.host,
            "what": self.what,
            "commands": list(self.commands),
        }


def _host(name: str) -> str:
    return f"host of {name}"


def _render(fleet: str, broker_dir: str, bundles: str, names: list[str]) -> str:
    if len(names) == 1:
        name = names[0]
        return (
            f"sudo vox agent render {fleet} {name} --broker-dir {broker_dir} "
            f"--out {bundles}/{name}/{name}.toml"
        )
    return (
        f'for name in {" ".join(names)}; do sudo vox agent render {fleet} "$name" '
        f'--broker-dir {broker_dir} --out "{bundles}/$name/$name.toml"; done'
    )


def _install(bundles: str, name: str) -> str:
    return f"sudo make install AGENT_CONFIGS={bundles}/{name} INSTALL_VENV=no"


def _on_host(action: AgentAction, bundles: str) -> tuple[str, tuple[str, ...]]:
    """Return what the agent's own host does for an action, and the commands."""
    unit = _UNIT.format(action.name)
    copy = f"copy {bundles}/{action.name}/ from the broker host, then"
    if action.action == Action.RELOAD:
        return (
            f"{copy} reload it in place (no reconnect): {'; '.join(action.reasons)}",
            (_install(bundles, action.name), f"sudo systemctl reload {unit}"),
        )
    if action.action == Action.START:
        return (
            f"{copy} start it: {'; '.join(action.reasons)}",
            (_install(bundles, action.name), f"sudo systemctl enable --now {unit}"),
        )
    if action.old_name is not None:
        old = action.old_name
        return (
            f"{copy} run it under its new name: {'; '.join(action.reasons)}",
            (
                f"sudo systemctl disable --now {_UNIT.format(old)}",
                f"sudo mv /var/lib/vox/{old} /var/lib/vox/{action.name}",
                _install(bundles, action.name),
                f"sudo systemctl enable --now {unit}",
                f"sudo rm -r /etc/vox/{old}.toml /etc/vox/{old}.credentials.toml "
                f"/etc/vox/{old}.tls",
            ),
        )
    return (
        f"{copy} restart it: {'; '.join(action.reasons)}",
        (_install(bundles, action.name), f"sudo systemctl restart {unit}"),
    )


def plan_steps(
    diff: FleetDiff,
    *,
    fleet: str,
    broker_dir: str = "/etc/vox/broker",
    bundles: str = "bundles",
) -> list[Step]:
    """Return the numbered steps that apply a diff to a running fleet, in the safe order."""
    steps: list[Step] = []

    def add(phase: Phase, host: str, what: str, *commands: str) -> None:
        steps.append(
            Step(number=len(steps) + 1, phase=phase, host=host, what=what, commands=commands)
        )

    for phase in Phase:
        actions = [a for a in diff.actions if a.phase == phase]
        if phase == Phase.BROKER and (diff.broker.changed or diff.brokers):
            files = ", ".join(diff.broker.files) or "the bridges"
            # Each broker of a federated fleet is re-rendered on its own host, upstream first
            # (docs/federation.md); render.json keeps each one's options.
            for host in [f"broker host of {b}" for b in diff.brokers] or ["broker host"]:
                add(
                    phase,
                    host,
                    f"{_PHASE_TITLES[phase]}: re-render ({files}) and reload (the options of "
                    "the first render are kept in render.json)",
                    f"sudo vox broker render {fleet} --out {broker_dir}",
                    "sudo systemctl reload mosquitto",
                )
        if not actions:
            continue
        if phase == Phase.RETIRE:
            for action in actions:
                add(
                    phase,
                    _host(action.name),
                    f"stop {action.name!r} for good ({'; '.join(action.reasons)})",
                    f"sudo systemctl disable --now {_UNIT.format(action.name)}",
                )
                add(
                    phase,
                    "broker host",
                    f"clear what {action.name!r} left on the broker (its status, its war-room "
                    "posts and those about it) and tell its master; before the broker is "
                    "re-rendered, while its credentials still work",
                    f"sudo vox fleet retire {action.name} --fleet {fleet} "
                    f"--broker-dir {broker_dir}",
                )
            continue
        names = [a.name for a in actions]
        add(
            phase,
            "broker host",
            f"{_PHASE_TITLES[phase]}: render the bundle(s) of {', '.join(names)}",
            _render(fleet, broker_dir, bundles, names),
        )
        for action in actions:
            what, commands = _on_host(action, bundles)
            add(phase, _host(action.name), what, *commands)
    if diff.console:
        add(
            Phase.LEARN,
            "operator's machine",
            f"re-render the console config ({'; '.join(diff.console)})",
            f"vox agent render {fleet} operator --broker-dir {broker_dir} "
            "--out ~/.config/vox/operator.toml",
        )
    return steps
