"""`vox broker render|reload` and `vox pki init`: the fleet broker's security, from the tree."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TypeVar

from ..brokerconf import DEFAULT_USER, reload_broker, render_broker_dir
from ..errors import ConfigError
from ..federation import bridge_for, broker_spec
from ..hierarchy import load_fleet
from ..pki import DEFAULT_DAYS, init_pki
from ._common import err_console, out_console, print_json

_T = TypeVar("_T")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the broker and pki verbs."""
    broker = subparsers.add_parser("broker", help="render and reload the fleet broker's security")
    verbs = broker.add_subparsers(dest="broker_verb", metavar="ACTION", required=True)

    render = verbs.add_parser(
        "render",
        help="write mosquitto.conf, ACL, passwd and per-identity credentials from a fleet file",
    )
    render.add_argument("fleet", type=Path, help="the fleet file (TOML)")
    render.add_argument("--out", type=Path, required=True, help="broker directory to write")
    render.add_argument(
        "--host", help="address clients connect to (default 127.0.0.1, or the broker's host)"
    )
    render.add_argument("--bind", help="address the listener binds (default: --host)")
    render.add_argument("--port", type=int, help="plain MQTT port (default 1883, or the broker's)")
    render.add_argument("--tls-port", type=int, help="TLS port with --pki (default 8883)")
    render.add_argument(
        "--broker",
        help="in a fleet with [[brokers]]: the one broker to render (its clients, "
        "ACL and, for a site, its bridge upstream)",
    )
    render.add_argument(
        "--upstream-dir",
        type=Path,
        help="for a site broker: the directory its upstream broker was rendered into "
        "(the bridge's credentials come from there)",
    )
    render.add_argument(
        "--bridge-keepalive",
        type=int,
        default=10,
        help="seconds between a bridge's pings: a cut link shows within 1.5x this (default 10)",
    )
    render.add_argument("--format", choices=("acl", "dynsec"), default="acl", dest="fmt")
    render.add_argument("--pki", type=Path, help="PKI dir from `vox pki init`: adds TLS")
    render.add_argument("--rotate", action="store_true", help="issue new secrets for everyone")
    render.add_argument(
        "--explorer", action="store_true", help="add a read-only identity that reads vox/#"
    )
    render.add_argument(
        "--user",
        help=f"user mosquitto drops privileges to (default {DEFAULT_USER}; "
        "use your own user for a broker you start yourself)",
    )
    render.add_argument(
        "--lock-client-ids",
        action="store_true",
        help="force client id = username (no identity can take over another's session, but "
        "a second connection of one identity, e.g. two consoles, kicks the first)",
    )
    render.add_argument("--json", action="store_true", help="print what was written as JSON")
    render.set_defaults(func=cmd_render)

    reload = verbs.add_parser(
        "reload", help="validate the ACL like Mosquitto does, install it atomically, SIGHUP"
    )
    reload.add_argument("dir", type=Path, help="broker directory written by `vox broker render`")
    target = reload.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=int, help="mosquitto's process id")
    target.add_argument("--pid-file", type=Path, help="file holding mosquitto's process id")
    reload.add_argument("--acl", type=Path, help="new ACL to validate and install first")
    reload.set_defaults(func=cmd_reload)

    pki = subparsers.add_parser("pki", help="certificates for the broker and every identity")
    pki_verbs = pki.add_subparsers(dest="pki_verb", metavar="ACTION", required=True)
    init = pki_verbs.add_parser(
        "init", help="make (or complete) a CA, a server cert and a client cert per identity"
    )
    init.add_argument("dir", type=Path, help="PKI directory")
    init.add_argument("fleet", type=Path, help="the fleet file (TOML)")
    init.add_argument(
        "--host",
        action="append",
        default=[],
        help="broker name or address for the server certificate (repeatable)",
    )
    init.add_argument("--explorer", action="store_true", help="also certify the explorer")
    init.add_argument("--days", type=int, default=DEFAULT_DAYS, help="validity of new certs")
    init.set_defaults(func=cmd_pki_init)


def _given(value: _T | None, default: _T) -> _T:
    return default if value is None else value


