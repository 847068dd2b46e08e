"""The package's structure as docs/architecture.md draws it, checked from the source with ast.

Subpackages in layers, bottom to top: protocol; transport, ledger; observe; agent, broker;
fleet; console; cli. A module imports only its own subpackage or a lower layer
(TYPE_CHECKING imports included), the agent runtime and the broker's control plane import
nothing of each other, the import graph has no cycle, no class is a mixin, and no module
grows past 600 lines. Only vox_mqtt/transport/ imports an MQTT library. Outside
vox_mqtt/ledger/actions.py, no ledger action is a bare string where a row is recorded or
read back (LedgerAction names it). A request's state has one type, RequestState
(vox_mqtt/protocol/requeststates.py): no other enum, Literal or name spells it. In tests/, a
test module imports no other test module: what several share lives in a kit module.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from vox_mqtt.agent.executors import PLAN_TYPES
from vox_mqtt.agent.requests import Served
from vox_mqtt.agent.tracking import TrackedRequest
from vox_mqtt.ledger.actions import LedgerAction

PACKAGE = Path(__file__).resolve().parents[2] / "vox_mqtt"
TESTS = Path(__file__).resolve().parents[1]


@functools.cache
def parsed(path: Path) -> ast.Module:
    """Return a source file's tree, parsed once for all the guards of this module."""
    return ast.parse(path.read_text(encoding="utf-8"))


_WALKED: dict[int, tuple[ast.AST, tuple[ast.AST, ...]]] = {}


def walked(tree: ast.AST) -> tuple[ast.AST, ...]:
    """Return every node of a tree, listed once per tree (the tree is kept with its list)."""
    known = _WALKED.get(id(tree))
    if known is None or known[0] is not tree:
        known = _WALKED[id(tree)] = (tree, tuple(ast.walk(tree)))
    return known[1]


