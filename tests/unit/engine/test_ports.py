import socket

from contrastive.engine.ports import free_port


def test_the_free_port_is_unprivileged_and_a_server_can_listen_on_it():
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
