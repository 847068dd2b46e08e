"""CPU per PUBLISH-properties build and per inbound decode (docs/transport.md, "PUBLISH
properties").

Times the properties of the tree on PYTHONPATH through the names both the tree with paho's
`Properties` and the vox-owned one have: a kind built (`vox_properties`), a signed publish
from a cached kind (`with_user_property` and `packed_bytes`), the same with a deadline's
expiry spliced in, and a received message's properties decoded (`RawProperties.decode`,
`Inbound.properties`). CPU time of this process (`time.process_time`), the best of 7
repeats of 20,000 calls, so a shared machine's load moves it less than wall time.

Run it from the root of the tree measured (`python -m` puts the current directory first on
the path); for a tree older than this file, copy it into that tree's bench/ first:

    cd <tree> && PYTHONPATH=$PWD python -m bench.props_cost
"""

from __future__ import annotations

import itertools
import time
import timeit
from collections.abc import Callable
from uuid import uuid4

from vox_mqtt.transport._mqttdecode import RawProperties
from vox_mqtt.transport.inbound import Inbound
from vox_mqtt.transport.publishprops import (
    PublishProperties,
    packed_bytes,
    vox_properties,
    with_user_property,
)

CALLS, REPEATS = 20_000, 7
SIGNATURE = "k1abcdefgh." + "A" * 86  # a vox-sig's length: kid, dot, 86 base64url characters


def cases() -> dict[str, Callable[[], object]]:
    """Return what is timed, by name."""
    target = uuid4()
    kinds = PublishProperties("alpha-agent", {target: "beta-agent"})
    received = packed_bytes(
        with_user_property(kinds.inbox(target, "command_request"), "vox-sig", SIGNATURE)
    )
    expiries = itertools.cycle(range(30, 1030))

    def build() -> object:
        return vox_properties(type="command_request", sender="alpha-agent", target="beta-agent")

    def signed() -> object:
        props = kinds.inbox(target, "command_request")
        return packed_bytes(with_user_property(props, "vox-sig", SIGNATURE))

    def expiring() -> object:
        props = kinds.inbox(target, "command_request", expiry=next(expiries))
        return packed_bytes(with_user_property(props, "vox-sig", SIGNATURE))

    def decoded() -> object:
        return RawProperties(received).decode()

    def inbound() -> object:
        return Inbound(topic="t", payload=b"", retain=False, wire_properties=received).properties

    return {
        "a kind built (vox_properties)": build,
        "a signed publish (cached kind + vox-sig)": signed,
        "a signed publish with a deadline's expiry": expiring,
        "received properties decoded": decoded,
        "Inbound.properties from packed bytes": inbound,
    }


def main() -> None:
    for name, call in cases().items():
        timer = timeit.Timer(call, timer=time.process_time)
        best = min(timer.repeat(number=CALLS, repeat=REPEATS))
        print(f"{name:45s} {best / CALLS * 1e6:7.2f} us")


if __name__ == "__main__":
    main()