# Subpackages bottom to top; keep in step with the layer table of docs/architecture.md.
# A module imports only its own subpackage or one of a lower layer; subpackages of one layer
# import nothing of each other (the agent runtime and the broker's control plane above all).
LAYERS: dict[str, int] = {
    "protocol": 0,  # the VOX contract and the fleet tree
    "transport": 1,
    "ledger": 1,
    "observe": 2,  # statuses, war room, metrics: read by the agent and the operator's tools
    "agent": 3,  # the agent runtime
    "broker": 3,  # the broker's control plane
    "fleet": 4,  # what the fleet file means: configs, bundles, diffs, plans, retirement
    "console": 5,  # the operator's side
    "cli": 6,
}
APPS = 6
# Outside every subpackage: the public API (`__init__`), the version and the first waves'
# import paths, each a re-export of one module below. No module of the package imports these.
TOP_LEVEL = {
    "vox_mqtt",
    "vox_mqtt._version",
    "vox_mqtt._entry",  # the console scripts' entry: Ctrl-C before and after a command
    "vox_mqtt.errors",
    "vox_mqtt.messages",
    "vox_mqtt.topics",
    "vox_mqtt.hierarchy",
    "vox_mqtt.roles",
    "vox_mqtt.memory",
}
VERSION = "vox_mqtt._version"  # read by every layer, imports nothing
# Neither side of these pairs may import the other, whatever their layers.
APART = [("agent", "broker"), ("agent", "fleet")]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def subpackage_of(name: str) -> str:
    """Return the subpackage a module belongs to ("" for the top-level modules)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else ""


def layer_of(name: str) -> int:
    if name == VERSION:
        return 0
    sub = subpackage_of(name)
    return LAYERS[sub] if sub else APPS


def imports_of(name: str) -> set[str]:
    """Return the package modules a module imports, wherever the import statement sits."""
    path = MODULES[name]
    tree = parsed(path)
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


def test_every_module_has_a_place() -> None:
    unplaced = [name for name in MODULES if name not in TOP_LEVEL and not subpackage_of(name)]
    assert unplaced == [], "put these in a subpackage, or add them to TOP_LEVEL and the docs"
    assert set(MODULES) >= TOP_LEVEL, "TOP_LEVEL names modules that no longer exist"
    assert {subpackage_of(name) for name in MODULES} - {""} == set(LAYERS)


def test_no_module_imports_a_layer_above_it() -> None:
    upward = [
        f"{name} (layer {layer_of(name)}) imports {dep} (layer {layer_of(dep)})"
        for name, deps in GRAPH.items()
        for dep in sorted(deps)
        if layer_of(dep) > layer_of(name)
    ]
    assert upward == []


def test_subpackages_of_one_layer_import_nothing_of_each_other() -> None:
    across = [
        f"{name} imports {dep}"
        for name, deps in GRAPH.items()
        for dep in sorted(deps)
        if subpackage_of(name)
        and subpackage_of(dep)
        and subpackage_of(name) != subpackage_of(dep)
        and layer_of(name) == layer_of(dep)
    ]
    assert across == []


@pytest.mark.parametrize(("one", "other"), APART)
def test_the_agent_runtime_and_the_control_plane_stay_apart(one: str, other: str) -> None:
    crossing = [
        f"{name} imports {dep}"
        for name, deps in GRAPH.items()
        for dep in sorted(deps)
        if {subpackage_of(name), subpackage_of(dep)} == {one, other}
    ]
    assert crossing == []


def test_no_module_of_the_package_imports_the_top_level() -> None:
    # The top-level modules re-export; a part that imported them would import every layer.
    inward = [
        f"{name} imports {dep}"
        for name, deps in GRAPH.items()
        if subpackage_of(name)
        for dep in sorted(deps)
        if dep in TOP_LEVEL and dep != VERSION
    ]
    assert inward == []


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
        for node in ast.walk(parsed(path))
        if isinstance(node, ast.ClassDef) and node.name.endswith("Mixin")
    ]
    assert mixins == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_under_600_lines(name: str) -> None:
    lines = MODULES[name].read_text(encoding="utf-8").count("\n")
    assert lines < 600, f"{name} has {lines} lines: split it by concept"


# The wire is owned by vox_mqtt/transport/ (docs/transport.md): no other module of the
# package imports an MQTT library, whichever way (TYPE_CHECKING, inside a function,
# importlib). tests/ and bench/ may: raw clients there are independent witnesses and baselines.
TRANSPORT = "vox_mqtt.transport"


def is_mqtt_library(module: str) -> bool:
    """Tell whether an imported module belongs to an MQTT library (paho, aiomqtt, gmqtt, ...)."""
    top = module.split(".")[0].lower()
    return top == "paho" or ("mqtt" in top and top != "vox_mqtt")


def mqtt_imports(tree: ast.AST) -> list[str]:
    """Return the MQTT library modules a module's source imports, however it spells it."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if is_mqtt_library(alias.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [node.module] if is_mqtt_library(node.module) else []
        elif isinstance(node, ast.Call) and node.args:
            func, first = node.func, node.args[0]
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(first, ast.Constant):
                found += [str(first.value)] if is_mqtt_library(str(first.value)) else []
    return found


def test_only_the_transport_imports_an_mqtt_library() -> None:
    outside = {
        name: imported
        for name, path in MODULES.items()
        if name != TRANSPORT and not name.startswith(TRANSPORT + ".")
        if (imported := mqtt_imports(parsed(path)))
    }
    assert outside == {}, "go through vox_mqtt.transport (Session, BlockingSession, Inbound)"


def test_paho_is_no_runtime_dependency() -> None:
    """The package packs and reads PUBLISH properties itself (transport/publishprops.py):
    paho-mqtt is a test and bench dependency only (pyproject.toml, docs/transport.md)."""
    importing = {
        name: imported
        for name, path in MODULES.items()
        if (imported := [m for m in mqtt_imports(parsed(path)) if m.split(".")[0] == "paho"])
    }
    assert importing == {}


