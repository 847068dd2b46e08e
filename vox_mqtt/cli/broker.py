"""`vox broker render|reload` and `vox pki init`: the fleet broker's security, from the tree."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

from vox_mqtt.broker.acl import EXPLORER_NAME, explorer_names
from vox_mqtt.broker.dynsec import apply_dynsec
from vox_mqtt.broker.federation import bridge_for, broker_spec
from vox_mqtt.broker.hupguard import LOGROTATE_NAME, reload_problems
from vox_mqtt.broker.manifest import RenderOptions, load_manifest, resolve_options
from vox_mqtt.broker.pki import DEFAULT_DAYS, init_pki
from vox_mqtt.broker.reload import (
    CONF_NAME,
    VERIFY_TIMEOUT,
    WATCH_SECONDS,
    broker_settings,
    conf_directives,
    listener_endpoints,
    reload_broker,
)
from vox_mqtt.broker.render import DEFAULT_USER, render_broker_dir
from vox_mqtt.broker.signkeys import ensure_keys, rotate_key
from vox_mqtt.protocol.errors import ConfigError
from vox_mqtt.protocol.hierarchy import Fleet, load_fleet

from ._common import err_console, out_console, print_json


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
    # Every option below defaults to what this directory's render.json remembers.
    render.add_argument("--host", help="address clients connect to (first render: 127.0.0.1)")
    render.add_argument("--bind", help="address the listener binds (default: --host)")
    render.add_argument("--port", type=int, help="plain MQTT port (first render: 1883)")
    render.add_argument("--tls-port", type=int, help="TLS port with --pki (first render: 8883)")
    render.add_argument(
        "--format",
        choices=("acl", "dynsec"),
        dest="fmt",
        help="acl (SIGHUP reloads) or dynsec (live, no signal); first render: acl, "
        "or dynsec with --pki (docs/broker.md, SIGHUP and TLS)",
    )
    render.add_argument(
        "--broker",
        help="in a fleet with [[brokers]]: the one broker to render (its clients, its ACL "
        "and, for a site, its bridge upstream); first render: host and ports from its entry",
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
        help="seconds between a bridge's pings; a cut link shows within 2.5x this "
        "(first render: 10)",
    )
    render.add_argument("--pki", type=Path, help="PKI dir from `vox pki init`: adds TLS")
    render.add_argument("--no-pki", action="store_true", help="drop TLS that was rendered before")
    render.add_argument(
        "--rotate",
        nargs="*",
        metavar="NAME",
        help="issue new secrets: for the named identities only, or for everyone without names",
    )
    render.add_argument(
        "--explorer",
        action="append",
        nargs="?",
        const=EXPLORER_NAME,
        dest="explorers",
        metavar="NAME",
        help="add a read-only identity `explorer-NAME` that reads vox/# (repeatable: one per "
        "person or tool; without NAME: the one called `explorer`); kept by later renders",
    )
    render.add_argument(
        "--no-explorer",
        action="store_true",
        help="drop every explorer rendered before (with --explorer NAME: keep only those)",
    )
    render.add_argument(
        "--user",
        help=f"user mosquitto drops privileges to (first render: {DEFAULT_USER}; "
        "use your own user for a broker you start yourself)",
    )
    render.add_argument(
        "--lock-client-ids",
        action=argparse.BooleanOptionalAction,
        help="force client id = username (default on): no identity can take over another's "
        "session; --no-lock-client-ids allows it (docs/broker.md)",
    )
    render.add_argument("--json", action="store_true", help="print what was written as JSON")
    render.set_defaults(func=cmd_render)

    reload = verbs.add_parser(
        "reload",
        help="install only what render wrote, SIGHUP, prove the new rules with a canary "
        "(or restore the previous files and fail)",
    )
    reload.add_argument("dir", type=Path, help="broker directory written by `vox broker render`")
    # A dynamic-security broker is changed live, without a signal: no pid needed.
    target = reload.add_mutually_exclusive_group()
    target.add_argument("--pid", type=int, help="mosquitto's process id")
    target.add_argument("--pid-file", type=Path, help="file holding mosquitto's process id")
    reload.add_argument("--acl", type=Path, help="hand-edited ACL to validate and install first")
    reload.add_argument(
        "--accept-edit",
        action="store_true",
        help="install files that differ from what `vox broker render` wrote (a hand edit)",
    )
    reload.add_argument(
        "--verify-timeout",
        type=float,
        default=VERIFY_TIMEOUT,
        help=f"seconds the canary may take to prove the new rules (default {VERIFY_TIMEOUT:g})",
    )
    reload.add_argument(
        "--watch",
        type=float,
        default=None,
        metavar="SECONDS",
        help="after the proof, watch that the broker stays up and its listeners accept "
        f"connections (default {WATCH_SECONDS:g}, or $VOX_RELOAD_WATCH; 0: no watch)",
    )
    reload.add_argument(
        "--tls-sighup",
        action="store_true",
        help="signal a TLS broker that takes certificates as usernames anyway "
        "(Mosquitto 2.0 may crash after it: docs/broker.md)",
    )
    reload.set_defaults(func=cmd_reload)

    check = verbs.add_parser(
        "check",
        help="warn when this host would SIGHUP a TLS broker: systemctl reload without the "
        "drop-in, or logrotate (docs/broker.md, SIGHUP and TLS)",
    )
    check.add_argument("dir", type=Path, help="broker directory written by `vox broker render`")
    check.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        help="read the systemd units and /etc/logrotate.d under this directory (default /)",
    )
    check.set_defaults(func=cmd_check)

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
    init.add_argument(
        "--explorer",
        action="append",
        nargs="?",
        const=EXPLORER_NAME,
        dest="explorers",
        metavar="NAME",
        help="also certify the explorer `explorer-NAME` (repeatable; without NAME: `explorer`)",
    )
    init.add_argument("--days", type=int, default=DEFAULT_DAYS, help="validity of new certs")
    init.set_defaults(func=cmd_pki_init)
    keys = pki_verbs.add_parser(
        "keys", help="make the missing signing keys, or rotate one identity's (docs/security.md)"
    )
    keys.add_argument("fleet", type=Path, help="the fleet file (TOML)")
    keys.add_argument("--out", type=Path, required=True, help="the broker directory")
    keys.add_argument("--rotate", metavar="NAME", help="give this agent (or operator) a new key")
    keys.set_defaults(func=cmd_pki_keys)


def _render_options(args: argparse.Namespace, fleet: Fleet) -> tuple[RenderOptions, list[str]]:
    given = {
        "host": args.host,
        "bind": args.bind,
        "port": args.port,
        "tls_port": args.tls_port,
        "fmt": args.fmt,
        "pki": None if args.pki is None else str(args.pki.absolute()),
        "explorers": None,
        "user": args.user,
        "lock_client_ids": args.lock_client_ids,
        "broker": args.broker,
        "upstream_dir": None if args.upstream_dir is None else str(args.upstream_dir.absolute()),
        "bridge_keepalive": args.bridge_keepalive,
    }
    if args.no_pki and args.pki is not None:
        raise ConfigError(["--pki and --no-pki contradict each other"])
    if args.bridge_keepalive is not None and not 5 <= args.bridge_keepalive <= 65535:
        raise ConfigError([f"--bridge-keepalive must be 5 or more (got {args.bridge_keepalive})"])
    previous = load_manifest(args.out.absolute())
    if args.no_explorer or args.explorers:
        # Explorers add up over renders (each person gets one); --no-explorer starts over.
        kept = () if args.no_explorer or previous is None else previous.options.explorers
        given["explorers"] = explorer_names([*kept, *(args.explorers or ())])
    if args.broker is not None and previous is None:
        # A first render of one broker of a federation: its [[brokers]] entry says where.
        spec = broker_spec(fleet, args.broker)
        for key, value in (("host", spec.host), ("port", spec.port), ("tls_port", spec.tls_port)):
            if given[key] is None:
                given[key] = value
    if args.fmt is None and args.pki is not None and (previous is None or not previous.options.pki):
        # TLS brokers take changes live: a SIGHUP can crash Mosquitto 2.0 with TLS.
        given["fmt"] = "dynsec"
    options, changes = resolve_options(given, None if previous is None else previous.options)
    if args.no_pki and options.pki is not None:
        options = replace(options, pki=None)
        changes.append(f"pki: {options.pki!r} -> None")
    return options, changes


def cmd_render(args: argparse.Namespace) -> int:
    """Render the broker directory from the fleet file, with the options it remembers."""
    fleet = load_fleet(args.fleet)
    options, changes = _render_options(args, fleet)
    rotate = args.rotate is not None and not args.rotate
    result = render_broker_dir(
        fleet,
        args.out,
        host=options.host,
        bind=options.bind,
        port=options.port,
        tls_port=options.tls_port,
        fmt=options.fmt,
        pki_dir=options.pki,
        rotate=rotate,
        rotate_names=tuple(args.rotate or ()),
        explorers=options.explorers,
        run_as_user=options.user,
        lock_client_ids=options.lock_client_ids,
        broker=options.broker,
        upstream_dir=options.upstream_dir,
        bridge_keepalive=options.bridge_keepalive,
    )
    for change in changes:
        err_console().print(f"vox: changed: {change}", markup=False)
    if result.fmt == "acl" and result.tls_port is not None:
        err_console().print(
            "vox: warning: acl format with TLS: `vox broker reload` will not SIGHUP this "
            "broker (Mosquitto 2.0 crashes after it, docs/broker.md); re-render with "
            "--format dynsec and restart the broker once",
            markup=False,
        )
    for warning in result.warnings:
        err_console().print(f"vox: warning: {warning}", markup=False)
    if fleet.signatures != "off":
        # The signing keys live with the other secrets; a site's come from its upstream's.
        ensure_keys(args.out, fleet, upstream=options.upstream_dir)
    bridge = None if options.broker is None else bridge_for(fleet, options.broker)
    names = sorted(result.identities)
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
                "credentials": str(result.store.path),
                "identities": names,
                "explorers": list(options.explorers),
                "warnings": list(result.warnings),
                "changed": changes,
                "broker": options.broker,
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
        f"wrote the credentials of {len(names)} identities to {result.store.path} (0600)",
        markup=False,
    )
    if options.explorers:
        # One login each: two explorers sharing one kick each other off (docs/operations.md).
        console.print(
            f"read-only explorers, one per person or tool: {', '.join(options.explorers)}",
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
        apply = f"vox broker reload {result.root}   (applied live, no signal)"
    console.print(f"a running broker: {apply}", markup=False)
    if result.tls_port is not None:
        console.print(
            f"wrote {result.root / LOGROTATE_NAME}: install it as /etc/logrotate.d/mosquitto "
            "(copytruncate: log rotation sends no SIGHUP, which Mosquitto 2.0 crashes on with "
            "TLS); `systemctl reload mosquitto` is safe only with the drop-in "
            "systemd/mosquitto.service.d/vox.conf (`vox broker check` says)",
            markup=False,
        )
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


def _watch_seconds(args: argparse.Namespace) -> float:
    """Return --watch, else $VOX_RELOAD_WATCH, else WATCH_SECONDS; refuse a bad value."""
    if args.watch is not None:
        value, source = float(args.watch), "--watch"
    else:
        text = os.environ.get("VOX_RELOAD_WATCH")
        if text is None:
            return WATCH_SECONDS
        source = "VOX_RELOAD_WATCH"
        try:
            value = float(text)
        except ValueError:
            raise ConfigError([f"{source}={text[:40]!r} is not a number of seconds"]) from None
    if not 0 <= value <= 3600:
        raise ConfigError([f"{source} must be from 0 to 3600 seconds (got {value:g})"])
    return value


def _watched(seconds: float) -> str:
    return f"; watched {seconds:g} s: still up" if seconds > 0 else ""


def _apply_dynsec(args: argparse.Namespace, pid: int | None, watch: float) -> int:
    root = args.dir.absolute()
    endpoints = listener_endpoints(conf_directives((root / CONF_NAME).read_text(encoding="utf-8")))
    report = apply_dynsec(
        args.dir,
        timeout=args.verify_timeout,
        accept_edit=args.accept_edit,
        watch=watch,
        pid=pid,
        endpoints=endpoints,
    )
    sent = ", ".join(f"{n} {c}" for c, n in sorted(report.summary.items())) or "nothing"
    out_console().print(
        f"applied live through the dynamic-security plugin ({sent}; no signal); "
        f"canary: {report.proof}{_watched(report.watched)}",
        markup=False,
    )
    return 0


def cmd_reload(args: argparse.Namespace) -> int:
    """Install what render wrote, SIGHUP (or apply live with dynsec), and prove the rules."""
    given = args.pid is not None or args.pid_file is not None
    pid = _read_pid(args) if given else 0
    watch = _watch_seconds(args)
    if "plugin" in broker_settings(args.dir.absolute()):
        return _apply_dynsec(args, pid if given else None, watch)
    if not given:
        raise ConfigError(["--pid or --pid-file is needed: the broker is signalled (SIGHUP)"])
    report = reload_broker(
        args.dir,
        pid=pid,
        acl_source=args.acl,
        accept_edit=args.accept_edit,
        verify_timeout=args.verify_timeout,
        watch=watch,
        tls_sighup=args.tls_sighup,
    )
    for warning in report.warnings:
        err_console().print(f"vox: warning: {warning}", markup=False)
    for name in report.accepted_edits:
        err_console().print(f"vox: warning: installed a hand edit of {name}", markup=False)
    action = f"installed {args.acl} as {report.acl}" if report.replaced else f"checked {report.acl}"
    out_console().print(
        f"{action}: {report.rules} rules parse as Mosquitto parses them; sent SIGHUP to {pid}; "
        f"canary: {report.proof}{_watched(report.watched)}",
        markup=False,
    )
    return 0


# Where systemd reads mosquitto.service and its drop-ins, most important first.
_UNIT_DIRS = (
    "etc/systemd/system",
    "run/systemd/system",
    "usr/lib/systemd/system",
    "lib/systemd/system",
)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read it: {exc.strerror}"]) from None


def _unit_texts(root: Path) -> list[str]:
    """Return mosquitto.service and its drop-ins (by file name, as systemd orders them)."""
    unit = None
    for folder in _UNIT_DIRS:
        unit = _read_text(root / folder / "mosquitto.service")
        if unit is not None:
            break
    if unit is None:
        return []
    drop_ins: dict[str, Path] = {}
    for folder in reversed(_UNIT_DIRS):  # a same-named file in /etc masks the others
        directory = root / folder / "mosquitto.service.d"
        if directory.is_dir():
            drop_ins.update({p.name: p for p in directory.glob("*.conf")})
    return [unit, *(_read_text(drop_ins[name]) or "" for name in sorted(drop_ins))]


def cmd_check(args: argparse.Namespace) -> int:
    """Warn about every way this host would SIGHUP a TLS broker; exit 1 if there is one."""
    broker_dir = args.dir.absolute()
    conf = broker_dir / CONF_NAME
    conf_text = _read_text(conf)
    if conf_text is None:
        raise ConfigError([f"{conf}: no such file: render the broker directory first"])
    problems = reload_problems(
        conf_text=conf_text,
        broker_dir=broker_dir,
        unit_texts=_unit_texts(args.root),
        logrotate=_read_text(args.root / "etc/logrotate.d/mosquitto"),
    )
    for problem in problems:
        err_console().print(f"vox: warning: {problem}", markup=False)
    if problems:
        return 1
    out_console().print(
        f"{conf}: nothing on this host sends the broker a SIGHUP it would crash on",
        markup=False,
    )
    return 0


def cmd_pki_init(args: argparse.Namespace) -> int:
    """Create or complete the PKI directory."""
    fleet = load_fleet(args.fleet)
    report = init_pki(
        args.dir, fleet, hosts=args.host, explorers=args.explorers or (), days=args.days
    )
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


def cmd_pki_keys(args: argparse.Namespace) -> int:
    """Make the signing keys the fleet lacks, or rotate one identity's key."""
    fleet = load_fleet(args.fleet)
    console = out_console()
    if args.rotate is None:
        made = ensure_keys(args.out, fleet)
        console.print(f"{args.out}: {made} signing keys made", markup=False)
        return 0
    old, new = rotate_key(args.out, fleet, args.rotate)
    console.print(f"{args.rotate}: key {old} retired, now {new}", markup=False)
    console.print(
        f"next: vox agent render for {args.rotate}, its master and its children;"
        f" SIGHUP its master and children, then {args.rotate} last (docs/security.md)",
        markup=False,
    )
    return 0
