"""The explorer's config file: a login that may only read (`vox status`, `vox exporter`)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, ValidationError

from vox_mqtt.fleet.config import BrokerSection, SigningSection
from vox_mqtt.protocol.errors import ConfigError

__all__ = ["ExplorerFile", "ExplorerSection", "load_explorer_config"]


class ExplorerSection(BaseModel):
    """Who the explorer is and whose fleet it reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "explorer"
    id: UUID
    operator_id: UUID  # the root's master, named in the root's status
    operator_name: str = "operator"


class ExplorerFile(BaseModel):
    """The explorer's config file: `[explorer]` and `[broker]`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["explorer"] = "explorer"
    explorer: ExplorerSection
    broker: BrokerSection
    signing: SigningSection | None = None  # every agent's public key (docs/security.md)


def load_explorer_config(path: str | Path) -> ExplorerFile:
    """Read and validate an explorer config; raise ConfigError with one line per problem."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such config file"]) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read the config file: {exc}"]) from None
    try:
        return ExplorerFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            [
                f"{path}: {'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                for e in exc.errors(include_url=False)
            ]
        ) from None