def test_the_mqtt_guard_sees_each_way_of_importing_a_library() -> None:
    source = """
import paho.mqtt.client as mqtt
from aiomqtt import Client
import gmqtt, json
from amqtt.client import MQTTClient
import importlib
importlib.import_module("mqtt5.client")
__import__("asyncio_mqtt")
from vox_mqtt.transport import Session
from . import mqttish_but_relative
"""
    assert mqtt_imports(ast.parse(source)) == [
        "paho.mqtt.client",
        "aiomqtt",
        "gmqtt",
        "amqtt.client",
        "mqtt5.client",
        "asyncio_mqtt",
    ]
    # The transport itself does import one: the guard would see it there.
    assert mqtt_imports(ast.parse(MODULES["vox_mqtt.transport.wire"].read_text("utf-8")))


# The framework's ledger vocabulary is LedgerAction (vox_mqtt/ledger/actions.py): outside that
# module no action is spelled as a bare string where a row is recorded or read back.
ACTIONS = frozenset(str(action) for action in LedgerAction)
ACTIONS_MODULE = PACKAGE / "ledger" / "actions.py"
RECORDERS = frozenset({"record_message", "record", "has_message", "message_row", "make_row"})
SQL_ACTION = re.compile(r"\baction\s*(?:=|!=|<>|IN\s*\()\s*'(\w+)'", re.IGNORECASE)


def _called(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _bare(node: ast.AST | None) -> list[ast.Constant]:
    """The action strings a value spells out: itself, or the items of a tuple, list or set."""
    if isinstance(node, ast.Constant) and node.value in ACTIONS:
        return [node]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [c for item in node.elts for c in _bare(item)]
    return []


def _reads_action(node: ast.expr) -> bool:
    """row["action"], row.get("action"), row[_ACTION] or a name `action`."""
    if isinstance(node, ast.Subscript):
        key = node.slice
        return (isinstance(key, ast.Constant) and key.value == "action") or (
            isinstance(key, ast.Name) and key.id == "_ACTION"
        )
    if isinstance(node, ast.Call) and _called(node.func) == "get" and node.args:
        return isinstance(node.args[0], ast.Constant) and node.args[0].value == "action"
    return isinstance(node, ast.Name) and node.id == "action"


def _compared(node: ast.Compare) -> list[ast.Constant]:
    sides = [node.left, *node.comparators]
    found = []
    for i, side in enumerate(sides):
        others = sides[:i] + sides[i + 1 :]
        if _reads_action(side):
            found += [c for other in others for c in _bare(other)]
        elif isinstance(side, ast.Tuple):  # (r["type"], r["action"]) == ("...", "sent")
            for j, item in enumerate(side.elts):
                if _reads_action(item):
                    found += [
                        c
                        for other in others
                        if isinstance(other, ast.Tuple) and len(other.elts) == len(side.elts)
                        for c in _bare(other.elts[j])
                    ]
    return found


def bare_ledger_actions(source: str, where: str) -> list[str]:
    """Each bare action string passed to a recorder, in a row tuple, compared to a row's
    action or written into a query's `action = '...'`, as "file:line: what"."""
    found: list[tuple[int, int, str]] = []

    def refuse(node: ast.expr, value: str, how: str) -> None:
        problem = f"{where}:{node.lineno}: bare ledger action {value!r} {how}: use LedgerAction"
        found.append((node.lineno, node.col_offset, problem))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _called(node.func)
            values = [*node.args, *(k.value for k in node.keywords)]
            if name in RECORDERS:
                for c in (c for v in values for c in _bare(v)):
                    refuse(c, c.value, f"passed to {name}()")
            elif name == "append" and _called(getattr(node.func, "value", node)) == "rows":
                for c in (c for v in values for c in _bare(v)):
                    refuse(c, c.value, "in a staged row")
            else:
                then = [k.value for k in node.keywords if k.arg == "then"]
                for c in (c for v in then for c in _bare(v)):
                    refuse(c, c.value, f"in a `then` row of {name}()")
        elif isinstance(node, ast.Compare):
            for c in _compared(node):
                refuse(c, c.value, "compared with a row's action")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in SQL_ACTION.finditer(node.value):
                if match[1] in ACTIONS:
                    refuse(node, match[1], "in SQL")
    return [problem for *_, problem in sorted(found)]


def problems_in_package(finder: Callable[[str, str], list[str]], *, but: set[Path]) -> list[str]:
    """Run a source finder over every module of the package but some; return its findings."""
    return [
        problem
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in but
        for problem in finder(
            path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent))
        )
    ]


