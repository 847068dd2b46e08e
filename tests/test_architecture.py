"""The package's structure as docs/architecture.md draws it, checked from the source with ast.

Layers, bottom to top: contracts, services, the agent core, apps. A module imports only
modules of its own layer or below (TYPE_CHECKING imports included), the import graph has
no cycle, no class is a mixin, and no module grows past 600 lines. In tests/, a test
module imports no other test module: what several share lives in a kit module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "vox_mqtt"
TESTS = Path(__file__).resolve().parent

CONTRACTS, SERVICES, CORE, APPS = 0, 1, 2, 3
LAYER_NAMES = {CONTRACTS: "contracts", SERVICES: "services", CORE: "agent core", APPS: "apps"}
# Keep in step with the layer table of docs/architecture.md.
LAYERS: dict[str, int] = {
    "vox_mqtt._version": CONTRACTS,
    "vox_mqtt.errors": CONTRACTS,
    "vox_mqtt.messages": CONTRACTS,
    "vox_mqtt._jsonvalue": CONTRACTS,
    "vox_mqtt.topics": CONTRACTS,
    "vox_mqtt.hierarchy": CONTRACTS,
    "vox_mqtt.settings": CONTRACTS,
    "vox_mqtt.sites": CONTRACTS,
    "vox_mqtt.sitelinks": CONTRACTS,
    "vox_mqtt._mqttclient": SERVICES,
    "vox_mqtt._mqttdecode": SERVICES,
    "vox_mqtt.transport": SERVICES,
    "vox_mqtt._ledgerschema": SERVICES,
    "vox_mqtt._ledgerwriter": SERVICES,
    "vox_mqtt._ledgerindex": SERVICES,
    "vox_mqtt._ledgerrows": SERVICES,
    "vox_mqtt._ledgerqueries": SERVICES,
    "vox_mqtt.ledger": SERVICES,
    "vox_mqtt.memory": SERVICES,  # the ledger under the seed's module name
    "vox_mqtt.witness": SERVICES,
    "vox_mqtt.tracking": SERVICES,
    "vox_mqtt.status": SERVICES,
    "vox_mqtt.warroom": SERVICES,
    "vox_mqtt.observer": SERVICES,
    "vox_mqtt.roles": SERVICES,
    "vox_mqtt.router": SERVICES,
    "vox_mqtt.rules": SERVICES,
    "vox_mqtt.config": SERVICES,
    "vox_mqtt.agentconf": SERVICES,
    "vox_mqtt.passwd": SERVICES,
    "vox_mqtt.credstore": SERVICES,
    "vox_mqtt.acl": SERVICES,
    "vox_mqtt.pki": SERVICES,
    "vox_mqtt.brokerconf": SERVICES,
    "vox_mqtt.federation": SERVICES,
    "vox_mqtt.brokertext": SERVICES,
    "vox_mqtt.brokermanifest": SERVICES,
    "vox_mqtt.brokerprobe": SERVICES,
    "vox_mqtt.lastgood": SERVICES,
    "vox_mqtt.brokerreload": SERVICES,
    "vox_mqtt.dynsecapply": SERVICES,
    "vox_mqtt.warroomguard": SERVICES,
    "vox_mqtt.privatefs": SERVICES,
    "vox_mqtt.localbroker": SERVICES,
    "vox_mqtt.fleetdiff": SERVICES,
    "vox_mqtt.fleetplan": SERVICES,
    "vox_mqtt.retirement": SERVICES,
    "vox_mqtt.logonce": SERVICES,
    "vox_mqtt.metrics": SERVICES,
    "vox_mqtt.explorerconf": SERVICES,
    "vox_mqtt.publishprops": SERVICES,
    "vox_mqtt.peernames": SERVICES,
    "vox_mqtt.rolecheck": SERVICES,
    "vox_mqtt.context": CORE,
    "vox_mqtt.outbox": CORE,
    "vox_mqtt.runner": CORE,
    "vox_mqtt.inbound": CORE,
    "vox_mqtt.warroompost": CORE,
    "vox_mqtt.liveness": CORE,
    "vox_mqtt.agent": CORE,
    "vox_mqtt.console": APPS,
    "vox_mqtt.exporter": APPS,
    "vox_mqtt": APPS,  # the package's public API re-exports every layer
}
CLI = "vox_mqtt.cli"  # every module under vox_mqtt/cli is an app


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(name: str) -> int:
    if name == CLI or name.startswith(CLI + "."):
        return APPS
    return LAYERS[name]


def imports_of(name: str) -> set[str]:
    """Return the package modules a module imports, wherever the import statement sits."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "vox_mqtt")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "vox_mqtt":
                continue
            for alias in node.names:
                # `from . import topics` names a module; `from .x import Y` names x.
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in MODULES else module)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def test_every_module_has_a_layer() -> None:
    unplaced = [name for name in MODULES if not name.startswith(CLI) and name not in LAYERS]
    assert unplaced == [], "add these to LAYERS here and to docs/architecture.md"
    assert set(LAYERS) <= set(MODULES), "LAYERS names modules that no longer exist"


def test_no_module_imports_a_layer_above_it() -> None:
    upward = [
        f"{name} ({LAYER_NAMES[layer_of(name)]}) imports {dep} ({LAYER_NAMES[layer_of(dep)]})"
        for name, deps in GRAPH.items()
        for dep in sorted(deps)
        if layer_of(dep) > layer_of(name)
    ]
    assert upward == []


def test_the_import_graph_has_no_cycle() -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(GRAPH[name]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_no_mixins() -> None:
    mixins = [
        f"{name}.{node.name}"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name.endswith("Mixin")
    ]
    assert mixins == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_under_600_lines(name: str) -> None:
    lines = MODULES[name].read_text(encoding="utf-8").count("\n")
    assert lines < 600, f"{name} has {lines} lines: split it by concept"


def test_the_guard_sees_type_checking_imports() -> None:
    # roles.py names the ledger and settings only for type checking: the graph must see them.
    assert {"vox_mqtt.ledger", "vox_mqtt.settings"} <= GRAPH["vox_mqtt.roles"]


def imported_test_modules(path: Path) -> set[str]:
    """Return the tests.test_* modules a file imports, wherever the import statement sits."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # Relative imports start from the tests package itself.
            module = ("tests." * bool(node.level)) + (node.module or "")
            module = module.rstrip(".")
            names = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if len(parts) >= 2 and parts[0] == "tests" and parts[1].startswith("test_"):
                found.add(".".join(parts[:2]))
    return found


def test_no_test_module_imports_another() -> None:
    # A test module is a list of tests; what several share belongs in a kit module.
    borrowed = [
        f"tests.{path.stem} imports {module}"
        for path in sorted(TESTS.glob("test_*.py"))
        for module in sorted(imported_test_modules(path))
        if module != f"tests.{path.stem}"
    ]
    assert borrowed == []
