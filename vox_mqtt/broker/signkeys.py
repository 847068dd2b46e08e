"""The fleet's signing keys: one Ed25519 key per identity, the operator's sealing key.

Kept in one 0600 file of the broker directory, `signing-keys.json`, beside the other
secrets `vox broker render` writes: made for every identity that lacks one, rotated one
identity at a time (the old public key is kept as retired, so ledgers that recorded its
signatures still verify). `vox agent render` hands each bundle only its own private key
and its master's and children's public keys (docs/security.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from vox_mqtt.broker.passwd import atomic_write
from vox_mqtt.protocol.boundedfile import read_regular
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.hierarchy import Fleet
from vox_mqtt.protocol.signing import SealKey, SigningKey

__all__ = ["KEYS_FILE", "FleetKeys", "ensure_keys", "load_keys", "rotate_key"]

KEYS_FILE: Final = "signing-keys.json"
_MAX_BYTES: Final = 64 * 1024 * 1024


@dataclass
class FleetKeys:
    """Every identity's current key, the retired public keys, the operator's sealing key."""

    current: dict[UUID, SigningKey] = field(default_factory=dict)
    retired: dict[UUID, list[bytes]] = field(default_factory=dict)  # public keys, oldest first
    seal: SealKey | None = None

    def to_json(self) -> str:
        """Return the file's text."""
        data: dict[str, Any] = {
            "identities": {
                str(identity): {
                    "seed": key.seed.hex(),
                    "retired": [public.hex() for public in self.retired.get(identity, [])],
                }
                for identity, key in sorted(self.current.items(), key=lambda item: str(item[0]))
            },
            "seal": None if self.seal is None else self.seal.private.hex(),
        }
        return json.dumps(data, indent=1) + "\n"


# The keys file last read, by path, with its (inode, mtime, size): read only, never changed.
_READ: dict[Path, tuple[tuple[int, int, int], FleetKeys]] = {}


def _path(broker_dir: str | Path) -> Path:
    return Path(broker_dir) / KEYS_FILE


def load_keys(broker_dir: str | Path) -> FleetKeys:
    """Read the keys file of a broker directory (empty when there is none yet).

    The keys last read are kept while the file is the same one (inode, mtime, size):
    `vox agent render` reads them twice per bundle, and making 10,000 keys from their
    seeds took a second (docs/performance.md, figure 7). The caller gets its own copy.
    """
    path = _path(broker_dir)
    try:
        st = path.stat()
    except FileNotFoundError:
        return FleetKeys()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the signing keys: {exc}"]) from None
    stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    kept = _READ.get(path)
    if kept is None or kept[0] != stamp:
        kept = (stamp, _read_keys(path))
        _READ.clear()  # one keys file at a time
        _READ[path] = kept
    keys = kept[1]
    retired = {owner: list(publics) for owner, publics in keys.retired.items()}
    return FleetKeys(current=dict(keys.current), retired=retired, seal=keys.seal)


def _read_keys(path: Path) -> FleetKeys:
    try:
        data = json.loads(read_regular(path, limit=_MAX_BYTES))
    except FileNotFoundError:
        return FleetKeys()
    except (OSError, ValueError) as exc:
        raise ConfigError([f"{path}: cannot read the signing keys: {exc}"]) from None
    try:
        keys = FleetKeys()
        for identity, entry in data["identities"].items():
            owner = UUID(identity)
            keys.current[owner] = SigningKey(bytes.fromhex(entry["seed"]))
            keys.retired[owner] = [bytes.fromhex(public) for public in entry["retired"]]
        if data.get("seal") is not None:
            keys.seal = SealKey(bytes.fromhex(data["seal"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError([f"{path}: not a signing keys file written by vox: {exc}"]) from None
    return keys


def _save(broker_dir: str | Path, keys: FleetKeys) -> None:
    atomic_write(_path(broker_dir), keys.to_json(), mode=0o600)


def ensure_keys(broker_dir: str | Path, fleet: Fleet, *, upstream: str | Path | None = None) -> int:
    """Make a key for each of the fleet's agents and its operator that has none; return how many.

    The operator also gets its sealing key. Keys of identities no longer in the fleet are
    kept: a retired agent's ledger rows still verify. A site broker of a federated fleet
    takes every key its upstream's directory holds (`--upstream-dir`), rotations included:
    one identity has one key across every broker (docs/security.md).
    """
    keys = load_keys(broker_dir)
    made = 0
    if upstream is not None and (Path(upstream) / KEYS_FILE).is_file():
        fleetwide = load_keys(upstream)
        taken = {i: k for i, k in fleetwide.current.items() if keys.current.get(i) != k}
        keys.current.update(fleetwide.current)
        keys.retired.update(fleetwide.retired)
        made += len(taken) + (fleetwide.seal != keys.seal)
        keys.seal = fleetwide.seal or keys.seal
    for identity in (fleet.operator_id, *(agent.id for agent in fleet)):
        if identity not in keys.current:
            keys.current[identity] = SigningKey.generate()
            made += 1
    if keys.seal is None:
        keys.seal = SealKey.generate()
        made += 1
    if made:
        _save(broker_dir, keys)
    return made


def rotate_key(broker_dir: str | Path, fleet: Fleet, name: str) -> tuple[str, str]:
    """Give one identity (an agent's name, or the operator's) a new key; return (old, new) ids.

    Its master and children believe the new key once they have their new bundles and a
    SIGHUP; from then on the old one is refused (docs/security.md, rotation).
    """
    if name in ("operator", fleet.operator_name):
        identity = fleet.operator_id
    else:
        try:
            identity = fleet.agent(name).id
        except KeyError:
            known = ", ".join(sorted(agent.name for agent in fleet))
            raise ConfigError([f"--rotate {name}: no such agent (agents: {known})"]) from None
    ensure_keys(broker_dir, fleet)
    keys = load_keys(broker_dir)
    old = keys.current[identity]
    keys.retired.setdefault(identity, []).append(old.public)
    keys.current[identity] = new = SigningKey.generate()
    _save(broker_dir, keys)
    return old.kid, new.kid
