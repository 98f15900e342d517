"""Backends on the host that a guest reaches through tests/vm/run's forwards (QEMU user networking, restricted to
them): the host side starts them and names the forwards, the guest side finds its end of each.

A backend runs natively on the host rather than in the emulated guest: there a Go binary of 80 MB takes minutes
to start and then competes with the agent for the guest's two CPUs. Used by the VM batch (tests/vm/conftest.py
starts the peers its scenarios ask for with `guest_batch.budget(..., peers=...)`, one set per boot) and by the
fleet's nodes (tests/vm/fleet_node.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# The guest's ports of the host's Jaeger (tests/peers/jaeger.py), at tests/vm/run's default guest address.
JAEGER_OTLP_HTTP = 4318
JAEGER_QUERY = 16686
PEERS = ("jaeger",)


def guest_url(guest_port: int) -> str:
    """Guest side: http://ADDR:PORT of the forward to the host that the guest reaches at `guest_port`
    (tests/vm/run tells the guest its forwards in RETSNOOP_OTEL_TO_HOST: "HOSTPORT=GUESTADDR:GUESTPORT ...")."""
    for item in os.environ.get("RETSNOOP_OTEL_TO_HOST", "").split():
        _, _, guest = item.partition("=")
        if guest.endswith(f":{guest_port}"):
            return f"http://{guest}"
    raise RuntimeError(f"no forward to the host at guest port {guest_port} in RETSNOOP_OTEL_TO_HOST="
                       f"{os.environ.get('RETSNOOP_OTEL_TO_HOST', '')!r}: did the scenario ask for its peer?")


@contextmanager
def started(peers: set[str]) -> Iterator[list[str]]:
    """Host side: start `peers` (names from PEERS) for one boot; yields tests/vm/run's forward arguments, and stops
    them after. Jaeger runs the shipped Collector pipeline keeping every trace (SAMPLE_PERCENT 100): the agent
    samples, the scenario reads everything it exported."""
    if unknown := peers - set(PEERS):
        raise RuntimeError(f"unknown host peers {sorted(unknown)} (known: {', '.join(PEERS)})")
    if "jaeger" not in peers:
        yield []
        return
    from tests.peers.jaeger import Jaeger

    jaeger = Jaeger(decision_wait="2s", sample_percent=100)
    try:
        yield ["--forward-to-host", f"{JAEGER_OTLP_HTTP}={jaeger.ports['otlp_http']}",
               "--forward-to-host", f"{JAEGER_QUERY}={jaeger.ports['query_http']}"]
    finally:
        jaeger.stop()
