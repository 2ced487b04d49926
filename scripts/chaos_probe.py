#!/usr/bin/env python3
"""Tells scripts/chaos.sh when a Redis deployment on 127.0.0.1 serves again after a fault.

  chaos_probe.py READY SECONDS CHECK ARGS...

Checks CHECK every 5 ms, each try on a fresh connection with a 200 ms timeout; creates the
file READY once the first try is done (start the fault after that), and prints the epoch ms of
the first try that succeeds after one that failed: the moment the deployment served again,
within a few ms (a redis-cli per try, or a Python started after the fault, would be late by
tens or hundreds of ms on a busy machine). Exits 1, printing nothing, if that does not happen
within SECONDS. CHECK is one of:

  ping PORT                 PORT answers PING
  master-at VIA PORT        a connection to VIA (a proxy) reaches PORT (INFO server's
                            tcp_port), which answers ROLE as a master
  cluster-master PORT       PORT answers ROLE as a master and CLUSTER INFO cluster_state:ok
  sentinels PORT S...       every Sentinel S names 127.0.0.1:PORT as the primary of `chaos`,
                            and PORT answers ROLE as a master
"""
import socket
import sys
import time


def call(port, *words):
    """One command on a fresh connection; the reply's text, or None when there is none."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"*%d\r\n" % len(words)
                      + b"".join(b"$%d\r\n%s\r\n" % (len(w), w.encode()) for w in words))
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                if complete(data):
                    return data.decode(errors="replace")
    except OSError:
        return None
    return None


def complete(data):
    """Whether `data` holds one whole RESP reply (enough of it for the checks below)."""
    try:
        _, end = parse(data, 0)
        return end is not None
    except (ValueError, IndexError):
        return False


def parse(data, i):
    """Parses one RESP2 reply at i: (value, index after it), or (None, None) if incomplete."""
    nl = data.find(b"\r\n", i)
    if nl < 0:
        return None, None
    kind, line = data[i:i + 1], data[i + 1:nl]
    if kind in (b"+", b"-", b":"):
        return line, nl + 2
    if kind == b"$":
        n = int(line)
        if n < 0:
            return None, nl + 2
        if len(data) < nl + 2 + n + 2:
            return None, None
        return data[nl + 2:nl + 2 + n], nl + 2 + n + 2
    if kind == b"*":
        n, j, items = int(line), nl + 2, []
        for _ in range(max(n, 0)):
            v, j = parse(data, j)
            if j is None:
                return None, None
            items.append(v)
        return items, j
    raise ValueError(kind)


def is_master(port):
    r = call(port, "ROLE")
    return r is not None and "\r\nmaster\r\n" in r


def check(what, args):
    if what == "ping":
        r = call(args[0], "PING")
        return r is not None and r.startswith("+PONG")
    if what == "master-at":
        via, port = args
        r = call(via, "INFO", "server")
        return r is not None and f"tcp_port:{port}\r\n" in r and is_master(via)
    if what == "cluster-master":
        if not is_master(args[0]):
            return False
        r = call(args[0], "CLUSTER", "INFO")
        return r is not None and "cluster_state:ok" in r
    if what == "sentinels":
        port, sentinels = args[0], args[1:]
        for s in sentinels:
            r = call(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "chaos")
            if r is None or f"${len(str(port))}\r\n{port}\r\n" not in r:
                return False
        return is_master(port)
    raise SystemExit(f"unknown check {what}")


def main():
    ready, within, what = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    args = [int(a) for a in sys.argv[4:]]
    deadline = time.monotonic() + within
    failed = first = False
    while time.monotonic() < deadline:
        ok = check(what, args)
        if not first:
            first = True
            open(ready, "w").close()
        if ok and failed:
            print(int(time.time() * 1000))
            return 0
        failed = failed or not ok
        time.sleep(0.005)
    return 1


if __name__ == "__main__":
    sys.exit(main())