def test_ledger_actions_are_named_by_the_enum_only() -> None:
    found = problems_in_package(bare_ledger_actions, but={ACTIONS_MODULE})
    assert found == [], "\n".join(found)


def test_the_action_guard_sees_each_way_of_spelling_one() -> None:
    source = """
ledger.record_message(message, "sent", then=[(request, "failed", None)])
staged.rows.append((request, "started", None))
outbox.send_message(reply, expects_reply=False, then=[(request, "completed", None)])
if row["action"] == "delegated" or row.get("action") in ("received", "duplicate"): pass
if (r["message_type"], r["action"]) == ("command_request", "canceled"): pass
SQL = "SELECT 1 FROM logs WHERE action = 'expired'"
ledger.record("door", LedgerAction.VIA, None, None, {})  # named: fine
if row["state"] == "failed": pass  # a state, not a row's action: fine
"""
    found = bare_ledger_actions(source, "x.py")
    assert [line.split(": ", 2)[1] for line in found] == [
        "bare ledger action 'sent' passed to record_message()",
        "bare ledger action 'failed' passed to record_message()",
        "bare ledger action 'started' in a staged row",
        "bare ledger action 'completed' in a `then` row of send_message()",
        "bare ledger action 'delegated' compared with a row's action",
        "bare ledger action 'received' compared with a row's action",
        "bare ledger action 'duplicate' compared with a row's action",
        "bare ledger action 'canceled' compared with a row's action",
        "bare ledger action 'expired' in SQL",
    ], found
    assert found[0].startswith("x.py:2: ")


# --- the plan is carried out, not decided again (docs/architecture.md, the pipeline) -----------

PLAN_NAMES = frozenset(t.__name__ for t in PLAN_TYPES)
# The only modules that tell one plan type from another: the decision and the table.
STEP_DECIDERS = {PACKAGE / "agent" / "plan.py", PACKAGE / "agent" / "executors.py"}


def _names_a_plan(node: ast.AST) -> bool:
    if isinstance(node, ast.Tuple | ast.Set | ast.List):
        return any(_names_a_plan(n) for n in node.elts)
    if isinstance(node, ast.BinOp):  # A | B
        return _names_a_plan(node.left) or _names_a_plan(node.right)
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name in PLAN_NAMES


def _is_a_plan(node: ast.AST) -> bool:
    """A value named as a plan: `plan`, `served.plan` (the demo's `self.step` is not)."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name.endswith("plan")


def step_branches(source: str, filename: str) -> list[str]:
    """Where a module tells plan types apart: isinstance, type(x) is, a match, a `.step`."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        why = None
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "isinstance",
            "issubclass",
        ):
            if len(node.args) == 2 and _names_a_plan(node.args[1]):
                why = "isinstance() against a plan type"
        elif isinstance(node, ast.Compare) and (
            isinstance(node.left, ast.Call) and getattr(node.left.func, "id", None) == "type"
        ):
            if any(_names_a_plan(c) for c in node.comparators):
                why = "type() compared with a plan type"
        elif isinstance(node, ast.MatchClass) and _names_a_plan(node.cls):
            why = "a match case on a plan type"
        elif isinstance(node, ast.Attribute) and node.attr == "step" and _is_a_plan(node.value):
            why = "a plan's `.step`"
        if why is not None:
            found.append(f"{filename}:{getattr(node, 'lineno', 0)}: {why}")
    return found


def test_no_step_branches_outside_the_plan_and_the_executor_table() -> None:
    found = problems_in_package(step_branches, but=STEP_DECIDERS)
    assert found == [], "\n".join(found)


