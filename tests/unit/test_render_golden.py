"""A render's bytes, pinned: every file `vox broker render` and `vox agent render` write.

A small fleet (the root listed last) rendered with fixed secrets and salts must give the
same bytes as the renderer before figure 7's cuts (docs/performance.md, figure 7): acl,
passwd, dynsec.json, the credential store, policy.json, render.json, mosquitto.conf,
last-good/ and the bundles. A change of what is rendered fails here by file name; one
meant on purpose updates GOLDEN with the reason in its commit.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import secrets
from pathlib import Path
from uuid import UUID

import pytest

from vox_mqtt.broker.federation import write_link_map
from vox_mqtt.broker.policy import Probe, policy_text
from vox_mqtt.broker.render import render_broker_dir
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.protocol.hierarchy import parse_fleet

# The first 40 hex digits of each file's sha256, the folder's path replaced by TMP, as the
# renderer of commit 8323385 wrote them; mosquitto.conf since its queue is sized to the
# fleet (broker/render.py, queue_limits: max_queued_messages 1,056 for these 14 agents);
# render.json since it keeps the explorers by name ("explorers": ["explorer"], issue 38).
GOLDEN = {
    "acl-first/acl": "da1ac354796f212f1709f1826ff1dd69374ac16c",
    "acl-first/credentials/secrets.json": "fd51b40fb9c716aaf692266537935ef723ca16a9",
    "acl-first/mosquitto.conf": "a7839dfe55e746d98cc48e183b16a4b456eca8ac",
    "acl-first/passwd": "6ca1a708b4806d58d7b480d01636f04f7e3907e9",
    "acl-first/policy.json": "1cfe2130840e22b7d98b6999679a6c36fc51459c",
    "acl-first/render.json": "5ebda2f770ba1bc4ecd2cf5b3a25bd83ddcb9d8b",
    "acl-again/acl": "da1ac354796f212f1709f1826ff1dd69374ac16c",
    "acl-again/credentials/secrets.json": "d2dc324d0dbc651447677cb53335b92b5cd1060b",
    "acl-again/last-good/acl": "da1ac354796f212f1709f1826ff1dd69374ac16c",
    "acl-again/last-good/passwd": "6ca1a708b4806d58d7b480d01636f04f7e3907e9",
    "acl-again/mosquitto.conf": "a7839dfe55e746d98cc48e183b16a4b456eca8ac",
    "acl-again/passwd": "e5a5abd1b028e9c2004626c0385ad8e4086c0828",
    "acl-again/policy.json": "1cfe2130840e22b7d98b6999679a6c36fc51459c",
    "acl-again/render.json": "f64206f982c4ddf904f0eb2107e8fcdc9ba63f89",
    "dynsec/credentials/secrets.json": "11c3cea30c129c968b25956516e6ee2875576c1f",
    "dynsec/dynsec.json": "65a4b7f6a52ae490527f5cef2057d5e2d0c2d1fb",
    "dynsec/mosquitto.conf": "b86e1d9e2536ecd699a4cb90b87fa27dc238b1ba",
    "dynsec/policy.json": "e577c0cdc2091c8b481aa55776dd9c08c4490353",
    "dynsec/render.json": "2477696decabedf4f99d96384137a7474ba2a82e",
    "bundles/agent-0.credentials.toml": "1554ff04fcbf6215a928ff6c79c5d42f3ceb042c",
    "bundles/agent-0.toml": "7037f20f0efd441351d2bb7a96c562fe26c7eee9",
    "bundles/agent-13.credentials.toml": "bd4544e643a8838fb852e24b62d00bc7f90c5e53",
    "bundles/agent-13.toml": "18e66cef64c6ac57aa60a610b4b162f988772f19",
    "bundles/agent-4.credentials.toml": "86c8b0dbbd4f310c74461581f152038f1795f2fb",
    "bundles/agent-4.toml": "a21b118a722b9e81cfd63cd70235671470a8e92c",
    "bundles/explorer.credentials.toml": "1a4d9f636aa6f713e05020dcbec4baad217e498e",
    "bundles/explorer.toml": "205de377770ac0f50dca8309f6312b7a99bcd8f8",
    "bundles/operator.credentials.toml": "1b061127f0d6c07a3ee41f9cc05d946a838c7ab8",
    "bundles/operator.toml": "720a8e82297d3fee391be83505c2c45bdd065eac",
}


def _fleet_text() -> str:
    rng = random.Random(27)
    ids = [UUID(int=rng.getrandbits(128), version=4) for _ in range(14)]
    operator = UUID(int=rng.getrandbits(128), version=4)
    parts = [f'signatures = "off"\n[operator]\nname = "operator"\nid = "{operator}"\n']
    for index in reversed(range(14)):  # the root last: nothing may assume it comes first
        master = "" if index == 0 else f'master_id = "{ids[(index - 1) // 3]}"\n'
        parts.append(f'[[agents]]\nname = "agent-{index}"\nid = "{ids[index]}"\n{master}')
    return "\n".join(parts)


def _digests(tmp: Path, root: Path, label: str) -> dict[str, str]:
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes().replace(str(tmp).encode(), b"TMP")
        if path.name == "render.json":  # the conf's digest covers the folder's path
            data = re.sub(rb'"mosquitto.conf": "sha256:[0-9a-f]+"', b"", data)
        out[f"{label}/{path.relative_to(root)}"] = hashlib.sha256(data).hexdigest()[:40]
    return out


def test_a_render_gives_the_pinned_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    monkeypatch.setattr(secrets, "token_bytes", lambda n=32: rng.randbytes(n))
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n=32: rng.randbytes(n).hex())
    fleet = parse_fleet(_fleet_text())
    found: dict[str, str] = {}
    acl = tmp_path / "acl"
    render_broker_dir(fleet, acl, port=18830, run_as_user="nobody", explorer=True)
    found |= _digests(tmp_path, acl, "acl-first")
    # Kept secrets (their hashes verified and kept), one rotated, last-good/ seeded.
    render_broker_dir(
        fleet, acl, port=18830, run_as_user="nobody", explorer=True, rotate_names=("agent-4",)
    )
    found |= _digests(tmp_path, acl, "acl-again")
    render_broker_dir(
        fleet, tmp_path / "dyn", port=18830, run_as_user="nobody", explorer=True, fmt="dynsec"
    )
    found |= _digests(tmp_path, tmp_path / "dyn", "dynsec")
    for name in ("agent-0", "agent-4", "agent-13", "operator", "explorer"):
        rendered = render_agent_config(
            fleet, name, tmp_path / "acl", tmp_path / "b" / f"{name}.toml"
        )
        write_link_map(fleet, rendered.name, rendered.config)
    found |= _digests(tmp_path, tmp_path / "b", "bundles")
    changed = sorted(
        name for name in GOLDEN.keys() | found.keys() if GOLDEN.get(name) != found.get(name)
    )
    assert not changed, f"rendered bytes changed: {changed}"


@pytest.mark.parametrize(
    "probes",
    [
        (),
        (Probe("u", "n", "vox/a/status", False, True),),
        (
            Probe('a"b', "é\\x", "vox/\x01/\u2028", True, False),
            Probe('a"b', "é\\x", "t", False, True),
            Probe("c", "d", "vox/+/#", True, True),
            Probe('a"b', "é\\x", "", False, False),
        ),
    ],
)
def test_policy_text_is_json_dumps_of_the_rows(probes: tuple[Probe, ...]) -> None:
    rows = [[p.user, p.name, p.topic, "w" if p.write else "r", p.allowed] for p in probes]
    expected = json.dumps({"version": 1, "probes": rows}, separators=(",", ":"))
    assert policy_text(probes) == expected
