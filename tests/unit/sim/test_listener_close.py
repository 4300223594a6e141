"""A simulator listener that is closed frees its address at once, even while its accept thread is blocked.

CI failed three times on EADDRINUSE at a world's ``kubernetes`` Service (``127.64.X.1:443``): a listener
of an earlier world in the same process was closed but still bound, because close(2) does not wake a
thread blocked in accept(2). Each case binds the same address again right after close.
"""

from __future__ import annotations

import socket
import time

from capi_gpu_sim.pods.podnet import Forward, listener
from capi_gpu_sim.pods.services import _Listener

ADDRESS = ("127.98.7.1", 4443)


def _rebind(address: tuple[str, int] = ADDRESS) -> None:
    again = listener(*address)  # raises EADDRINUSE while the closed one is still bound
    again.close()


def test_a_closed_service_listener_is_unbound_and_its_accept_thread_ends() -> None:
    svc = _Listener(*ADDRESS, target=list)
    time.sleep(0.1)  # the accept thread is now blocked in accept(2)
    svc.close()
    _rebind()


def test_a_closed_pod_port_forward_is_unbound() -> None:
    fwd = Forward(listener(*ADDRESS), lambda: socket.create_connection(("127.0.0.1", 9), timeout=1))
    time.sleep(0.1)
    fwd.close()
    _rebind()


def test_the_check_can_fail_a_plain_close_leaves_the_address_bound() -> None:
    address = ("127.98.7.2", 4443)
    sock = listener(*address)
    Forward(sock, lambda: socket.create_connection(("127.0.0.1", 9), timeout=1))
    time.sleep(0.1)
    sock.close()  # what the simulator did before: the blocked accept keeps the socket listening
    try:
        _rebind(address)
        bound = False
    except OSError:
        bound = True
    finally:
        # One connection wakes the accept; its next accept on the closed socket fails and the thread ends.
        socket.create_connection(address, timeout=2).close()
    assert bound, "a plain close unbound the address: the two tests above would prove nothing"