def test_the_step_guard_sees_each_way_of_branching() -> None:
    source = """
if isinstance(plan, Serve): pass
if isinstance(plan, (Delegate, Unroutable)): pass
if isinstance(plan, plans.Expired | plans.Stopping): pass
if type(plan) is CancelInFlight: pass
if type(plan) in {Late, Event}: pass
match plan:
    case Answer(): pass
if plan.step is Step.SERVE: pass
table = {Serve: serve}  # naming one as a key is the table's business: fine
if isinstance(outcome, Redecide): pass  # not a plan: fine
"""
    found = step_branches(source, "x.py")
    assert [line.split(": ", 1)[1] for line in found] == [
        "isinstance() against a plan type",
        "isinstance() against a plan type",
        "isinstance() against a plan type",
        "type() compared with a plan type",
        "type() compared with a plan type",
        "a match case on a plan type",
        "a plan's `.step`",
    ], found


# --- a request's record has one writer: its owner (agent/requests.py) ------------------------

# The fields of both records: a command served here, a message sent from here (what hangs on
# it included: its delivery, its end being recorded, its followers).
SERVED_FIELDS = frozenset(f.name for f in dataclasses.fields(Served)) | frozenset(
    f.name for f in dataclasses.fields(TrackedRequest)
)
# The owners: the request owner, and the tracker it holds for the requests this agent sent.
RECORD_OWNERS = {PACKAGE / "agent" / "requests.py", PACKAGE / "agent" / "tracking.py"}


def record_writes(source: str, filename: str) -> list[str]:
    """Where a module assigns a field of a request's record (anything but its own `self`)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Attribute)
                    and isinstance(part.ctx, ast.Store)
                    and part.attr in SERVED_FIELDS
                    and not (isinstance(part.value, ast.Name) and part.value.id == "self")
                ):
                    found.append(f"{filename}:{node.lineno}: {ast.unparse(part)} assigned")
    return found


# Fields of other objects that share a record's field name (the guard reads names, not types).
NOT_RECORDS = {
    "vox_mqtt/observe/status.py: entry.error_code assigned",  # a child's status entry
}


def test_no_assignment_to_a_request_record_outside_its_owner() -> None:
    found = problems_in_package(record_writes, but=RECORD_OWNERS)
    found = [f for f in found if re.sub(r":\d+:", ":", f) not in NOT_RECORDS]
    assert found == [], "\n".join(found)


def test_the_record_guard_sees_each_way_of_writing_one() -> None:
    source = """
served.slot = True
staged.served.answer_state = Answering.OPEN
relayed.answer, relayed.answer_end = outgoing, "completed"
served.history += [("started", 1.0)]
tracked.followers = (*tracked.followers, me)
tracked.delivery = None
x: bool = served.answering  # a read: fine
self.task = task  # a part's own field: fine
"""
    assert [line.split(": ", 1)[1] for line in record_writes(source, "x.py")] == [
        "served.slot assigned",
        "staged.served.answer_state assigned",
        "relayed.answer assigned",
        "relayed.answer_end assigned",
        "served.history assigned",
        "tracked.followers assigned",
        "tracked.delivery assigned",
    ]


def owner_callbacks(source: str, filename: str) -> list[str]:
    """Where a record's owner takes or keeps something to call back: a Callable, an on_ hook.

    Its moves are events on a queue that one reader takes (agent/requestevents.py).
    """
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom) and any(a.name == "Callable" for a in node.names):
            found.append(f"{filename}:{node.lineno}: imports Callable")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("on_"):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.arg) and node.arg.startswith("on_"):
            found.append(f"{filename}:{node.lineno}: takes {node.arg}")
    return found


def test_a_record_s_owner_calls_nobody() -> None:
    found = [
        problem
        for path in sorted(RECORD_OWNERS)
        for problem in owner_callbacks(path.read_text(encoding="utf-8"), path.name)
    ]
    assert found == [], "\n".join(found)


def test_the_callback_guard_sees_each_way_of_keeping_one() -> None:
    source = """
