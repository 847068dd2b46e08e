"""Roles the federation tests mount: one command per site that records each execution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vox_mqtt.agent.roles import Role, command


def _record(settings: Any, tag: str) -> None:
    # One line per execution: a test counts them to prove nothing ran twice.
    with Path(str(settings["tally_file"])).open("a", encoding="utf-8") as handle:
        handle.write(tag + "\n")


class TallyEast(Role):
    """`count_east`: served only on the east site."""

    @command
    async def count_east(self, tag: str) -> dict[str, Any]:
        _record(self.settings, tag)
        return {"tag": tag, "by": self.agent.name}


class TallyWest(Role):
    """`count_west`: served only on the west site."""

    @command
    async def count_west(self, tag: str) -> dict[str, Any]:
        _record(self.settings, tag)
        return {"tag": tag, "by": self.agent.name}