def cmd_render(args: argparse.Namespace) -> int:
    """Render the broker directory from the fleet file."""
    fleet = load_fleet(args.fleet)
    spec = None if args.broker is None else broker_spec(fleet, args.broker)
    if not 5 <= args.bridge_keepalive <= 65535:
        raise ConfigError([f"--bridge-keepalive must be 5 or more (got {args.bridge_keepalive})"])
    result = render_broker_dir(
        fleet,
        args.out,
        host=_given(args.host, spec.host if spec else "127.0.0.1"),
        bind=args.bind,
        port=_given(args.port, spec.port if spec else 1883),
        tls_port=_given(args.tls_port, spec.tls_port if spec else 8883),
        broker=args.broker,
        upstream_dir=args.upstream_dir,
        bridge_keepalive=args.bridge_keepalive,
        fmt=args.fmt,
        pki_dir=args.pki,
        rotate=args.rotate,
        explorer=args.explorer,
        run_as_user=args.user,
        lock_client_ids=args.lock_client_ids,
    )
    for warning in result.warnings:
        err_console().print(f"vox: warning: {warning}", markup=False)
    bridge = None if args.broker is None else bridge_for(fleet, args.broker)
    names = sorted(k for k in result.credentials if isinstance(k, str))
    security = result.acl if result.acl is not None else result.dynsec
    if args.json:
        print_json(
            {
                "dir": str(result.root),
                "conf": str(result.conf),
                "format": result.fmt,
                "security": str(security),
                "passwd": None if result.passwd is None else str(result.passwd),
                "host": result.host,
                "port": result.port,
                "tls_port": result.tls_port,
                "credentials": {name: str(result.credentials[name]) for name in names},
                "warnings": list(result.warnings),
                "broker": args.broker,
                "bridge": None
                if bridge is None
                else {
                    "conf": str(result.root / "bridge" / "bridge.conf"),
                    "upstream": bridge.upstream,
                    "out": list(bridge.out_topics),
                    "in": list(bridge.in_topics),
                },
            }
        )
        return 0
    console = out_console()
    console.print(f"wrote {result.conf}", markup=False)
    console.print(f"wrote {security} ({result.fmt})", markup=False)
    if result.passwd is not None:
        console.print(f"wrote {result.passwd}", markup=False)
    console.print(
        f"wrote {len(names)} credentials files in {result.root / 'credentials'} (0600)",
        markup=False,
    )
    if bridge is not None:
        console.print(
            f"wrote {result.root / 'bridge' / 'bridge.conf'} (0600): bridge to "
            f"{bridge.upstream!r}, {len(bridge.out_topics)} topic(s) up, "
            f"{len(bridge.in_topics)} down",
            markup=False,
        )
    listen = f"{result.host}:{result.port}"
    if result.tls_port is not None:
        listen = f"TLS {result.host}:{result.tls_port}, plain 127.0.0.1:{result.port}"
    console.print(f"start it with: mosquitto -c {result.conf}   ({listen})", markup=False)
    if result.fmt == "acl":
        apply = f"vox broker reload {result.root} --pid PID"
    else:
        apply = "restart it (Mosquitto reads dynsec.json only at start)"
    console.print(f"a running broker: {apply}", markup=False)
    return 0


def _read_pid(args: argparse.Namespace) -> int:
    if args.pid is not None:
        if args.pid <= 1:
            raise ConfigError([f"--pid {args.pid} is not a broker's process id"])
        return int(args.pid)
    path: Path = args.pid_file
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError([f"--pid-file {path}: cannot read it: {exc.strerror}"]) from None
    if not text.isdigit() or int(text) <= 1:
        raise ConfigError([f"--pid-file {path}: holds {text[:40]!r}, not a process id"])
    return int(text)


def cmd_reload(args: argparse.Namespace) -> int:
    """Validate and install the ACL, then tell mosquitto to re-read it."""
    pid = _read_pid(args)
    report = reload_broker(args.dir, pid=pid, acl_source=args.acl)
    for warning in report.warnings:
        err_console().print(f"vox: warning: {warning}", markup=False)
    action = f"installed {args.acl} as {report.acl}" if report.replaced else f"checked {report.acl}"
    out_console().print(
        f"{action}: {report.rules} rules parse as Mosquitto parses them; sent SIGHUP to {pid}",
        markup=False,
    )
    return 0


def cmd_pki_init(args: argparse.Namespace) -> int:
    """Create or complete the PKI directory."""
    fleet = load_fleet(args.fleet)
    report = init_pki(args.dir, fleet, hosts=args.host, explorer=args.explorer, days=args.days)
    console = out_console()
    console.print(
        f"{report.layout.root}: {len(report.created)} files created, {report.kept} kept",
        markup=False,
    )
    console.print(
        f"CA: {report.layout.ca_cert} (its key {report.layout.ca_key} never leaves this machine)",
        markup=False,
    )
    console.print(
        f"next: vox broker render {args.fleet} --out DIR --pki {report.layout.root}",
        markup=False,
    )
    return 0
