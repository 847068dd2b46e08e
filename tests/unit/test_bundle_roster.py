"""The roster a signed bundle carries: every identity's name, and the masters that bundle
may know (docs/security.md, F26)."""

from __future__ import annotations

import getpass
from pathlib import Path
from uuid import uuid4

from vox_mqtt.broker.render import render_broker_dir
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.fleet.config import load_console_config, load_daemon_config
from vox_mqtt.protocol.hierarchy import parse_fleet

SHAPE = {"root": None, "coord": "root", "spec_a": "coord", "other": "root"}


def test_the_operator_knows_every_master_and_an_agent_only_its_own_and_its_childrens(
    tmp_path: Path,
) -> None:
    ids = {name: uuid4() for name in SHAPE}
    operator = uuid4()
    parts = ['signatures = "require"\n', f'[operator]\nname = "alice"\nid = "{operator}"\n']
    for name, master in SHAPE.items():
        lines = [f'[[agents]]\nname = "{name}"\nid = "{ids[name]}"']
        if master is not None:
            lines.append(f'master_id = "{ids[master]}"')
        parts.append("\n".join(lines) + "\n")
    fleet = parse_fleet("\n".join(parts))
    broker = render_broker_dir(fleet, tmp_path / "broker", port=1884, run_as_user=getpass.getuser())

    out = tmp_path / "op" / "operator.toml"
    render_agent_config(fleet, "alice", broker.root, out, tmp_path / "state")
    console = load_console_config(out)
    assert console.signing is not None
    roster = console.signing.signing(out.parent).roster
    assert roster[ids["spec_a"]] == ("spec_a", ids["coord"])
    assert roster[ids["root"]] == ("root", operator)
    assert roster[operator] == ("alice", None)

    out = tmp_path / "coord" / "coord.toml"
    render_agent_config(fleet, "coord", broker.root, out, tmp_path / "state")
    daemon = load_daemon_config(out)
    assert daemon.signing is not None
    roster = daemon.signing.signing(out.parent).roster
    # Its own master and its children's (itself); nothing above its master.
    assert roster == {
        ids["coord"]: ("coord", ids["root"]),
        ids["root"]: ("root", None),
        ids["spec_a"]: ("spec_a", ids["coord"]),
    }
