"""`vox mcp`: the fleet as an MCP server over stdio, a client of the operator's console.

The server itself is cli/_mcpserver.py, imported only when this verb runs: no other verb
pays for the MCP SDK's import (docs/mcp.md).
"""

from __future__ import annotations

import argparse

from ._common import add_config_option, config_path

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `vox mcp`."""
    parser = subparsers.add_parser(
        "mcp", help="serve the fleet to an MCP client over stdio, through the operator's console"
    )
    add_config_option(parser, agent_too=False)
    parser.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve MCP over stdio until the client closes it."""
    config = config_path(args.config)
    if not config.is_file():
        from vox_mqtt.protocol.errors import ConfigError

        raise ConfigError([f"{config}: no such config file"])
    import asyncio

    from ._home import state_dir_of
    from ._mcpserver import build_server

    state_dir_of(config)  # a config that does not load is one line now, not each tool's error

    server = build_server(config)
    asyncio.run(server.run_stdio_async())
    return 0
