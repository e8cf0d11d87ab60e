"""launcher.ray.address must lead to a Ray head, checked with a handshake (framework.launch.ray_probe) within the
check's deadline: a TCP connection alone let a job wait forever in Ray's own connect loop ("Failed to connect to
GCS") wherever something else listened. Against listeners that are not Ray (one that never speaks, one that closes
at once, an HTTP server, gRPC servers without Ray's services); against a real head:
tests/integration/launch/test_ray_engine.py."""
import time
from concurrent import futures

import grpc
import pytest

from framework.errors import ConfigError
from framework.launch import ray as ray_launcher
from tests.harness.helpers import FAST, run_framework
from tests.harness.listeners import Listener, http_server

DEADLINE_S = 1.0


@pytest.fixture(scope="module")
def listeners():
    """Named addresses (host:port) of what is not a Ray head."""
    silent, closing, http = Listener("hold"), Listener("close"), http_server()
    plain_grpc = _grpc_server(None)
    yield {"silent": silent.address, "closing": closing.address, "http": f"127.0.0.1:{http.server_address[1]}",
           "grpc": plain_grpc.address}
    silent.close()
    closing.close()
    http.shutdown()
    plain_grpc.stop(None)


def _grpc_server(handler):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler] if handler else None)
    server.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    return server


def refusal(address: str, monkeypatch) -> str:
    monkeypatch.setattr(ray_launcher, "CONNECT_TIMEOUT_S", DEADLINE_S)
    with pytest.raises(ConfigError) as refused:
        ray_launcher._reachable(address)
    return str(refused.value)


@pytest.mark.parametrize("client", [False, True], ids=["host:port", "ray://"])
@pytest.mark.parametrize("what,reason", [
    ("silent", f"something accepts connections there but gave no gRPC answer within {DEADLINE_S:g} s)"),
    ("closing", "it does not speak gRPC: "),
    ("http", "it does not speak gRPC: "),
])
def test_a_listener_that_is_not_ray_is_refused_within_the_deadline(what, reason, client, listeners, monkeypatch):
    address = ("ray://" if client else "") + listeners[what]
    began = time.monotonic()
    said = refusal(address, monkeypatch)
    assert said.startswith(f"launcher.ray.address: {address}: no Ray cluster answers there ({reason}"), said
    assert time.monotonic() - began < DEADLINE_S + 2


@pytest.mark.parametrize("client,hint", [(False, "not a Ray GCS; a Ray Client server is ray://host:port"),
                                         (True, "not a Ray Client server; a head's GCS is host:port, without ray://")])
def test_a_grpc_server_without_rays_services_is_refused_naming_the_other_form(client, hint, listeners, monkeypatch):
    address = ("ray://" if client else "") + listeners["grpc"]
    assert refusal(address, monkeypatch) == (f"launcher.ray.address: {address}: no Ray cluster answers there "
                                             f"(a gRPC server answers, but {hint})")


def test_a_head_that_wants_its_token_counts_as_a_head():
    """A Ray head with token authentication refuses a call without its token; ray.init sends it."""
    class Unauthenticated(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken"))
    server = _grpc_server(Unauthenticated())
    try:
        ray_launcher._reachable(server.address)
    finally:
        server.stop(None)


def test_the_job_is_refused_in_one_line_and_exit_2_before_any_work(listeners, tmp_path):
    """The whole job, where an HTTP server answers at the address: one line, exit 2, nothing written."""
    address = listeners["http"]
    proc = run_framework([*FAST, "launcher.engine=ray", f"launcher.ray.address={address}"], tmp_path / "run",
                         timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"error: launcher.ray.address: {address}: no Ray cluster answers there (it does not "
                               f"speak gRPC: ")
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
