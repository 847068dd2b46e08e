"""`vox init` and `vox tree`: create and draw the fleet file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any
from uuid import UUID

from ..hierarchy import AgentSpec, Fleet, load_fleet, seed_fleet_toml
from ._common import EXIT_USAGE, fail, print_json

__all__ = ["draw_tree", "register", "tree_as_json"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the fleet verbs."""
    init = subparsers.add_parser("init", help="write the seed example fleet file with fresh UUIDs")
    init.add_argument("fleet", type=Path, help="path of the fleet file to create")
    init.set_defaults(func=cmd_init)

    tree = subparsers.add_parser("tree", help="draw the hierarchy of a fleet file")
    tree.add_argument("fleet", type=Path, help="path of the fleet file")
    tree.add_argument("--json", action="store_true", help="print the tree as JSON")
    tree.set_defaults(func=cmd_tree)


def cmd_init(args: argparse.Namespace) -> int:
    """Write the seed tree, refusing to overwrite an existing file."""
    path: Path = args.fleet
    try:
        # O_EXCL: never clobber an operator's fleet, even in a race.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        fail(f"{path} already exists; not overwriting it (remove it or pick another path)")
        return EXIT_USAGE
    except OSError as exc:
        fail(f"cannot create {path}: {exc.strerror}")
        return EXIT_USAGE
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(seed_fleet_toml())
    fleet = load_fleet(path)
    print(f"wrote {path}: the operator and {len(fleet)} agents, each with a fresh UUID")
    print(draw_tree(fleet))
    return 0


def draw_tree(fleet: Fleet) -> str:
    """Draw the fleet as seed 000 draws its example: names, ids and master_id under each."""
    lines: list[str] = []

    def draw(agent: AgentSpec, first: str, rest: str) -> None:
        where = "" if agent.broker is None else f" @ {agent.broker}"
        lines.append(f"{first}{agent.name} (id: {agent.id}){where}")
        body = rest + "  "
        master = '""' if agent.master_id is None else str(agent.master_id)
        lines.append(f"{body}master_id: {master}")
        children = fleet.children_of(agent.id)
        for index, child in enumerate(children):
            last = index == len(children) - 1
            draw(child, body + ("└── " if last else "├── "), body + ("    " if last else "│   "))

    draw(fleet.root, "", "")
    for spec in fleet.brokers:
        upstream = "root broker" if spec.upstream is None else f"bridged to {spec.upstream}"
        count = sum(1 for agent in fleet if agent.broker == spec.name)
        lines.append(
            f"broker {spec.name}: {spec.host}:{spec.port} (TLS {spec.tls_port}), {upstream}, "
            f"{count} agent(s)"
        )
    return "\n".join(lines)


def tree_as_json(fleet: Fleet) -> dict[str, Any]:
    """Return the fleet as nested JSON-ready data."""

    def node(agent_id: UUID) -> dict[str, Any]:
        agent = fleet.agent(agent_id)
        return {
            "name": agent.name,
            "id": str(agent.id),
            "master_id": "" if agent.master_id is None else str(agent.master_id),
            "roles": list(agent.roles),
            "broker": agent.broker,
            "children": [node(child.id) for child in fleet.children_of(agent_id)],
        }

    result: dict[str, Any] = {
        "operator": {"name": fleet.operator_name, "id": str(fleet.operator_id)},
        "root": node(fleet.root.id),
    }
    if fleet.brokers:
        result["brokers"] = [
            {
                "name": b.name,
                "host": b.host,
                "port": b.port,
                "tls_port": b.tls_port,
                "upstream": b.upstream,
            }
            for b in fleet.brokers
        ]
    return result


def cmd_tree(args: argparse.Namespace) -> int:
    """Print the tree of a fleet file."""
    fleet = load_fleet(args.fleet)
    if args.json:
        print_json(tree_as_json(fleet))
    else:
        print(draw_tree(fleet))
    return 0
