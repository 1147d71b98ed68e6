"""A small prefill/decode proxy: each completion goes to the prefill engine, then to the decode one.

``POST /v1/completions`` is sent first to the prefill engine with ``max_tokens`` 1 and
``kv_transfer_params: {"do_remote_decode": true}`` (NixlConnector then keeps the prompt's KV for
a decode engine to pull); the ``kv_transfer_params`` it answers (the prefill engine's id, its
block ids, host and port) go with the client's request to the decode engine, whose answer (a
stream too) is the client's. A client that goes away mid-stream closes the decode connection, so
the decode engine aborts the request. A prefill or decode engine that fails answers the client
with its status. Standard library only:

    python -m bench.pd_proxy --port 8000 --prefill http://127.0.0.1:8100 \\
        --decode http://127.0.0.1:8200
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: What the prefill request asks of NixlConnector: keep the KV for a remote decode.
REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def _connect(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)


def _post(url: str, body: dict[str, Any], timeout: float) -> tuple[int, bytes]:
    connection = _connect(url, timeout)
    try:
        connection.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        with connection.getresponse() as answer:
            return answer.status, answer.read()
    finally:
        connection.close()


class Proxy(ThreadingHTTPServer):
    """The proxy's server: ``prefill`` and ``decode`` are the engines' base URLs."""

    daemon_threads = True
    #: Seconds for each request to an engine (socketserver's own ``timeout`` is float or None).
    timeout: float

    def __init__(self, port: int, prefill: str, decode: str, timeout: float = 120.0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.prefill, self.decode, self.timeout = prefill, decode, timeout
        #: Per request sent: the prefill engine's kv_transfer_params (read by the tests).
        self.handed: list[dict[str, Any]] = []

    def start(self) -> threading.Thread:
        """Serve in a daemon thread (``stop()`` stops it)."""
        thread = threading.Thread(target=self.serve_forever, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: Proxy

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the tests read the engines' logs

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        if self.path != "/v1/completions":
            self._answer(404, b'{"error": "only /v1/completions"}')
            return
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prefill = {**request, "max_tokens": 1, "stream": False}
        prefill.pop("stream_options", None)
        prefill["kv_transfer_params"] = dict(REMOTE_DECODE)
        try:
            status, body = _post(self.server.prefill, prefill, self.server.timeout)
        except OSError as exc:
            self._answer(502, json.dumps({"error": f"prefill: {exc}"}).encode())
            return
        if status != 200:
            self._answer(status, body)
            return
        params = json.loads(body).get("kv_transfer_params")
        self.server.handed.append(params)
        self._decode({**request, "kv_transfer_params": params})

    def _decode(self, request: dict[str, Any]) -> None:
        """Relay the decode engine's answer; a stream chunk by chunk, until either side ends."""
        connection = _connect(self.server.decode, self.server.timeout)
        answer = None
        try:
            connection.request(
                "POST", "/v1/completions", json.dumps(request), {"Content-Type": "application/json"}
            )
            answer = connection.getresponse()
            if not request.get("stream"):
                self._answer(answer.status, answer.read())
                return
            self.send_response(answer.status)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            while chunk := answer.read1(65536):
                self.wfile.write(chunk)
                self.wfile.flush()
        except OSError:
            pass  # the client or the decode engine went away: closing the connection aborts it
        finally:
            if answer is not None:
                answer.close()
            connection.close()
            self.close_connection = True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--prefill", required=True, help="the prefill engine, http://host:port")
    parser.add_argument("--decode", required=True, help="the decode engine, http://host:port")
    args = parser.parse_args(argv)
    proxy = Proxy(args.port, args.prefill, args.decode)
    print(f"proxy on 127.0.0.1:{args.port}: prefill {args.prefill}, decode {args.decode}")
    proxy.serve_forever()


if __name__ == "__main__":
    main()
