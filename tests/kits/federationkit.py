"""A federated fleet on loopback: one real Mosquitto per broker, bridged as rendered.

- `federated_fleet_text(...)`: a fleet file with [[brokers]] and agents placed on them.
- `deploy_federation(...)`: render every broker (upstream first, each on a free port),
  optionally with a `TcpProxy` in a site's bridge (a cable to cut), render each agent's
  daemon config from its own broker's directory, start the brokers.
- `Federation`: the brokers, proxies, configs and daemons, stopped at the end.
"""

from __future__ import annotations

import contextlib
import getpass
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID, uuid4

from tests.kits.faultkit import TcpProxy, bridge_through
from tests.kits.fleetproc import AgentProcess
from vox_mqtt.broker.federation import write_link_map
from vox_mqtt.broker.local import LocalBroker, free_port
from vox_mqtt.broker.passwd import Credentials
from vox_mqtt.broker.pki import init_pki
from vox_mqtt.broker.render import BrokerDir, render_broker_dir
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.protocol.hierarchy import Fleet, load_fleet
from vox_mqtt.protocol.sites import chain_up


def federated_fleet_text(
    agents: dict[str, tuple[str | None, str | None, tuple[str, ...]]],
    brokers: dict[str, str | None],
    *,
    heartbeat: float = 1.0,
    settings: dict[str, dict[str, str]] | None = None,
) -> str:
    """Return a fleet file: {agent: (master, broker or None, roles)}, {broker: upstream}."""
    ids = {name: uuid4() for name in agents}
    parts = [f'[operator]\nname = "operator"\nid = "{uuid4()}"\n']
    for name, upstream in brokers.items():
        line = "" if upstream is None else f'upstream = "{upstream}"\n'
        parts.append(f'[[brokers]]\nname = "{name}"\n{line}')
    for name, (master, broker, roles) in agents.items():
        body = f'[[agents]]\nname = "{name}"\nid = "{ids[name]}"\n'
        body += f"heartbeat_interval = {heartbeat}\n"
        if master is not None:
            body += f'master_id = "{ids[master]}"\n'
        if broker is not None:
            body += f'broker = "{broker}"\n'
        body += "roles = [" + ", ".join(f'"{r}"' for r in roles) + "]\n"
        for key, value in (settings or {}).get(name, {}).items():
            body += f"settings.{key} = {value!r}\n".replace("'", '"')
        parts.append(body)
    return "\n".join(parts)


@dataclass
class Federation:
    """Every broker of a fleet running on this host, and the daemons a test starts."""

    root: Path
    fleet: Fleet
    dirs: dict[str, BrokerDir]
    brokers: dict[str, LocalBroker]
    proxies: dict[str, TcpProxy]
    configs: dict[str, Path]
    operator_config: Path
    daemons: dict[str, AgentProcess] = field(default_factory=dict)

    def id(self, name: str) -> UUID:
        return self.fleet.agent(name).id

    def broker_of(self, name: str) -> str:
        broker = self.fleet.agent(name).broker
        assert broker is not None
        return broker

    def creds(self, broker: str, identity: str | UUID) -> Credentials:
        """Return the plain-listener credentials of an identity on one broker."""
        return self.dirs[broker].credentials_for(identity)

    def start(self, names: Iterable[str] | None = None) -> None:
        """Start daemons (all by default), leaves first."""
        chosen = list(names if names is not None else self.configs)
        chosen.sort(key=lambda n: -self.fleet.depth_of(self.id(n)))
        for name in chosen:
            process = AgentProcess(
                name, self.configs[name], self.root / "state" / name, self.root / f"{name}.log"
            )
            process.start()
            self.daemons[name] = process

    def logs(self) -> str:
        parts = [f"--- {p.name} ---\n{p.log()[-5000:]}" for p in self.daemons.values()]
        parts += [f"--- broker {n} ---\n{b.log_tail(40)}" for n, b in self.brokers.items()]
        return "\n".join(parts)

    def close(self) -> None:
        for process in self.daemons.values():
            process.kill()
        for broker in self.brokers.values():
            with contextlib.suppress(Exception):
                broker.stop()
        for proxy in self.proxies.values():
            proxy.close()


def deploy_federation(
    root: Path,
    text: str,
    *,
    fmt: str = "acl",
    proxied: Iterable[str] = (),
    bridge_keepalive: int = 5,
    keepalive: int = 5,
    tls: bool = False,
    lock_client_ids: bool = True,
) -> Federation:
    """Render and start every broker of the fleet; render every daemon config."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "fleet.toml").write_text(text)
    fleet = load_fleet(root / "fleet.toml")
    pki = None
    if tls:
        pki = root / "pki"
        init_pki(pki, fleet, explorer=True)
    order = sorted(fleet.brokers, key=lambda b: len(list(chain_up(fleet.brokers, b.name))))
    dirs: dict[str, BrokerDir] = {}
    proxies: dict[str, TcpProxy] = {}
    brokers: dict[str, LocalBroker] = {}
    wanted = set(proxied)
    for spec in order:
        dirs[spec.name] = render_broker_dir(
            fleet,
            root / "brokers" / spec.name,
            broker=spec.name,
            port=free_port(),
            tls_port=free_port(),
            pki_dir=pki,
            fmt=fmt,  # type: ignore[arg-type]
            upstream_dir=None if spec.upstream is None else dirs[spec.upstream].root,
            explorer=spec.upstream is None,
            run_as_user=getpass.getuser(),
            bridge_keepalive=bridge_keepalive,
            lock_client_ids=lock_client_ids,
        )
        if spec.name in wanted:
            assert spec.upstream is not None
            upstream = dirs[spec.upstream]
            proxy = TcpProxy(upstream.tls_port if tls and upstream.tls_port else upstream.port)
            bridge_through(dirs[spec.name].root, proxy)
            proxies[spec.name] = proxy
    etc = root / "etc"
    configs = {
        agent.name: render_agent_config(
            fleet,
            agent.name,
            dirs[agent.broker or ""].root,
            etc / f"{agent.name}.toml",
            root / "state" / agent.name,
            keepalive=keepalive,
            shutdown_grace=2.0,
        ).config
        for agent in fleet
    }
    top = fleet.root_broker
    assert top is not None
    operator = render_agent_config(
        fleet, "operator", dirs[top].root, etc / "operator.toml", root / "console"
    )
    for name, config in [*configs.items(), (fleet.operator_name, operator.config)]:
        write_link_map(fleet, name, config)
    federation = Federation(
        root=root,
        fleet=fleet,
        dirs=dirs,
        brokers=brokers,
        proxies=proxies,
        configs=configs,
        operator_config=operator.config,
    )
    try:
        for spec in order:
            broker = LocalBroker(dirs[spec.name].conf, port=dirs[spec.name].port)
            broker.start()
            brokers[spec.name] = broker
    except BaseException:
        federation.close()
        raise
    return federation


@contextlib.contextmanager
def running_federation(root: Path, text: str, **kwargs: object) -> Iterator[Federation]:
    """Deploy a federation; stop it all at the end and print every log if the test failed."""
    federation = deploy_federation(root, text, **kwargs)  # type: ignore[arg-type]
    try:
        yield federation
    except BaseException:
        print(federation.logs())
        raise
    finally:
        federation.close()
