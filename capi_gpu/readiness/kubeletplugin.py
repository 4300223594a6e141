"""The gate driver's kubelet plugin: it registers with the kubelet and prepares nothing.

Why it has to exist at all: before the kubelet starts a pod it calls NodePrepareResources on the plugin
of every driver named in the pod's claim allocations, and a driver without a registered plugin fails the
pod ("DRA driver ... is not registered"). The gate device has nothing to prepare (its whole job is done
in the scheduler, through its taint and binding conditions), so every claim is answered with success and no
CDI devices, and the MIG device keeps coming from NVIDIA's plugin.

How it talks to the kubelet, as ``k8s.io/dynamic-resource-allocation/kubeletplugin`` does:

* ``<registry>/<driver>-reg.sock`` serves ``pluginregistration.Registration``. The kubelet's plugin
  watcher sees the socket appear, calls ``GetInfo`` (type ``DRAPlugin``, name = driver, endpoint = the
  DRA socket, supported versions = the gRPC services, here ``v1.DRAPlugin``) and then
  ``NotifyRegistrationStatus``. Removing the socket deregisters the plugin.
* ``<plugins>/<driver>/dra.sock`` serves ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``.

Stale sockets from a previous container are removed before binding, the DRA socket is up before the
registration socket appears (the kubelet dials the endpoint right after registering), and on stop the
registration socket goes first. A registration the kubelet rejects is recorded; the CLI then exits
non-zero so that the container restart re-registers.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import pathlib
import threading
from typing import Any

import grpc

from capi_gpu import domain
from capi_gpu.readiness.proto import dra_v1_pb2 as dra
from capi_gpu.readiness.proto import dra_v1_pb2_grpc as dra_grpc
from capi_gpu.readiness.proto import pluginregistration_v1_pb2 as reg
from capi_gpu.readiness.proto import pluginregistration_v1_pb2_grpc as reg_grpc

# The generated *_pb2_grpc modules carry no annotations (grpcio-tools emits no stubs for them), hence the
# few no-untyped-call ignores below; the *_pb2 messages are typed through their generated .pyi stubs.

log = logging.getLogger(__name__)

KUBELET_PLUGINS_DIR = pathlib.Path("/var/lib/kubelet/plugins")
KUBELET_REGISTRY_DIR = pathlib.Path("/var/lib/kubelet/plugins_registry")
PLUGIN_TYPE = "DRAPlugin"  # k8s.io/kubelet/pkg/apis/pluginregistration/v1.DRAPlugin
DRA_SERVICE = "v1.DRAPlugin"  # k8s.io/kubelet/pkg/apis/dra/v1.DRAPluginService


@dataclasses.dataclass(frozen=True)
class PluginPaths:
    driver: str = domain.GATE_DRIVER
    plugins_dir: pathlib.Path = KUBELET_PLUGINS_DIR
    registry_dir: pathlib.Path = KUBELET_REGISTRY_DIR

    @property
    def registration_socket(self) -> pathlib.Path:
        return self.registry_dir / f"{self.driver}-reg.sock"

    @property
    def dra_socket(self) -> pathlib.Path:
        return self.plugins_dir / self.driver / "dra.sock"


@dataclasses.dataclass(frozen=True)
class RegistrationResult:
    registered: bool
    error: str


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, paths: PluginPaths, on_status: Any) -> None:
        self._paths = paths
        self._on_status = on_status

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._paths.driver,
            endpoint=str(self._paths.dra_socket),
            supported_versions=[DRA_SERVICE],
        )

    def NotifyRegistrationStatus(self, request: reg.RegistrationStatus, context: Any) -> reg.RegistrationStatusResponse:
        self._on_status(RegistrationResult(request.plugin_registered, request.error))
        return reg.RegistrationStatusResponse()


class _NoopDRA(dra_grpc.DRAPluginServicer):
    def NodePrepareResources(
        self, request: dra.NodePrepareResourcesRequest, context: Any
    ) -> dra.NodePrepareResourcesResponse:
        for claim in request.claims:
            log.info("prepare claim %s/%s (%s): nothing to do", claim.namespace, claim.name, claim.uid)
        return dra.NodePrepareResourcesResponse(
            claims={claim.uid: dra.NodePrepareResourceResponse() for claim in request.claims}
        )

    def NodeUnprepareResources(
        self, request: dra.NodeUnprepareResourcesRequest, context: Any
    ) -> dra.NodeUnprepareResourcesResponse:
        for claim in request.claims:
            log.info("unprepare claim %s/%s (%s): nothing to do", claim.namespace, claim.name, claim.uid)
        return dra.NodeUnprepareResourcesResponse(
            claims={claim.uid: dra.NodeUnprepareResourceResponse() for claim in request.claims}
        )


class GatePlugin:
    """Both gRPC servers of the no-op plugin; ``start()``/``stop()``, or use it as a context manager."""

    def __init__(self, paths: PluginPaths | None = None) -> None:
        self.paths = paths or PluginPaths()
        self._status: RegistrationResult | None = None
        self._notified = threading.Event()
        self._servers: list[Any] = []

    def __enter__(self) -> GatePlugin:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        dra_server = self._serve(
            self.paths.dra_socket,
            lambda s: dra_grpc.add_DRAPluginServicer_to_server(_NoopDRA(), s),  # type: ignore[no-untyped-call]
        )
        registration = _Registration(self.paths, self._record)
        reg_server = self._serve(
            self.paths.registration_socket,
            lambda s: reg_grpc.add_RegistrationServicer_to_server(registration, s),  # type: ignore[no-untyped-call]
        )
        self._servers = [reg_server, dra_server]
        log.info(
            "gate plugin %s: registration at %s, DRA service at %s",
            self.paths.driver,
            self.paths.registration_socket,
            self.paths.dra_socket,
        )

    def stop(self, grace: float = 2.0) -> None:
        for server, socket in zip(self._servers, (self.paths.registration_socket, self.paths.dra_socket), strict=False):
            socket.unlink(missing_ok=True)
            server.stop(grace).wait()
        self._servers = []

    def wait_for_registration(self, timeout: float | None = None) -> RegistrationResult | None:
        """The kubelet's verdict on our registration, or None if it has not called back in time."""
        self._notified.wait(timeout)
        return self._status

    def _record(self, status: RegistrationResult) -> None:
        if status.registered:
            log.info("registered with the kubelet as %s", self.paths.driver)
        else:
            log.error("the kubelet rejected the registration of %s: %s", self.paths.driver, status.error)
        self._status = status
        self._notified.set()

    @staticmethod
    def _serve(socket: pathlib.Path, add: Any) -> Any:
        socket.parent.mkdir(parents=True, exist_ok=True)
        socket.unlink(missing_ok=True)  # left behind by a previous container; binding would fail
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        add(server)
        if not server.add_insecure_port(f"unix://{socket}"):
            raise OSError(f"cannot listen on {socket}")
        server.start()
        return server


def probe(paths: PluginPaths | None = None, timeout: float = 5.0) -> str | None:
    """Ask both sockets what the kubelet would ask; None when healthy, otherwise what failed.

    The same check NVIDIA's plugin wires as its startup and liveness probe: GetInfo on the registration
    socket and an empty NodePrepareResources on the DRA socket.
    """
    paths = paths or PluginPaths()
    try:
        with grpc.insecure_channel(f"unix://{paths.registration_socket}") as channel:
            stub = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            info = stub.GetInfo(reg.InfoRequest(), timeout=timeout)
        if info.name != paths.driver or DRA_SERVICE not in info.supported_versions:
            return f"registration socket answers for {info.name!r} {list(info.supported_versions)}"
        with grpc.insecure_channel(f"unix://{paths.dra_socket}") as channel:
            dra_stub = dra_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
            dra_stub.NodePrepareResources(dra.NodePrepareResourcesRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    return None
