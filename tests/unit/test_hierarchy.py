"""The fleet file: the seed tree, every validation rule, and the slice each agent may know."""

from __future__ import annotations

import textwrap
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from vox_mqtt.protocol.errors import FleetError
from vox_mqtt.protocol.hierarchy import AgentSpec, Fleet, load_fleet, parse_fleet, seed_fleet_toml
from vox_mqtt.protocol.topics import WARROOM_ID

OPERATOR = UUID("e5450579-c7df-4198-b302-bfd34c8822d3")
ROOT = UUID("e162d5c1-df06-45ae-be42-f38d234896e3")
COORDINATOR = UUID("ff74ba58-a83d-40b4-ba17-9f4a9e2c3ced")
SPECIALIST_A = UUID("a7ff5518-97cc-4163-9f50-148c085011da")
SPECIALIST_B = UUID("82ab9486-fa26-4148-972f-1771d777fdea")

SEED = f"""\
[operator]
name = "operator"
id = "{OPERATOR}"

[[agents]]
name = "root"
id = "{ROOT}"

[[agents]]
name = "coordinator"
id = "{COORDINATOR}"
master_id = "{ROOT}"
roles = ["examples.freelance:Coordinator"]

[[agents]]
name = "specialist_a"
id = "{SPECIALIST_A}"
master_id = "{COORDINATOR}"
roles = ["examples.freelance:Analyst"]
heartbeat_interval = 5
settings = {{ mailbox = "jobs@example.com" }}

[[agents]]
name = "specialist_b"
id = "{SPECIALIST_B}"
master_id = "{COORDINATOR}"
"""


def fleet_file(*agents: str, operator: str = f'id = "{OPERATOR}"') -> str:
    """Return fleet-file text: an [operator] table and one [[agents]] table per body."""
    tables = [f"[operator]\n{operator}\n"]
    tables += [f"[[agents]]\n{textwrap.dedent(body).strip()}\n" for body in agents]
    return "\n".join(tables)


def agent(name: str, agent_id: object, master: object = None, extra: str = "") -> str:
    master_line = "" if master is None else f'master_id = "{master}"\n'
    return f'name = "{name}"\nid = "{agent_id}"\n{master_line}{extra}'


def problems_of(text: str) -> list[str]:
    with pytest.raises(FleetError) as caught:
        parse_fleet(text, source="fleet.toml")
    assert str(caught.value) == "\n".join(caught.value.problems)
    return caught.value.problems


def line_of(text: str, needle: str) -> int:
    """Return the line of the [[agents]] header above the first line containing needle."""
    lines = text.splitlines()
    at = next(number for number, line in enumerate(lines) if needle in line)
    return next(n + 1 for n in range(at, -1, -1) if lines[n].strip() == "[[agents]]")


# --- the seed tree --------------------------------------------------------------------------


@pytest.fixture
def fleet() -> Fleet:
    return parse_fleet(SEED)


def test_the_seed_tree_loads(fleet: Fleet) -> None:
    assert fleet.operator_id == OPERATOR
    assert fleet.operator_name == "operator"
    assert [agent.name for agent in fleet] == [
        "root",
        "coordinator",
        "specialist_a",
        "specialist_b",
    ]
    assert len(fleet) == 4
    assert fleet.root.id == ROOT
    assert fleet.root.master_id is None
    specialist = fleet.agent("specialist_a")
    assert specialist.roles == ("examples.freelance:Analyst",)
    assert specialist.heartbeat_interval == 5.0
    assert dict(specialist.settings) == {"mailbox": "jobs@example.com"}
    assert specialist.line == line_of(SEED, f'id = "{SPECIALIST_A}"')


def test_agents_are_found_by_name_id_or_id_text(fleet: Fleet) -> None:
    assert fleet.agent("coordinator").id == COORDINATOR
    assert fleet.agent(COORDINATOR).name == "coordinator"
    assert fleet.agent(str(COORDINATOR)).name == "coordinator"
    for missing in ("nobody", uuid4(), str(uuid4())):
        with pytest.raises(KeyError):
            fleet.agent(missing)


def test_master_of_walks_up_and_the_root_answers_to_the_operator(fleet: Fleet) -> None:
    assert fleet.master_of(SPECIALIST_A) == COORDINATOR
    assert fleet.master_of(SPECIALIST_B) == COORDINATOR
    assert fleet.master_of(COORDINATOR) == ROOT
    assert fleet.master_of(ROOT) == OPERATOR