from collections.abc import Callable
def __init__(self, *, on_change=None): self.on_change = on_change
if self.on_move is not None: self.on_move(served, state)
self.events.put(ServedMoved(served, state))  # an event: fine
"""
    assert [line.split(": ", 1)[1] for line in owner_callbacks(source, "x.py")] == [
        "imports Callable",
        "takes on_change",
        "self.on_change",
        "self.on_move",
        "self.on_move",
    ]


# --- one type for a request's state: RequestState (protocol/requeststates.py) ----------------

STATES_MODULE = PACKAGE / "protocol" / "requeststates.py"
# The wire's word that only a request's state has (the ledger writes it `started`).
WORKING = "working"


def _named(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _lists_working(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and n.value == WORKING for n in ast.walk(node))


def second_request_states(source: str, where: str) -> list[str]:
    """Each type of a request's state besides RequestState: an enum with a WORKING member
    or a "working" value, a Literal that lists "working", or another `RequestState`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == "RequestState":
            found.append((node.lineno, "a class RequestState"))
        elif isinstance(node, ast.ClassDef) and any(
            _named(base).endswith("Enum") for base in node.bases
        ):
            for item in node.body:
                if isinstance(item, ast.Assign | ast.AnnAssign):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    named = any(_named(t) == "WORKING" for t in targets)
                    if named or (item.value is not None and _lists_working(item.value)):
                        found.append((item.lineno, f"an enum of request states ({node.name})"))
        elif isinstance(node, ast.Subscript) and _named(node.value) == "Literal":
            if _lists_working(node.slice):
                found.append((node.lineno, "a Literal of request states"))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_named(t) == "RequestState" for t in targets):
                found.append((node.lineno, "a name RequestState assigned"))
    return [
        f"{where}:{line}: {what}: use protocol/requeststates.py" for line, what in sorted(found)
    ]


def test_a_request_s_state_has_one_type() -> None:
    found = problems_in_package(second_request_states, but={STATES_MODULE})
    assert found == [], "\n".join(found)


def test_the_state_guard_sees_each_way_of_spelling_a_second_one() -> None:
    source = """
class ServedState(StrEnum):
    RECEIVED = LedgerAction.RECEIVED
    WORKING = LedgerAction.STARTED
class Phase(str, enum.Enum):
    BUSY = "working"
Part = Literal["working", "delegated"]
state: typing.Literal["received", "working"]
RequestState = Literal["received", "unknown"]
class RequestState: pass
class SentState(StrEnum):  # a sent message's delivery, not a request's state: fine
    QUEUED = "queued"
    COMPLETED = "completed"
class LedgerAction(StrEnum):  # the ledger's rows: fine
    STARTED = "started"
part = {"state": "working"}  # a value, not a type: fine
if row.get("state") == "working": pass  # fine
"""
    found = second_request_states(source, "x.py")
    assert [line.split(": ", 2)[1] for line in found] == [
        "an enum of request states (ServedState)",
        "an enum of request states (Phase)",
        "a Literal of request states",
        "a Literal of request states",
        "a name RequestState assigned",
        "a class RequestState",
    ], found
    assert found[0].startswith("x.py:4: ")


def test_the_agent_s_config_lives_in_one_cell() -> None:
    # A reload replaces the config in the context (VOXAgent._use); a part that kept a copy
    # of its own went on with the old one unless someone remembered to hand it the new one.
    agent = PACKAGE / "agent"
    copies = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in sorted(agent.glob("*.py"))
        if path.name != "context.py"
        for node in ast.walk(parsed(path))
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and target.attr in ("config", "_config")
        if not (isinstance(target.value, ast.Attribute) and target.value.attr in ("_ctx", "ctx"))
    ]
    assert copies == [], f"a copy of the config outside the context's cell: {copies}"


def test_the_guard_sees_type_checking_imports() -> None:
    # roles.py names the ledger and settings only for type checking: the graph must see them.
    assert {"vox_mqtt.ledger.store", "vox_mqtt.protocol.settings"} <= GRAPH["vox_mqtt.agent.roles"]


def name_of_test_file(path: Path) -> str:
    return ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)


TEST_MODULES = {
    name_of_test_file(p)
    for folder in ("unit", "integration")
    for p in (TESTS / folder).glob("test_*.py")
}


def imported_test_modules(path: Path) -> set[str]:
    """Return the test modules (tests/unit, tests/integration) a file imports, wherever it sits."""
    package = name_of_test_file(path).split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(name for name in names if name in TEST_MODULES)
    return found


