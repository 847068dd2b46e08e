"""Roles the storm tests mount: one command per site that records each execution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vox_mqtt.agent.roles import Role, command


def _record(settings: Any, tag: str) -> dict[str, Any]:
    # One line per execution: a test counts them to prove nothing ran twice.
    with Path(str(settings["tally_file"])).open("a", encoding="utf-8") as handle:
        handle.write(tag + "\n")
    return {"tag": tag}


class CountSite0(Role):
    """`count_site_0`: served only on site-0."""

    @command
    async def count_site_0(self, tag: str) -> dict[str, Any]:
        return _record(self.settings, tag)


class CountSite1(Role):
    """`count_site_1`: served only on site-1."""

    @command
    async def count_site_1(self, tag: str) -> dict[str, Any]:
        return _record(self.settings, tag)


class CountSite2(Role):
    """`count_site_2`: served only on site-2."""

    @command
    async def count_site_2(self, tag: str) -> dict[str, Any]:
        return _record(self.settings, tag)