def test_children_of_lists_only_direct_children(fleet: Fleet) -> None:
    assert [c.id for c in fleet.children_of(COORDINATOR)] == [SPECIALIST_A, SPECIALIST_B]
    assert [c.id for c in fleet.children_of(ROOT)] == [COORDINATOR]
    assert fleet.children_of(SPECIALIST_A) == ()
    assert [c.id for c in fleet.children_of(OPERATOR)] == [ROOT]


def test_the_hierarchy_snapshot_is_the_parent_to_children_graph(fleet: Fleet) -> None:
    assert fleet.get_hierarchy_snapshot() == {
        ROOT: [COORDINATOR],
        COORDINATOR: [SPECIALIST_A, SPECIALIST_B],
        SPECIALIST_A: [],
        SPECIALIST_B: [],
    }
    assert [fleet.depth_of(a.id) for a in fleet] == [0, 1, 2, 2]


def _ids_in_view(fleet: Fleet, agent_id: UUID) -> set[UUID]:
    view = fleet.view_of(agent_id)
    ids = {view.agent.id, view.master_id, *view.children_ids}
    for spec in (view.agent, *view.children):
        ids.add(spec.id)
        if spec.master_id is not None:
            ids.add(spec.master_id)
    return ids


def test_a_specialist_knows_only_itself_and_its_master(fleet: Fleet) -> None:
    view = fleet.view_of(SPECIALIST_A)
    assert view.agent.name == "specialist_a"
    assert (view.master_id, view.master_name) == (COORDINATOR, "coordinator")
    assert view.children == ()
    # Philosophy of ignorance: neither the root nor the sibling is in its slice.
    assert _ids_in_view(fleet, SPECIALIST_A) == {SPECIALIST_A, COORDINATOR}


def test_the_coordinator_knows_its_master_and_children_only(fleet: Fleet) -> None:
    view = fleet.view_of(COORDINATOR)
    assert (view.master_id, view.master_name) == (ROOT, "root")
    assert view.children_ids == {SPECIALIST_A, SPECIALIST_B}
    assert _ids_in_view(fleet, COORDINATOR) == {ROOT, COORDINATOR, SPECIALIST_A, SPECIALIST_B}


def test_the_root_knows_the_operator_and_the_coordinator_not_the_specialists(
    fleet: Fleet,
) -> None:
    view = fleet.view_of(ROOT)
    assert (view.master_id, view.master_name) == (OPERATOR, "operator")
    assert _ids_in_view(fleet, ROOT) == {OPERATOR, ROOT, COORDINATOR}


def test_specs_are_hashable_and_fleets_compare_by_content(fleet: Fleet) -> None:
    assert len(set(fleet)) == 4
    assert parse_fleet(SEED) == fleet
    assert hash(parse_fleet(SEED)) == hash(fleet)
    assert isinstance(fleet.root, AgentSpec)


def test_seed_fleet_toml_is_the_seed_tree_with_fresh_uuids() -> None:
    one, two = parse_fleet(seed_fleet_toml()), parse_fleet(seed_fleet_toml())
    names = ["root", "coordinator", "specialist_a", "specialist_b"]
    assert [a.name for a in one] == [a.name for a in two] == names
    ids_one = {one.operator_id, *(a.id for a in one)}
    ids_two = {two.operator_id, *(a.id for a in two)}
    assert len(ids_one) == len(ids_two) == 5
    assert not ids_one & ids_two
    assert [c.name for c in one.children_of(one.agent("coordinator").id)] == names[2:]


def test_a_flat_fleet_of_one_root_is_valid() -> None:
    fleet = parse_fleet(fleet_file(agent("solo", ROOT)))
    assert fleet.root.name == "solo"
    assert fleet.get_hierarchy_snapshot() == {ROOT: []}


def test_an_empty_master_id_marks_the_root() -> None:
    fleet = parse_fleet(fleet_file(agent("root", ROOT, extra='master_id = ""\n')))
    assert fleet.root.id == ROOT


# --- validation: every problem names the agent and its line ---------------------------------


def test_duplicate_ids_name_both_agents_and_lines() -> None:
    text = fleet_file(
        agent("root", ROOT),
        agent("coordinator", COORDINATOR, ROOT),
        agent("twin", COORDINATOR, ROOT),
    )
    assert problems_of(text) == [
        f"fleet.toml:13: agent 'twin': id {COORDINATOR} is already used by 'coordinator' (line 8)"
    ]