def test_no_test_module_imports_another() -> None:
    # A test module is a list of tests; what several share belongs in tests/kits.
    borrowed = [
        f"{name_of_test_file(path)} imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for module in sorted(imported_test_modules(path))
        if module != name_of_test_file(path)
    ]
    assert borrowed == []
    assert len(TEST_MODULES) > 50


def test_the_tests_folder_holds_only_its_three_folders_and_the_conftest() -> None:
    loose = sorted(p.name for p in TESTS.glob("*.py"))
    assert loose == ["__init__.py", "conftest.py"]


# No private name of an MQTT library anywhere in the project (docs/transport.md, "The wire"):
# what a library does not publish, a release may change without a word.
MQTT_LIBRARIES = ("paho", "aiomqtt", "mqtt5", "zmqtt")
PROJECT = PACKAGE.parent
SOURCE_DIRS = ("vox_mqtt", "agent_daemon", "bench", "tests", "examples", "scripts")


def _library_private_names() -> frozenset[str]:
    """Every single-underscore name a class or module of the libraries defines or assigns."""
    import importlib
    import inspect

    names: set[str] = set()
    modules = [
        "paho.mqtt.client",
        "paho.mqtt.properties",
        "paho.mqtt.reasoncodes",
        "paho.mqtt.subscribeoptions",
        "aiomqtt",
        "aiomqtt.client",
        "mqtt5",
        "zmqtt",
        "zmqtt.client",
    ]
    files: set[str] = set()
    for module_path in modules:
        module = importlib.import_module(module_path)
        found = [module, *(v for v in vars(module).values() if inspect.isclass(v))]
        for item in found:
            names.update(n for n in dir(item) if n.startswith("_") and not n.startswith("__"))
            try:
                files.add(inspect.getsourcefile(item) or "")
            except TypeError:
                continue  # a built-in or compiled class: dir() above is all there is
    # What the classes assign to themselves, read once per file that defines them.
    for name in files - {""}:
        source = Path(name).read_text(encoding="utf-8")
        names.update(re.findall(r"self\.(_[a-z]\w*)\s*[:=]", source))
    return frozenset(names)


def _own_private_names(trees: list[ast.Module]) -> frozenset[str]:
    """The single-underscore names the project itself defines: its own, whatever a library has."""
    names: set[str] = set()
    for tree in trees:
        for node in walked(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)  # an attribute of one of the project's own classes
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg | ast.keyword) and node.arg:
                names.add(node.arg)
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


def _library_aliases(tree: ast.Module) -> set[str]:
    """Names a module binds to an MQTT library or something imported from one."""
    aliases: set[str] = set()
    for node in walked(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in MQTT_LIBRARIES:
                    aliases.add((alias.asname or alias.name).split(".")[0])
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] in MQTT_LIBRARIES
        ):
            aliases.update(alias.asname or alias.name for alias in node.names)
    return aliases


