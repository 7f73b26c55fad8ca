"""How long another request to a function waits while clients hold over-limit uploads open.

Serves `functions/control_plane.py` under functions-framework (gunicorn, 8 threads: the local stack's setting), opens
N connections that each announce a 100 MB body, send 1 KB of it and stay open, reads the first answers (413), then
times three GETs to the same function.

    python bench/slow_clients.py [--clients 1,8,24] [--root REPOSITORY]
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def measure(root: Path, clients: int) -> dict:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(root / "shared"), "THREADS": "8", "WORKERS": "1"}
    server = subprocess.Popen([sys.executable, "-m", "functions_framework", "--target", "control_plane", "--source",
                               str(root / "functions" / "control_plane.py"), "--signature-type", "http",
                               "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        held = []
        for _ in range(clients):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000000\r\n\r\n" + b"x" * 1000)
            held.append(sock)
        first_answers = []
        for sock in held[:3]:
            try:
                first_answers.append(sock.recv(200).split(b"\r\n", 1)[0].decode())
            except OSError as exc:
                first_answers.append(type(exc).__name__)
        waits = []
        for _ in range(3):
            started = time.perf_counter()
            other = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                other.request("GET", "/v1/runs")
                other.getresponse().read()
                waits.append(round(time.perf_counter() - started, 2))
            except OSError:
                waits.append("timed out at 30 s")
        for sock in held:
            sock.close()
        return {"clients": clients, "over_limit_answers": first_answers, "other_request_waits_s": waits}
    finally:
        os.killpg(server.pid, 9)
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,8,24")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository whose functions are served")
    args = parser.parse_args()
    for clients in (int(n) for n in args.clients.split(",")):
        print(measure(args.root.resolve(), clients), flush=True)


if __name__ == "__main__":
    main()