def test_duplicate_names_name_both_lines() -> None:
    text = fleet_file(agent("root", ROOT), agent("root", COORDINATOR, ROOT))
    assert problems_of(text) == [
        "fleet.toml:8: agent 'root': the name is already used by 'root' (line 4)"
    ]


@pytest.mark.parametrize(
    "bad_id",
    [
        "not-a-uuid",
        "",
        "e162d5c1df0645aebe42f38d234896e3",
        "{e162d5c1-df06-45ae-be42-f38d234896e3}",
        "urn:uuid:e162d5c1-df06-45ae-be42-f38d234896e3",
    ],
)
def test_ids_must_be_uuids(bad_id: str) -> None:
    text = fleet_file(agent("root", bad_id))
    assert f"fleet.toml:4: agent 'root': id {bad_id!r} is not a UUID" in problems_of(text)


def test_an_id_that_is_not_a_string_is_refused() -> None:
    text = fleet_file('name = "root"\nid = 42')
    assert "fleet.toml:4: agent 'root': id 42 is not a UUID" in problems_of(text)


def test_master_ids_must_be_uuids() -> None:
    text = fleet_file(agent("root", ROOT), agent("coordinator", COORDINATOR, "root"))
    assert problems_of(text) == [
        "fleet.toml:8: agent 'coordinator': master_id 'root' is not a UUID"
    ]


def test_zero_roots_is_an_error() -> None:
    text = fleet_file(agent("a", ROOT, COORDINATOR), agent("b", COORDINATOR, ROOT))
    problems = problems_of(text)
    assert "fleet.toml: no root: exactly one agent must have no master_id" in problems


def test_several_roots_are_named_with_their_lines() -> None:
    text = fleet_file(agent("root", ROOT), agent("other", COORDINATOR))
    assert problems_of(text) == [
        "fleet.toml: several roots ('root' (line 4), 'other' (line 8)): "
        "exactly one agent has no master_id"
    ]


def test_an_unknown_master_is_named() -> None:
    stranger = uuid4()
    text = fleet_file(agent("root", ROOT), agent("coordinator", COORDINATOR, stranger))
    assert problems_of(text) == [
        f"fleet.toml:8: agent 'coordinator': master_id {stranger} is not a known agent"
    ]


def test_a_two_cycle_names_both_agents_and_lines() -> None:
    text = fleet_file(
        agent("root", ROOT),
        agent("a", SPECIALIST_A, SPECIALIST_B),
        agent("b", SPECIALIST_B, SPECIALIST_A),
    )
    assert problems_of(text) == [
        "fleet.toml:8: agent 'a': is on the master cycle 'a' -> 'b' -> 'a' "
        "and never reaches the root",
        "fleet.toml:13: agent 'b': is on the master cycle 'b' -> 'a' -> 'b' "
        "and never reaches the root",
    ]


def test_an_agent_below_a_cycle_is_told_so() -> None:
    text = fleet_file(
        agent("root", ROOT),
        agent("a", SPECIALIST_A, SPECIALIST_B),
        agent("b", SPECIALIST_B, SPECIALIST_A),
        agent("c", COORDINATOR, SPECIALIST_A),
    )
    assert (
        "fleet.toml:18: agent 'c': hangs below the master cycle 'a' -> 'b' -> 'a' "
        "and never reaches the root"
    ) in problems_of(text)


def test_a_cycle_without_any_root_is_reported_too() -> None:
    text = fleet_file(
        agent("a", SPECIALIST_A, SPECIALIST_B), agent("b", SPECIALIST_B, SPECIALIST_A)
    )
    problems = problems_of(text)
    assert len(problems) == 3
    assert problems[0] == "fleet.toml: no root: exactly one agent must have no master_id"
    assert problems[1].startswith("fleet.toml:4: agent 'a': is on the master cycle")


def test_an_agent_that_is_its_own_master_is_named() -> None:
    text = fleet_file(
        agent("root", ROOT),
        agent("narcissus", COORDINATOR, COORDINATOR),
        agent("echo", SPECIALIST_A, COORDINATOR),
    )
    assert problems_of(text) == ["fleet.toml:8: agent 'narcissus': is its own master"]


def test_unknown_keys_are_named() -> None:
    text = fleet_file(
        agent("root", ROOT),
        agent("coordinator", COORDINATOR, extra=f'mastr_id = "{ROOT}"\n'),
        operator=f'id = "{OPERATOR}"\nemail = "ops@example.com"',
    )
    problems = problems_of(text + "\n[broker]\nport = 1883\n")
    assert "fleet.toml: unknown section(s) broker" in problems
    assert "fleet.toml: [operator]: unknown key 'email'" in problems
    assert "fleet.toml:9: agent 'coordinator': unknown key 'mastr_id'" in problems
    # With master_id misspelt, the coordinator is a second root: said too.
    assert len(problems) == 4


