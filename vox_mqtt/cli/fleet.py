"""`vox init`, `vox uuid` and `vox tree`: create, grow, check and draw the fleet file."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from vox_mqtt.agent.rolecheck import check_roles
from vox_mqtt.protocol.errors import FleetError
from vox_mqtt.protocol.hierarchy import AgentSpec, Fleet, load_fleet, parse_fleet, seed_fleet_toml

from ._common import EXIT_USAGE, fail, print_json

__all__ = ["draw_tree", "register", "report_roles", "tree_as_json"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the fleet verbs."""
    init = subparsers.add_parser(
        "init",
        help="write the seed example fleet file with fresh UUIDs, or --add an agent to one",
    )
    init.add_argument("fleet", type=Path, help="path of the fleet file to create (or to grow)")
    init.add_argument("--add", metavar="NAME", help="add an agent NAME with a fresh UUID")
    init.add_argument("--master", metavar="NAME", help="its master's name or id (with --add)")
    init.add_argument(
        "--role", action="append", default=[], metavar="MODULE:CLASS", help="a role (repeatable)"
    )
    init.set_defaults(func=cmd_init)

    uuid = subparsers.add_parser("uuid", help="print fresh UUIDs for new agents (uuid4)")
    uuid.add_argument("count", type=int, nargs="?", default=1, help="how many (default 1)")
    uuid.set_defaults(func=cmd_uuid)

    tree = subparsers.add_parser(
        "tree", help="draw the hierarchy of a fleet file and check every role path it names"
    )
    tree.add_argument("fleet", type=Path, help="path of the fleet file")
    tree.add_argument("--json", action="store_true", help="print the tree as JSON")
    tree.set_defaults(func=cmd_tree)


def cmd_uuid(args: argparse.Namespace) -> int:
    """Print fresh random UUIDs, one a line."""
    if not 1 <= args.count <= 1000:
        fail(f"count must be 1 to 1000, not {args.count}")
        return EXIT_USAGE
    for _ in range(args.count):
        print(uuid4())
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    """Write the seed tree (refusing to overwrite a file), or add one agent to a fleet."""
    if args.add is not None:
        return add_agent(args.fleet, args.add, args.master, args.role)
    if args.master is not None or args.role:
        fail("--master and --role go with --add NAME")
        return EXIT_USAGE
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


def add_agent(path: Path, name: str, master: str | None, roles: list[str]) -> int:
    """Append one agent with a fresh UUID to a fleet file, keeping the rest of it as it is."""
    if master is None:
        fail("--add NAME needs --master NAME (the agent it reports to)")
        return EXIT_USAGE
    fleet = load_fleet(path)
    try:
        boss = fleet.agent(master)
    except KeyError:
        known = ", ".join(sorted(a.name for a in fleet))
        fail(f"--master {master!r}: no such agent in {path} (agents: {known})")
        return EXIT_USAGE
    new_id = uuid4()
    lines = ["", "[[agents]]", f'name = "{name}"', f'id = "{new_id}"', f'master_id = "{boss.id}"']
    if roles:
        lines.append("roles = [" + ", ".join(f'"{role}"' for role in roles) + "]")
    text = path.read_text(encoding="utf-8")
    grown = text.rstrip("\n") + "\n" + "\n".join(lines) + "\n"
    try:
        fleet = parse_fleet(grown, source=str(path))  # a bad name or a duplicate fails here
    except FleetError as exc:
        for problem in exc.problems:
            fail(problem)
        return EXIT_USAGE
    if report_roles(fleet, path, only=[fleet.agent(new_id)]):
        return EXIT_USAGE
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(grown, encoding="utf-8")
    os.chmod(tmp, path.stat().st_mode & 0o777)
    os.replace(tmp, path)
    print(f"added {name} (id: {new_id}) under {boss.name} to {path}")
    print("next: `vox broker render` and `vox agent render` for it and its master")
    return 0


def report_roles(fleet: Fleet, source: Path, only: Iterable[AgentSpec] | None = None) -> bool:
    """Check the role paths of the fleet (or of some agents); print problems; True if any is bad."""
    agents = list(fleet if only is None else only)
    results = check_roles(role for agent in agents for role in agent.roles)
    bad = False
    for agent in agents:
        for role in agent.roles:
            check = results[role]
            if check.verdict == "bad":
                bad = True
                fail(f"{source}:{agent.line}: agent {agent.name}: role {role!r}: {check.reason}")
    unchecked = [check for check in results.values() if check.verdict == "unchecked"]
    for check in unchecked:
        print(f"vox: warning: role {check.spec!r} not checked: {check.reason}", file=sys.stderr)
    return bad


def cmd_tree(args: argparse.Namespace) -> int:
    """Print the tree of a fleet file; exit 2 if a role path it names is wrong."""
    fleet = load_fleet(args.fleet)
    if args.json:
        print_json({**tree_as_json(fleet), "signatures": fleet.signatures})
    else:
        print(draw_tree(fleet))
        print(f"signatures: {fleet.signatures} (docs/security.md)")
    return EXIT_USAGE if report_roles(fleet, args.fleet) else 0
