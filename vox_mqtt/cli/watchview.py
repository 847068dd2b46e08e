"""`vox watch`: the fleet live, from the operator's console when one runs, else a look.

One frame of the watch is plain data made from a fleet observer (`watch_frame`): who
looks, since when its link to the broker is down (None: up), each agent's change key
(state, code, refused, open incidents) and, for the agents asked for, its line in the
tree's order; or the counts when the fleet is too big to list (observe/summary.py). The
operator's console makes it from its live view (`/v1/watch`, cli/console.py), a look of
its own from its observer, and `print_lines` prints either into a pipe alike. On a
terminal the tree is drawn (`status_tree`), by the console for the terminal's width or
by the look itself (docs/operations.md, "Watch the fleet").
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from ._ask import ask_console, ask_running
from ._common import EXIT_RUNTIME, config_path, stdout_is_terminal

__all__ = ["cmd_watch", "print_lines", "watch_frame", "watch_text"]

Frame = dict[str, Any]
# Frames of a look or of the console: None asks every agent's line, a list those agents'.
Fetch = Callable[[Sequence[str] | None], Awaitable[Frame | None]]

_PAUSE = 0.5  # seconds between two frames


def cmd_watch(args: argparse.Namespace) -> int:
    """Show a live tree of the fleet until interrupted or --duration has passed.

    On a terminal the tree is redrawn in place, each line within its width; into a pipe
    (`vox watch | cat`, under `timeout`) it prints plain lines: the fleet once, then a
    line for each agent whose state, code or open incidents change (docs/operations.md).
    With the operator's config and a console running, the console's live view is drawn:
    no login of the watch's own.
    """
    terminal = stdout_is_terminal()
    first = ask_console(args.config, "/v1/watch", _body(terminal, None, []))
    if first is None:
        return _look(args)
    config = config_path(args.config)
    deadline = None if args.duration is None else time.monotonic() + args.duration

    async def fetch(body: dict[str, Any]) -> Frame | None:
        found = ask_running(config, "/v1/watch", body)
        return None if found is None or found[0] != 200 else found[1]

    async def run() -> bool:
        if terminal:
            return await _draw_from_console(fetch, deadline)
        return await print_lines(lambda ids: fetch(_body(False, None, ids)), deadline)

    if not asyncio.run(run()):
        print("vox watch: the operator's console stopped answering", file=sys.stderr)
        return EXIT_RUNTIME
    return 0


def _body(terminal: bool, width: int | None, ids: Sequence[str] | None) -> dict[str, Any]:
    if terminal:
        return {"plain": False, "width": width, "color": True}
    return {"plain": True, "lines": None if ids is None else list(ids)}


async def _draw_from_console(
    fetch: Callable[[dict[str, Any]], Awaitable[Frame | None]], deadline: float | None
) -> bool:
    """Redraw the console's text of the tree in place; False once the console is gone."""
    from rich.live import Live
    from rich.text import Text

    from ._common import out_console

    console = out_console()

    async def text() -> Text | None:
        found = await fetch(_body(True, console.width, None))
        return None if found is None else Text.from_ansi(str(found.get("text", "")))

    shown = await text()
    if shown is None:
        return False
    with Live(shown, console=console, refresh_per_second=2) as live:
        while deadline is None or time.monotonic() < deadline:
            await asyncio.sleep(_PAUSE)
            shown = await text()
            if shown is None:
                return False
            live.update(shown)
    return True


def _clock() -> str:
    return datetime.now().strftime("%H:%M:%S")


async def print_lines(
    fetch: Fetch, deadline: float | None, say: Callable[[str], None] | None = None
) -> bool:
    """Print the fleet as plain lines, then one line per change, each flushed at once.

    While the link to the broker is down nothing is known: the banner, then every agent
    "unknown since"; once it is back, the fleet again as it is then. False once `fetch`
    has nothing more to give (the console stopped).
    """
    from .statusview import link_banner

    def out(line: str) -> None:
        print(line, flush=True)

    tell = say or out

    def whole(frame: Frame) -> dict[str, Any]:
        if frame.get("summary"):
            for text in frame["summary"]:
                tell(f"{_clock()} {text}")
        else:
            for _, depth, line in frame["lines"]:
                tell(f"{_clock()} {'  ' * int(depth)}{line}")
        return dict(frame["keys"])

    frame = await fetch(None)
    if frame is None:
        return False
    tell(f"{_clock()} vox watch: {frame['count']} agent(s) as seen by {frame['who']}")
    down: str | None = frame.get("down_since")
    if down is not None:
        tell(f"{down} {link_banner(down)}")
    said = whole(frame)
    while deadline is None or time.monotonic() < deadline:
        await asyncio.sleep(_PAUSE)
        frame = await fetch([])
        if frame is None:
            return False
        since = frame.get("down_since")
        if since is not None:
            if down is None:
                down = since
                tell(f"{since} {link_banner(since)}")
                everything = await fetch(None)
                if everything is None:
                    return False
                whole(everything)
            continue
        if down is not None:
            down = None
            tell(f"{_clock()} broker link back")
            everything = await fetch(None)
            if everything is None:
                return False
            said = whole(everything)
            continue
        changed = [i for i, key in frame["keys"].items() if said.get(i) != key]
        if not changed:
            continue
        lines = await fetch(changed)
        if lines is None:
            return False
        for agent, _, line in lines["lines"]:
            said[agent] = lines["keys"].get(agent)
            tell(f"{_clock()} {line}")
    return True