@pytest.mark.parametrize(
    "roles",
    ['"examples.freelance:Coordinator"', '["Coordinator"]', '["a:b:C"]', "[1]", '["x:Y\\n"]'],
)
def test_roles_must_be_a_list_of_module_colon_class(roles: str) -> None:
    text = fleet_file(agent("root", ROOT, extra=f"roles = {roles}\n"))
    problems = problems_of(text)
    assert len(problems) == 1
    assert problems[0].startswith(
        "fleet.toml:4: agent 'root': roles must be a list of 'module:Class'"
    )


@pytest.mark.parametrize(
    "name", ["", "has space", "new\\nline", "root\\n", "-dash", "x" * 64, "ünï"]
)
def test_names_are_plain(name: str) -> None:
    text = fleet_file(agent(name, ROOT))
    assert any("name must be letters, digits" in p for p in problems_of(text))


@pytest.mark.parametrize("value", ["0", "-5", "true", "nan", "inf", '"15"'])
def test_heartbeat_interval_must_be_a_positive_number(value: str) -> None:
    text = fleet_file(agent("root", ROOT, extra=f"heartbeat_interval = {value}\n"))
    assert problems_of(text) == [
        "fleet.toml:4: agent 'root': heartbeat_interval must be a positive number"
    ]


def test_settings_must_be_a_table() -> None:
    text = fleet_file(agent("root", ROOT, extra='settings = "verbose"\n'))
    assert problems_of(text) == ["fleet.toml:4: agent 'root': settings must be a table"]


def test_the_operator_is_required_and_needs_a_uuid() -> None:
    text = fleet_file(agent("root", ROOT)).replace(f'[operator]\nid = "{OPERATOR}"\n', "")
    assert problems_of(text) == ["fleet.toml: missing [operator] section with the console's id"]
    text = fleet_file(agent("root", ROOT), operator='id = "console"')
    assert problems_of(text) == ["fleet.toml: [operator] id 'console' is not a UUID"]
    text = fleet_file(agent("root", ROOT), operator=f'id = "{OPERATOR}"\nname = "the boss"')
    assert problems_of(text) == ["fleet.toml: [operator] name 'the boss' is not a valid name"]


def test_an_agent_may_not_reuse_the_operator_id() -> None:
    text = fleet_file(agent("root", OPERATOR))
    assert problems_of(text) == ["fleet.toml:4: agent 'root': id is the operator's id"]


@pytest.mark.parametrize(
    ("reserved", "why"), [(WARROOM_ID, "the war room's id"), (UUID(int=0), "the nil UUID")]
)
def test_reserved_ids_are_refused(reserved: UUID, why: str) -> None:
    text = fleet_file(agent("root", reserved))
    assert problems_of(text) == [f"fleet.toml:4: agent 'root': id {reserved} is reserved ({why})"]
    text = fleet_file(agent("root", ROOT), operator=f'id = "{reserved}"')
    assert problems_of(text) == [f"fleet.toml: [operator] id {reserved} is reserved ({why})"]


def test_a_file_without_agents_is_refused() -> None:
    assert problems_of(f'[operator]\nid = "{OPERATOR}"\n') == ["fleet.toml: no [[agents]] declared"]
    assert problems_of(f'agents = [1]\n[operator]\nid = "{OPERATOR}"\n') == [
        "fleet.toml: agent #1 is not a table"
    ]


def test_invalid_toml_is_one_readable_problem() -> None:
    problems = problems_of(SEED.replace('name = "coordinator"', "name = coordinator"))
    assert len(problems) == 1
    assert problems[0].startswith("fleet.toml: not valid TOML: ")
    assert problems[0].endswith(f"(at line {line_of(SEED, 'coordinator') + 1}, column 8)")


def test_several_problems_are_reported_at_once() -> None:
    stranger = uuid4()
    text = fleet_file(
        agent("root", ROOT),
        agent("coordinator", "c00rdinator", ROOT),
        agent("specialist_a", SPECIALIST_A, stranger, extra='roles = ["Analyst"]\n'),
        agent("specialist_a", SPECIALIST_B, ROOT),
    )
    assert problems_of(text) == [
        "fleet.toml:8: agent 'coordinator': id 'c00rdinator' is not a UUID",
        "fleet.toml:13: agent 'specialist_a': roles must be a list of 'module:Class' "
        "(got ['Analyst'])",
        "fleet.toml:19: agent 'specialist_a': the name is already used by 'specialist_a' (line 13)",
        f"fleet.toml:13: agent 'specialist_a': master_id {stranger} is not a known agent",
    ]


