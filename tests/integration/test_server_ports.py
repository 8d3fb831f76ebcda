"""Embedded servers start even when a port chosen for them was taken before they bound it."""

from __future__ import annotations

import socket

import nats

from baton.devkit.servers import NatsCluster


async def test_a_nats_cluster_whose_route_and_monitor_ports_were_taken_starts_on_fresh_ones(
) -> None:
    cluster = NatsCluster(size=3, durable=False)
    taken_route, taken_monitor = cluster.route_ports[0], cluster.nodes[1].monitor_port
    assert taken_monitor is not None
    holders = []
    for port in (taken_route, taken_monitor):  # another process got there first
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", port))
        sock.listen()
        holders.append(sock)
    try:
        async with cluster:
            assert taken_route not in cluster.route_ports
            assert taken_monitor not in [n.monitor_port for n in cluster.nodes]
            nc = await nats.connect(servers=cluster.url.split(","))
            try:
                info = await nc.jetstream().account_info()  # JetStream answers: a leader
                assert info.limits is not None
            finally:
                await nc.close()
    finally:
        for sock in holders:
            sock.close()
