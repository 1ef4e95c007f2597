"""Measure what one emulated link really carries: TCP throughput from host 0 to host 1 of the
cluster (benchmarks/cluster.sh), one stream, for a few seconds. Used by run_bench.sh, so the
shaped rate and the achieved rate appear side by side (a tbf at 10gbit on a 2-core VM is limited
by the CPU, not by the shaper).

    python benchmarks/netprobe.py server PORT            (in host 1; serves one client, exits)
    python benchmarks/netprobe.py client HOST PORT SECS  (in host 0; prints JSON)
"""
import json
import socket
import sys
import time

CHUNK = 1 << 20


def server(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    s.settimeout(60)
    c, _ = s.accept()
    buf = bytearray(CHUNK)
    total = 0
    while True:
        n = c.recv_into(buf)
        if not n:
            break
        total += n
    c.sendall(str(total).encode())
    c.close()


def client(host, port, secs):
    for _ in range(100):  # the server may still be starting
        try:
            c = socket.create_connection((host, port), timeout=30)
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise SystemExit(f"netprobe: cannot reach {host}:{port}")
    data = b"\0" * CHUNK
    sent, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < secs:
        c.sendall(data)
        sent += CHUNK
    c.shutdown(socket.SHUT_WR)
    got = int(c.recv(64).decode())
    dt = time.perf_counter() - t0
    print(json.dumps({"bytes": got, "seconds": round(dt, 3),
                      "mbit_per_s": round(got * 8 / dt / 1e6, 1)}))


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(int(sys.argv[2]))
    else:
        client(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
