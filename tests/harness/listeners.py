"""Endpoints that are not what a job expects, each on a free local port in a thread of the test process: one that
accepts connections and never says a word, one that closes each connection at once, a plain HTTP server, an MLflow
tracking server and an HTTP proxy in front of a real server that each answer some calls and never answer others.
They stand in for a wrong address or a hung server in the tests of bounded waits (object storage, trackers, the
Ray address check)."""
from __future__ import annotations

import http.client
import http.server
import json
import socket
import threading
import time
from urllib.parse import urlparse


class Listener:
    """A TCP listener on 127.0.0.1 that accepts every connection and then does `what` with it: "hold" (never a byte,
    never closed while the listener lives) or "close" (closed at once). `.arrivals`: when each connection came
    (time.monotonic())."""

    def __init__(self, what: str):
        self.what, self.arrivals, self._held = what, [], []
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._socket.accept()
            except OSError:          # closed
                return
            self.arrivals.append(time.monotonic())
            if self.what == "close":
                conn.close()
            else:
                self._held.append(conn)

    def close(self) -> None:
        self._socket.close()
        for conn in self._held:
            conn.close()


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def http_server() -> http.server.ThreadingHTTPServer:
    """A plain HTTP/1.1 server that answers every request 404 (`.server_address` is where it listens)."""
    class NotFound(_Quiet):
        def do_GET(self):
            self.send_error(404)
        do_POST = do_GET
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


RUN_ID = "0123456789abcdef0123456789abcdef"


class HangingMlflow:
    """An MLflow tracking server that answers what a job asks of a new run (the probe, the experiment, the run, its
    parameters, metrics, its end) with what MLflow's own server would, except the calls whose path ends with one of
    `hang` (e.g. "experiments/get-by-name", "runs/update"), which it never answers. `.uri` for the client;
    `.hung`: when each unanswered call came (time.monotonic()); `.paths`: every path asked, in order."""

    def __init__(self, hang: tuple[str, ...]):
        self.hang, self.hung, self.paths = hang, [], []
        self._release = threading.Event()
        owner = self

        class Handler(_Quiet):
            protocol_version = "HTTP/1.1"

            def _serve(self):
                path = urlparse(self.path).path
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                owner.paths.append(path)
                if path.endswith(owner.hang):
                    owner.hung.append(time.monotonic())
                    owner._release.wait()
                    return
                body = json.dumps(owner.answer(path)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            do_GET = do_POST = _serve

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.uri = f"http://127.0.0.1:{self._server.server_address[1]}"

    @staticmethod
    def answer(path: str) -> dict:
        info = {"run_id": RUN_ID, "run_uuid": RUN_ID, "experiment_id": "1", "run_name": "run", "status": "RUNNING",
                "start_time": 0, "artifact_uri": "mlflow-artifacts:/1/run/artifacts", "lifecycle_stage": "active"}
        if path.endswith("experiments/get-by-name"):
            return {"experiment": {"experiment_id": "1", "name": "framework", "lifecycle_stage": "active"}}
        if path.endswith("runs/create"):
            return {"run": {"info": info, "data": {}}}
        if path.endswith("runs/update"):
            return {"run_info": {**info, "status": "FINISHED"}}
        if path.endswith("experiments/search"):
            return {"experiments": []}
        return {}

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()


class HangingProxy:
    """An HTTP proxy to `target` (http://host:port) that passes every request on and its answer back, except those for
    which `hangs(method, path)` is true: those it never answers. `.uri` to point clients at; `.hung`: (when it came
    (time.monotonic()), its path) of each unanswered request."""

    def __init__(self, target: str, hangs):
        self.hung: list[tuple[float, str]] = []
        self._release = threading.Event()
        upstream = urlparse(target)
        owner = self

        class Handler(_Quiet):
            protocol_version = "HTTP/1.1"

            def _serve(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if hangs(self.command, self.path):
                    owner.hung.append((time.monotonic(), self.path))
                    owner._release.wait()
                    return
                conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()
            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.uri = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
