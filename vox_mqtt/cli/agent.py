"""`vox agent render`: write one agent's daemon config, or the operator's console config."""

from __future__ import annotations

import argparse
from pathlib import Path

from vox_mqtt.broker.acl import EXPLORER_NAME, EXPLORER_PREFIX
from vox_mqtt.broker.credstore import CredentialStore
from vox_mqtt.broker.federation import write_link_map
from vox_mqtt.fleet.bundles import DEFAULT_STATE_ROOT, render_agent_config
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.hierarchy import Fleet, load_fleet

from ._common import EXIT_USAGE, fail
from ._ids import normalize_prefix, pick_by_prefix
from .fleet import report_roles


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the agent verbs."""
    agent = subparsers.add_parser("agent", help="per-agent deployment files")
    verbs = agent.add_subparsers(dest="agent_verb", metavar="VERB", required=True)
    render = verbs.add_parser(
        "render",
        help="write one agent's daemon config (or `operator`, `explorer`, `explorer-NAME`)",
        description=(
            "Write the config of one agent: itself, its master and its children, nothing "
            "else of the tree. Its broker credentials (and TLS files) are copied next to "
            "it, so the folder can be copied to /etc/vox on the agent's host as it is."
        ),
    )
    render.add_argument("fleet", type=Path, help="the fleet file")
    render.add_argument(
        "name",
        help="the agent's name or id (or the id's first digits), or `operator`, `explorer`, "
        "`explorer-NAME`",
    )
    render.add_argument(
        "--broker-dir", required=True, type=Path, help="the folder `vox broker render` wrote"
    )
    render.add_argument("--out", required=True, type=Path, help="the config file to write")
    render.add_argument(
        "--state-dir",
        type=Path,
        help=f"the ledger's folder (default {DEFAULT_STATE_ROOT}/NAME; the operator's: "
        "NAME-state next to the config)",
    )
    render.add_argument("--keepalive", type=int, default=30, help="MQTT keepalive, seconds")
    render.add_argument(
        "--shutdown-grace", type=float, default=10.0, help="seconds in-flight commands get"
    )
    render.set_defaults(func=cmd_render)


def _check_broker_dir(fleet: Fleet, name: str, broker_dir: Path) -> None:
    """In a fleet of several brokers, say which broker's directory an identity needs."""
    if not fleet.brokers:
        return
    try:
        agent = fleet.agent(name)
        identity, broker = agent.name, agent.broker
    except KeyError:
        identity, broker = fleet.operator_name, fleet.root_broker
    if not CredentialStore(broker_dir).has(identity):
        raise ConfigError(
            [
                f"--broker-dir {broker_dir}: {identity!r} connects to broker {broker!r}: pass "
                f"the directory `vox broker render --broker {broker}` wrote"
            ]
        )


def cmd_render(args: argparse.Namespace) -> int:
    """Check the agent's roles, render its config and say what was written."""
    fleet = load_fleet(args.fleet)
    try:
        name = resolve_agent(fleet, args.name)
    except ValueError as exc:
        fail(str(exc))
        return EXIT_USAGE
    # Roles only for an agent: not for the operator, nor an explorer (`explorer-NAME`).
    agents = {agent.name for agent in fleet}
    if (
        name != "operator"
        and name in agents
        and report_roles(fleet, args.fleet, only=[fleet.agent(name)])
    ):
        fail(f"not written: fix the role paths of {name} in {args.fleet}")
        return EXIT_USAGE
    _check_broker_dir(fleet, name, args.broker_dir)
    rendered = render_agent_config(
        fleet,
        name,
        args.broker_dir,
        args.out,
        args.state_dir,
        keepalive=args.keepalive,
        shutdown_grace=args.shutdown_grace,
    )
    print(f"wrote {rendered.config} ({rendered.kind} {rendered.name})")
    links = write_link_map(fleet, rendered.name, rendered.config)
    if links is not None:
        print(f"wrote {links} (the bridge links it watches)")
    for path in rendered.secrets:
        print(f"wrote {path} (secret, mode 0600)")
    return 0


def resolve_agent(fleet: Fleet, key: str) -> str:
    """Return the agent a name, id or unique id prefix designates (or `operator`, `explorer`).

    An exact id wins over everything; a name that is also the start of another identity's
    id is refused with both readings, never guessed (the fleet file refuses such names).
    """
    ids = {str(a.id): a.name for a in fleet} | {str(fleet.operator_id): "operator"}
    try:
        prefix: str | None = normalize_prefix(key, "agent id")
    except ValueError:
        prefix = None
    if prefix is not None and prefix in ids:
        return ids[prefix]
    named = {a.name for a in fleet} | {fleet.operator_name, "operator"}
    if key in named and prefix is not None:
        others = sorted(
            name for agent_id, name in ids.items() if agent_id.startswith(prefix) and name != key
        )
        if others:
            raise ValueError(
                f"{key!r} is both an agent's name and the start of the id of {others[0]}: "
                "give the whole id, or rename the agent in the fleet file"
            )
    if key in ("operator", fleet.operator_name):
        return "operator"
    explorer = key == EXPLORER_NAME or key.startswith(EXPLORER_PREFIX)
    if explorer and key not in {a.name for a in fleet}:
        return key  # the unnamed explorer or a named one (`vox broker render --explorer NAME`)
    if key in named:
        return fleet.agent(key).name
    if prefix is None:
        known = ", ".join(sorted(a.name for a in fleet))
        raise ValueError(
            f"no agent {key!r} in the fleet (agents: {known}; or `operator`, `explorer`)"
        )
    return ids[pick_by_prefix(prefix, ids, "agent id", "the fleet")]
