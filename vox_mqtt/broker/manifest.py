"""What `vox broker render` wrote and how it was told to: the broker directory's manifest.

`render.json` holds the render options (so re-rendering with no options reproduces
the broker), the SHA-256 of every file the broker reads (so `vox broker reload`
installs only what render wrote, unless told to accept a hand edit: docs/broker.md), and
a record of the fleet it was rendered from (its operator's id, each agent's name and id),
which `vox fleet retire` checks the fleet file it is given against.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Final, Literal

from vox_mqtt.broker.passwd import atomic_write
from vox_mqtt.protocol.errors import ConfigError

__all__ = [
    "MANIFEST_NAME",
    "FleetRecord",
    "Manifest",
    "RenderOptions",
    "file_digest",
    "load_manifest",
    "resolve_options",
    "write_manifest",
]

MANIFEST_NAME: Final = "render.json"
_VERSION: Final = 1
Format = Literal["acl", "dynsec"]


@dataclass(frozen=True, kw_only=True)
class RenderOptions:
    """Everything `vox broker render` was told, besides the fleet file."""

    host: str = "127.0.0.1"
    bind: str | None = None
    port: int = 1883
    tls_port: int = 8883
    fmt: Format = "acl"
    pki: str | None = None
    # The read-only explorers' identity names (`explorer`, `explorer-NAME`): kept by every
    # re-render until --no-explorer (docs/broker.md).
    explorers: tuple[str, ...] = ()
    user: str | None = None
    lock_client_ids: bool = True
    # One broker of a federated fleet (docs/federation.md): which, and its upstream's folder.
    broker: str | None = None
    upstream_dir: str | None = None
    bridge_keepalive: int = 10


@dataclass(frozen=True, kw_only=True)
class FleetRecord:
    """The fleet a broker directory was rendered from: its operator, its agents' ids."""

    operator_id: str
    agents: Mapping[str, str]  # name -> id


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """The render options, the digest of each broker file, and the canary's topic nonce."""

    options: RenderOptions
    files: Mapping[str, str]
    canary_nonce: str | None = None
    accepted_edits: tuple[str, ...] = ()
    fleet: FleetRecord | None = None  # None in a directory rendered before it was kept


def file_digest(data: bytes) -> str:
    """Return the digest the manifest records for a file's bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def load_manifest(root: Path) -> Manifest | None:
    """Return the manifest of a broker directory, None if there is none; ConfigError if bad."""
    path = root / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError([f"{path}: unreadable manifest ({exc}): re-render the broker"]) from None
    try:
        if data.get("version") != _VERSION:
            raise ValueError(f"version {data.get('version')!r}")
        options = _options(data["options"])
        files = {str(k): str(v) for k, v in data["files"].items()}
        nonce = data.get("canary_nonce")
        edits = tuple(str(e) for e in data.get("accepted_edits", []))
        record = data.get("fleet")
        fleet = (
            None
            if record is None
            else FleetRecord(
                operator_id=str(record["operator_id"]),
                agents={str(k): str(v) for k, v in record["agents"].items()},
            )
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError([f"{path}: not a manifest this version reads ({exc})"]) from None
    return Manifest(
        options=options,
        files=files,
        canary_nonce=None if nonce is None else str(nonce),
        accepted_edits=edits,
        fleet=fleet,
    )


def _options(data: Mapping[str, Any]) -> RenderOptions:
    """Return the render options a manifest holds (one of an older version's too)."""
    known = {f.name for f in fields(RenderOptions)}
    chosen = {k: v for k, v in data.items() if k in known}
    if "explorers" in chosen:
        chosen["explorers"] = tuple(str(name) for name in chosen["explorers"])
    elif data.get("explorer") is True:
        # Rendered before explorers had names: its one explorer is the unnamed `explorer`.
        chosen["explorers"] = ("explorer",)
    return RenderOptions(**chosen)


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Write render.json atomically (0644: it holds digests, no secret)."""
    document: dict[str, Any] = {
        "version": _VERSION,
        "generated_by": "vox broker render",
        "options": asdict(manifest.options),
        "files": dict(sorted(manifest.files.items())),
        "canary_nonce": manifest.canary_nonce,
        "accepted_edits": list(manifest.accepted_edits),
    }
    if manifest.fleet is not None:
        document["fleet"] = {
            "operator_id": manifest.fleet.operator_id,
            "agents": dict(sorted(manifest.fleet.agents.items())),
        }
    atomic_write(root / MANIFEST_NAME, json.dumps(document, indent=1) + "\n", mode=0o644)


def resolve_options(
    given: Mapping[str, Any], previous: RenderOptions | None
) -> tuple[RenderOptions, list[str]]:
    """Merge options given now over the ones remembered; return them and what changed.

    A value given as None means "not given": it keeps what the manifest remembers
    (or the default for a first render).
    """
    base = previous or RenderOptions()
    chosen = {k: v for k, v in given.items() if v is not None}
    options = replace(base, **chosen)
    if previous is None:
        return options, []
    changes = [
        f"{name}: {getattr(previous, name)!r} -> {getattr(options, name)!r}"
        for name in (f.name for f in fields(RenderOptions))
        if getattr(previous, name) != getattr(options, name)
    ]
    return options, changes