def test_a_child_of_an_agent_with_other_problems_is_not_also_an_orphan() -> None:
    text = fleet_file(
        agent("root", ROOT),
        agent("coordinator", COORDINATOR, ROOT, extra="colour = 1\n"),
        agent("specialist_a", SPECIALIST_A, COORDINATOR),
    )
    assert problems_of(text) == ["fleet.toml:8: agent 'coordinator': unknown key 'colour'"]


def test_inline_agent_tables_are_validated_without_line_numbers() -> None:
    text = f'agents = [{{ name = "root", id = "nope" }}]\n[operator]\nid = "{OPERATOR}"\n'
    assert problems_of(text) == ["fleet.toml: agent 'root': id 'nope' is not a UUID"]


# --- reading the file -----------------------------------------------------------------------


def test_load_fleet_reads_a_file_and_names_it_in_problems(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(SEED)
    assert load_fleet(path) == parse_fleet(SEED)
    path.write_text(fleet_file(agent("root", "x")))
    with pytest.raises(FleetError) as caught:
        load_fleet(str(path))
    assert caught.value.problems == [f"{path}:4: agent 'root': id 'x' is not a UUID"]


def test_load_fleet_says_how_to_create_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    with pytest.raises(FleetError) as caught:
        load_fleet(path)
    assert caught.value.problems == [
        f"{path}: no such fleet file (create one with `vox init {path}`)"
    ]


def test_load_fleet_refuses_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="cannot read the fleet file"):
        load_fleet(tmp_path)
    binary = tmp_path / "fleet.toml"
    binary.write_bytes(b"\xff\xfe[operator]")
    with pytest.raises(FleetError, match="cannot read the fleet file"):
        load_fleet(binary)


@pytest.mark.parametrize(
    "name",
    ["6f1c2d3e-0000-4000-8000-00000000abcd", "deadbeef", "abcd", "1234", "a1b2-c3d4", "CAFE"],
)
def test_a_name_that_reads_as_an_id_is_refused(name: str) -> None:
    text = f'[operator]\nid = "{uuid4()}"\n[[agents]]\nname = "{name}"\nid = "{uuid4()}"\n'
    with pytest.raises(FleetError, match="the name reads as an id"):
        parse_fleet(text)


@pytest.mark.parametrize("name", ["abc", "node-deadbeef", "cafe_1x", "decade.s", "root", "spec_a"])
def test_names_with_a_letter_beyond_hex_or_under_four_digits_load(name: str) -> None:
    text = f'[operator]\nid = "{uuid4()}"\n[[agents]]\nname = "{name}"\nid = "{uuid4()}"\n'
    assert parse_fleet(text).root.name == name


def test_an_operator_name_that_reads_as_an_id_is_refused() -> None:
    text = (
        f'[operator]\nname = "beef"\nid = "{uuid4()}"\n[[agents]]\nname = "r"\nid = "{uuid4()}"\n'
    )
    with pytest.raises(FleetError, match="reads as an id"):
        parse_fleet(text)


def test_a_master_with_more_children_than_the_bound_is_refused() -> None:
    from vox_mqtt.protocol.hierarchy import MAX_CHILDREN

    root = uuid4()
    parts = [f'[operator]\nid = "{uuid4()}"\n[[agents]]\nname = "root"\nid = "{root}"\n']
    parts += [
        f'[[agents]]\nname = "c{i}"\nid = "{uuid4()}"\nmaster_id = "{root}"\n'
        for i in range(MAX_CHILDREN + 1)
    ]
    with pytest.raises(FleetError, match=f"{MAX_CHILDREN + 1} children, more than the"):
        parse_fleet("".join(parts))


def test_an_exact_id_wins_over_a_name() -> None:
    a, b = uuid4(), uuid4()
    # Built directly: the file itself refuses a name that reads as an id.
    fleet = Fleet(
        uuid4(),
        "operator",
        (
            AgentSpec(name="root", id=a, master_id=None),
            AgentSpec(name=str(a), id=b, master_id=a),
        ),
    )
    assert fleet.agent(str(a)).id == a
