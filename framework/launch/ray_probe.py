"""Whether a Ray head answers at an address, asked the way Ray's own clients first ask it, with a deadline. Ray's
driver retries a connection to the GCS without end (an address where something else listens hung the job, printing
"Failed to connect to GCS" forever), and Ray Client for half a minute.

host:port is the head's GCS: NodeInfoGcsService.GetClusterId, what every Ray driver and worker asks it first, must
return the cluster's id. ray://host:port is a Ray Client server (its own gRPC server, on 10001 by default, which runs
the driver on the cluster): RayletDriver.ClusterInfo(PING), what Ray Client's ping asks. Both through gRPC's Python
API and the stubs Ray generates from its protobuf services (ray.core.generated).

Where RAY_USE_TLS is set the head speaks TLS with certificates of its own, and the handshake is left to Ray (the TCP
check before it still runs). A head with token authentication refuses a call without its token: UNAUTHENTICATED is
still a Ray head answering, and ray.init sends the token.
"""
from __future__ import annotations

import os

#: where Ray's own variable turns TLS on for every connection to the cluster
TLS_ENV = "RAY_USE_TLS"


def handshake(host: str, port: int, client: bool, timeout_s: float) -> str | None:
    """None where a Ray GCS (`client`: a Ray Client server) answers at host:port within `timeout_s`; else why not."""
    if os.environ.get(TLS_ENV, "0").lower() in ("1", "true"):
        return None
    import grpc
    # straight to the head, as the TCP check went (gRPC would otherwise take an http_proxy from the environment)
    with grpc.insecure_channel(f"{host}:{port}", options=[("grpc.enable_http_proxy", 0)]) as channel:
        try:
            if client:
                from ray.core.generated import ray_client_pb2 as messages, ray_client_pb2_grpc as services
                services.RayletDriverStub(channel).ClusterInfo(
                    messages.ClusterInfoRequest(type=messages.ClusterInfoType.PING), timeout=timeout_s)
                return None
            from ray.core.generated import gcs_service_pb2 as messages, gcs_service_pb2_grpc as services
            reply = services.NodeInfoGcsServiceStub(channel).GetClusterId(messages.GetClusterIdRequest(),
                                                                          timeout=timeout_s)
        except grpc.RpcError as e:
            return _why(e.code(), (e.details() or "").strip().splitlines(), client, timeout_s)
    return None if reply.cluster_id else "its GCS gave no cluster id"


def _why(code, details: list[str], client: bool, timeout_s: float) -> str | None:
    import grpc
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"something accepts connections there but gave no gRPC answer within {timeout_s:g} s"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return ("a gRPC server answers, but not a Ray Client server; a head's GCS is host:port, without ray://"
                if client else "a gRPC server answers, but not a Ray GCS; a Ray Client server is ray://host:port")
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"it does not speak gRPC: {details[-1].rsplit(': ', 1)[-1][:200] if details else 'unavailable'}"
    return f"{code.name}: {details[0][:200] if details else 'no details'}"