def watch_frame(
    reader: Any,
    observer: Any,
    links: Any,
    down_since: str | None,
    lines_for: Sequence[str] | None,
) -> Frame:
    """Return one frame of the watch from an observer (see the module's doc).

    `lines_for`: the agents whose lines to give (None: every agent's, and the counts
    instead when the fleet is too big to list).
    """
    from vox_mqtt.console.safetext import plain
    from vox_mqtt.observe.summary import SUMMARY_ABOVE

    from .statusview import _tree_order, fleet_summary, open_incidents, shown_agents, watch_label

    seen = shown_agents(observer)
    agents = {a.id: a for a in (seen if links is None else links.overlay(seen))}
    incidents = list(observer.incidents.values())
    now = time.monotonic()
    keys = {
        str(entry.id): [
            entry.status,
            entry.error_code,
            entry.misbehaving(now),
            open_incidents(entry, incidents),
        ]
        for entry in agents.values()
    }
    frame: Frame = {
        "who": f"{plain(reader.name)} ({reader.kind})",
        "down_since": down_since,
        "count": len(agents),
        "keys": keys,
        "lines": [],
    }
    if lines_for is None and len(agents) > SUMMARY_ABOVE:
        summary = fleet_summary(agents.values(), links, now).lines()
        if down_since is not None:
            summary = [f"{len(agents)} agents, every one unknown since {down_since}"]
        frame["summary"] = summary
        return frame
    wanted = None if lines_for is None else set(lines_for)
    if wanted is not None and not wanted:
        return frame  # the keys only: nothing to lay out (most frames of a quiet fleet)
    for depth, entry in _tree_order(reader, observer, agents):
        if wanted is not None and str(entry.id) not in wanted:
            continue
        _, head, tail = watch_label(entry, incidents, now, None, unknown_since=down_since)
        frame["lines"].append([str(entry.id), depth, head + tail])
    return frame


def watch_text(
    reader: Any, observer: Any, links: Any, width: int | None, color: bool, down_since: str | None
) -> str:
    """Return the watch's tree as a terminal shows it, `width` cells wide (ANSI if color)."""
    import io

    from rich.console import Console
    from rich.text import Text

    from .statuslayout import cut
    from .statusview import link_banner, status_tree

    out = io.StringIO()
    console = Console(
        file=out, width=width or 100, highlight=False, emoji=False, force_terminal=color
    )
    if down_since is not None:
        # The banner first: every row below is what is not known (docs/operations.md).
        console.print(Text(cut(link_banner(down_since), width or 100), style="bold red"))
    console.print(status_tree(reader, observer, links, width, unknown_since=down_since))
    return out.getvalue()


def _look(args: argparse.Namespace) -> int:
    """Watch from a look of one's own: its own read-only login (cli/looks.py)."""
    from .looks import load_reader, observing

    reader = load_reader(args.config, "watch")
    links = reader.link_watch()
    terminal = stdout_is_terminal()

    async def run() -> int:
        async with observing(reader, warroom=reader.warroom, links=links) as look:
            await look.settled(1.0)  # then drawn live: whatever comes later shows as it comes
            deadline = None if args.duration is None else time.monotonic() + args.duration
            observer = look.observer
            down_since: str | None = None  # the look's link to the broker is down since

            def now_down() -> str | None:
                nonlocal down_since
                if not look.session.connected:
                    down_since = down_since or _clock()
                else:
                    down_since = None
                    observer.view.refresh()
                return down_since

            if not terminal:

                async def fetch(ids: Sequence[str] | None) -> Frame:
                    return watch_frame(reader, observer, links, now_down(), ids)

                await print_lines(fetch, deadline)
                return 0
            await _draw_look(reader, observer, links, now_down, deadline)
        return 0

    return asyncio.run(run())


async def _draw_look(
    reader: Any,
    observer: Any,
    links: Any,
    now_down: Callable[[], str | None],
    deadline: float | None,
) -> None:
    from rich.console import Group, RenderableType
    from rich.live import Live
    from rich.text import Text

    from ._common import out_console
    from .statuslayout import cut
    from .statusview import link_banner, status_tree

    console = out_console()

    def frame(down_since: str | None) -> RenderableType:
        width = console.width
        tree = status_tree(reader, observer, links, width, unknown_since=down_since)
        if down_since is None:
            return tree
        # The banner first: every row below is what is not known (docs/operations.md).
        return Group(Text(cut(link_banner(down_since), width), style="bold red"), tree)

    with Live(frame(None), console=console, refresh_per_second=2) as live:
        while deadline is None or time.monotonic() < deadline:
            await asyncio.sleep(_PAUSE)
            live.update(frame(now_down()))
