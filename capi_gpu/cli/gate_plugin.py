"""`capi-gpu gate-plugin`: run the gate driver's no-op kubelet plugin on a GPU node, or probe it.

``serve`` is the DaemonSet's container command; ``probe`` is its startup and liveness probe (an exec
probe, because the plugin listens only on unix sockets). Exit codes: 0 healthy or stopped by a signal,
1 the kubelet rejected the registration or the probe failed (the container restart re-registers).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from capi_gpu import domain
from capi_gpu.cli import EXIT_FAILED, EXIT_OK
from capi_gpu.readiness import kubeletplugin


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gate-plugin", help="the gate DRA driver's no-op kubelet plugin")
    actions = p.add_subparsers(dest="action", required=True)
    for name, func, text in (
        ("serve", serve, "register with the kubelet and answer prepare/unprepare until SIGTERM"),
        ("probe", probe, "exit 0 when both plugin sockets answer as the kubelet expects"),
    ):
        a = actions.add_parser(name, help=text)
        a.add_argument("--driver", default=domain.GATE_DRIVER, help="DRA driver name (default %(default)s)")
        a.add_argument("--plugins-dir", type=Path, default=kubeletplugin.KUBELET_PLUGINS_DIR)
        a.add_argument("--registry-dir", type=Path, default=kubeletplugin.KUBELET_REGISTRY_DIR)
        a.set_defaults(func=func)


def _paths(args: argparse.Namespace) -> kubeletplugin.PluginPaths:
    return kubeletplugin.PluginPaths(args.driver, args.plugins_dir, args.registry_dir)


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger(__name__).info("signal %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    failed = threading.Event()
    with kubeletplugin.GatePlugin(_paths(args)) as plugin:

        def watch_registration() -> None:
            result = plugin.wait_for_registration()
            if result is not None and not result.registered:
                failed.set()
                stop.set()

        threading.Thread(target=watch_registration, daemon=True).start()
        stop.wait()
    return EXIT_FAILED if failed.is_set() else EXIT_OK


def probe(args: argparse.Namespace) -> int:
    problem = kubeletplugin.probe(_paths(args))
    if problem is not None:
        print(f"gate plugin unhealthy: {problem}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
