"""`vox init` and `vox tree`: create and draw the fleet file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any
from uuid import UUID

from rich.tree import Tree

from ..hierarchy import Fleet, load_fleet, seed_fleet_toml
from ._common import EXIT_USAGE, fail, out_console, print_json


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the fleet verbs."""
    init = subparsers.add_parser("init", help="write the seed example fleet file with fresh UUIDs")
    init.add_argument("fleet", type=Path, help="path of the fleet file to create")
    init.set_defaults(func=cmd_init)

    tree = subparsers.add_parser("tree", help="draw the hierarchy of a fleet file")
    tree.add_argument("fleet", type=Path)
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
    out_console().print(f"wrote {path}: operator and {len(fleet)} agents")
    out_console().print(render_tree(fleet))
    return 0


def render_tree(fleet: Fleet) -> Tree:
    """Draw the fleet like seed 000's picture: names, ids and masters."""

    def label(agent_id: UUID) -> str:
        agent = fleet.agent(agent_id)
        master = "" if agent.master_id is None else str(agent.master_id)
        return f"[bold]{agent.name}[/] (id: {agent.id})\n[dim]master_id: {master!r}[/]"

    root = fleet.root
    tree = Tree(label(root.id))

    def grow(branch: Tree, agent_id: UUID) -> None:
        for child in fleet.children_of(agent_id):
            grow(branch.add(label(child.id)), child.id)

    grow(tree, root.id)
    return tree


def tree_as_json(fleet: Fleet) -> dict[str, Any]:
    """Return the fleet as nested JSON-ready data."""

    def node(agent_id: UUID) -> dict[str, Any]:
        agent = fleet.agent(agent_id)
        return {
            "name": agent.name,
            "id": str(agent.id),
            "master_id": "" if agent.master_id is None else str(agent.master_id),
            "roles": list(agent.roles),
            "children": [node(child.id) for child in fleet.children_of(agent_id)],
        }

    return {
        "operator": {"name": fleet.operator_name, "id": str(fleet.operator_id)},
        "root": node(fleet.root.id),
    }


def cmd_tree(args: argparse.Namespace) -> int:
    """Print the tree of a fleet file."""
    fleet = load_fleet(args.fleet)
    if args.json:
        print_json(tree_as_json(fleet))
    else:
        out_console().print(render_tree(fleet))
    return 0
