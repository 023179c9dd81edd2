"""Ports for servers are drawn below the kernel's ephemeral range, where no outgoing connection takes them."""

from __future__ import annotations

import socket

from environments.ports import ephemeral_range, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low, high = ephemeral_range()
    assert 0 < low <= high <= 65535
    chosen = {free_port() for _ in range(20)}
    if low - 15000 >= 1000:
        assert all(15000 <= port < low for port in chosen), chosen
    assert len(chosen) > 1, "twenty draws gave one port: not drawn at random"
    for port in chosen:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_held_by_a_listener_is_never_chosen() -> None:
    held: list[socket.socket] = []
    try:
        for _ in range(50):
            sock = socket.socket()
            sock.bind(("127.0.0.1", free_port()))
            sock.listen()
            held.append(sock)
        taken = {sock.getsockname()[1] for sock in held}
        assert len(taken) == 50
        assert not taken & {free_port() for _ in range(200)}
    finally:
        for sock in held:
            sock.close()