def private_library_uses(
    tree: ast.Module, where: str, library: frozenset[str], own: frozenset[str]
) -> list[str]:
    """Return each use of a library's private name in one module."""
    aliases = _library_aliases(tree)
    found = []
    for node in walked(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = [*node.module.split("."), *(a.name for a in node.names)]
            if parts[0] in MQTT_LIBRARIES and any(p.startswith("_") for p in parts):
                found.append(f"{where}:{node.lineno}: imports a private name of {parts[0]}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in MQTT_LIBRARIES and any(p.startswith("_") for p in parts):
                    found.append(f"{where}:{node.lineno}: imports {alias.name}")
        elif isinstance(node, ast.Attribute) and node.attr in library and node.attr not in own:
            found.append(f"{where}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ClassDef):
            # A subclass of a library's class that defines one of its private names is a hook
            # into the library's insides, whatever the name is called elsewhere.
            based = any(
                isinstance(b, ast.Attribute | ast.Name) and ast.unparse(b).split(".")[0] in aliases
                for b in node.bases
            )
            for item in node.body if based else ():
                if (
                    isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    and item.name in library
                ):
                    found.append(f"{where}:{item.lineno}: overrides {item.name}")
    return found


def test_no_private_name_of_an_mqtt_library_is_used() -> None:
    paths = [
        p
        for d in SOURCE_DIRS
        if (PROJECT / d).is_dir()
        for p in sorted((PROJECT / d).rglob("*.py"))
    ]
    trees = {p: parsed(p) for p in paths}
    own = _own_private_names(list(trees.values()))
    library = _library_private_names()
    found = [
        use
        for path, tree in trees.items()
        for use in private_library_uses(tree, str(path.relative_to(PROJECT)), library, own)
    ]
    assert found == []


def test_the_private_name_guard_sees_each_way_of_reaching_in() -> None:
    library = _library_private_names()
    source = """
import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt import _packet

class Client(aiomqtt.Client):
    def _on_message(self, client, userdata, message):
        pass

def patch(client: mqtt.Client) -> None:
    client._sock_send = None
    client._handle_publish()
"""
    uses = private_library_uses(ast.parse(source), "m.py", library, frozenset())
    assert len(uses) == 4, uses


def _names_used(path: Path) -> set[str]:
    """Return every name a module imports or calls, bare (`x()`) or as an attribute (`m.x()`);
    a call of `update` with a `presence` keyword is a status put into a FleetView."""
    found: set[str] = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Call):
            called = _called(node.func)
            if called == "update" and any(k.arg == "presence" for k in node.keywords):
                called = "FleetView.update"
            found.add(called)
    return found


# The intake of statuses and war-room posts is written once, in observe/statusintake.py: a look
# (observe/observer.py) and an agent's watch of its children (agent/childwatch.py) both take
# through it. Its parts are named nowhere else, but where each is defined.
INTAKE = "vox_mqtt.observe.statusintake"
INTAKE_PARTS = {
    "read_status": INTAKE,
    "expiry_left": INTAKE,
    "apply_warroom": "vox_mqtt.observe.warroom",
    "WarroomGuard": "vox_mqtt.observe.warroomguard",
    "WarroomOrder": "vox_mqtt.observe.warroomreplay",
    "FleetView.update": INTAKE,  # a status taken into a view
}


def test_statuses_and_war_room_posts_have_one_intake() -> None:
    # A second copy of the intake (a forgery check, a guard, a replay order, a status read
    # into a view) went out of step with the first: the agent's refused what a look took.
    copies = [
        f"{name} names {part}"
        for name, path in MODULES.items()
        if name != INTAKE
        for part in sorted(_names_used(path) & set(INTAKE_PARTS))
        if name != INTAKE_PARTS[part]
        # apply_warroom judges by a WarroomOrder: its module names the type.
        and not (part == "WarroomOrder" and name == INTAKE_PARTS["apply_warroom"])
    ]
    assert copies == [], "take statuses and posts through observe/statusintake.py's StatusIntake"
    assert INTAKE in GRAPH["vox_mqtt.observe.observer"]
    assert INTAKE in GRAPH["vox_mqtt.agent.childwatch"]


# Liveness is split by concept (docs/architecture.md, "The agent core"): each part is the one
# module of the agent runtime that names what its concept is made of; liveness.py wires them.
LIVENESS_PARTS = {
    "MSG_AGENT_STATUS": "vox_mqtt.agent.ownstatus",  # the agent's own status and presence
    "EpochCounter": "vox_mqtt.agent.ownstatus",
    "StatusIntake": "vox_mqtt.agent.childwatch",  # what it learns of the agents it watches
    "HeadWitness": "vox_mqtt.agent.childwatch",
    "WarroomPoster": "vox_mqtt.agent.reconcile",  # what it keeps in the war room
}


def test_liveness_is_split_by_concept() -> None:
    strays = [
        f"{name} names {part} (the part of {LIVENESS_PARTS[part]})"
        for name, path in MODULES.items()
        if subpackage_of(name) == "agent" and name != "vox_mqtt.agent.warroompost"
        for part in sorted(_names_used(path) & set(LIVENESS_PARTS))
        if name != LIVENESS_PARTS[part]
    ]
    assert strays == []
    wired = {"vox_mqtt.agent.ownstatus", "vox_mqtt.agent.childwatch", "vox_mqtt.agent.reconcile"}
    assert wired <= GRAPH["vox_mqtt.agent.liveness"]
