#!/usr/bin/env python3
"""One row of the chaos table (scripts/chaos.sh): what every request of one run got.

Inputs: the load generator's lines (`SENT_MS KEY STATUS LATENCY_US TARGET HEADERS`, see
tests/src/bin/loadgen.rs), the apps' logs (tracing, one incident = one warning and one
recovery line), and the fault's times. `--header` prints the table's header instead.

Windows: a request was decided (by Redis's TIME, or by a process's clock under the local
fallback; one machine, one clock) at some moment between its send and its answer, so it is
counted in one of the fixed windows that interval touches. Every figure about windows takes
the most favourable placement the timing allows (a request sent at 999 ms and answered at
1001 ms may belong to either window): a figure above the limit or the bound is over-admission
no timing explains. Placement is an interval-to-window matching, solved greedily (earliest
deadline first is optimal for intervals on a line).
"""
import argparse
import datetime
import heapq
import re
import sys
from collections import defaultdict

COLUMNS = [
    ("fault", "<13"), ("policy", "<6"), ("503s", ">5"), ("stray 503s", ">10"),
    ("failed", ">6"), ("open admits", ">11"), ("over T+slack", ">12"),
    ("max/limit", ">9"), ("over limit", ">10"), ("vs bound", ">8"),
    ("Redis back", ">10"), ("recovered", ">9"), ("send gap", ">8"),
]

INCIDENT_START = (
    "rate-limit backend failed; deciding in memory",
    "rate-limit backend failed; applying the failure policy",
)
INCIDENT_END = (
    "rate-limit backend answers again; the local fallback stops",
    "rate-limit backend recovered",
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def header():
    return " ".join(f"{name:{fmt}}" for name, fmt in COLUMNS)


def parse_time(line):
    """Epoch ms of a tracing line's RFC 3339 timestamp, or None."""
    stamp = line.split(" ", 1)[0]
    try:
        t = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(t.timestamp() * 1000)


def incidents(path, end_ms):
    """The (start, end) epoch-ms intervals of one app's incidents; an incident still open at
    the end of the log ends at `end_ms` and is flagged."""
    out, start, still_open = [], None, False
    for raw in open(path, errors="replace"):
        line = ANSI.sub("", raw)
        t = parse_time(line)
        if t is None:
            continue
        if any(s in line for s in INCIDENT_START) and start is None:
            start = t
        elif any(s in line for s in INCIDENT_END) and start is not None:
            out.append((start, t))
            start = None
    if start is not None:
        out.append((start, end_ms))
        still_open = True
    return out, still_open


def assignable(reqs, cap):
    """How many of `reqs` ((first window, last window) each) fit when window w takes at most
    cap(w) of them (earliest deadline first)."""
    if not reqs:
        return 0
    reqs = sorted(reqs)
    lo, hi = reqs[0][0], max(b for _, b in reqs)
    heap, i, placed = [], 0, 0
    for w in range(lo, hi + 1):
        while i < len(reqs) and reqs[i][0] == w:
            heapq.heappush(heap, reqs[i][1])
            i += 1
        while heap and heap[0] < w:
            heapq.heappop(heap)
        room = cap(w)
        while heap and room > 0:
            heapq.heappop(heap)
            placed += 1
            room -= 1
    return placed


def least_excess(reqs, bound):
    """The least e such that every request fits with window w taking bound(w) + e: how far
    over its bound the worst window must be, with the most favourable placement."""
    if not reqs:
        return 0
    lo, hi = -max(bound(w) for r in reqs for w in range(r[0], r[1] + 1)), len(reqs)
    while lo < hi:
        mid = (lo + hi) // 2
        if assignable(reqs, lambda w: max(0, bound(w) + mid)) == len(reqs):
            hi = mid
        else:
            lo = mid + 1
    return lo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--header", action="store_true")
    ap.add_argument("--fault")
    ap.add_argument("--policy")
    ap.add_argument("--load", action="append", default=[], help="a loadgen output file")
    ap.add_argument("--log", action="append", default=[], help="an app's log")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--period-ms", type=int, default=1000)
    ap.add_argument("--timeout-ms", type=int, default=100)
    ap.add_argument("--slack-ms", type=int, default=100)
    ap.add_argument("--fault-ms", type=int, help="when the fault began (epoch ms)")
    ap.add_argument("--back-ms", type=int, help="when Redis answered again (epoch ms); 0: never")
    ap.add_argument("--lost", type=int, default=0,
                    help="1 when the fault may lose Redis's state (counts start again)")
    ap.add_argument("--faulted-keys", default="",
                    help="comma-separated client keys the fault reaches (default: all)")
    a = ap.parse_args()
    if a.header:
        print(header())
        return
    L, P = a.limit, a.period_ms
    faulted = set(k for k in a.faulted_keys.split(",") if k)

    reqs = []
    for path in a.load:
        for line in open(path):
            sent, key, status, us, target, headers = line.split()
            reqs.append((int(sent), key, int(status), int(us), int(target), int(headers)))
    end_ms = max((s + us // 1000 + 1 for s, _, _, us, _, _ in reqs), default=0)

    spans, never = [], False
    for log in a.log:
        got, still_open = incidents(log, end_ms)
        spans.extend(got)
        never = never or still_open

    refused = stray = failed = open_admits = slow = 0
    last_bad = None
    admitted = defaultdict(list)  # key -> [(first window, last window)]
    for sent, key, status, us, _target, headers in reqs:
        recv = sent + (us + 999) // 1000 + 1
        if status in (0, 503):
            refused += status == 503
            failed += status == 0
            if sent < a.fault_ms or (faulted and key not in faulted):
                stray += 1
            if a.back_ms and recv >= a.back_ms:
                last_bad = recv if last_bad is None else max(last_bad, recv)
        if us > (a.timeout_ms + a.slack_ms) * 1000:
            slow += 1
        if status == 200:
            if a.policy == "open" and not headers:
                # Admitted failing open: no decision was made, nothing limits it.
                open_admits += 1
                continue
            admitted[key].append((sent // P, recv // P))

    # Recovery: from when Redis answered again to the last moment the fleet was still
    # failing (the last 503 or unanswered request, the end of the last incident).
    if not a.back_ms:
        recovered = "never"
    elif never:
        recovered = "never"
    else:
        ends = [e for _, e in spans if e >= a.back_ms]
        if last_bad is not None:
            ends.append(last_bad)
        recovered = f"{max([0] + [e - a.back_ms for e in ends]) / 1000:.2f}s"
    fault_end = max([a.back_ms or end_ms] + [e for _, e in spans])

    def overlaps(w, lo, hi):
        return lo < (w + 1) * P and hi >= w * P

    def bound(key):
        reached = not faulted or key in faulted

        def b(w):
            n = 1
            if a.lost and reached and a.back_ms and w == a.fault_ms // P == a.back_ms // P:
                # Redis may have forgotten admissions of this window (a restart without
                # persistence, writes a failover did not carry over) and admitted them again
                # after it came back. Only a window holding both moments can count twice.
                n += 1
            if a.policy == "local" and reached and (
                overlaps(w, a.fault_ms, fault_end)
                or any(overlaps(w, lo, hi) for lo, hi in spans)
            ):
                # Each process, deciding locally: what it last learned (r), or what the
                # window refills — at most L per window and outage.
                n += len(a.log)
            return n * L
        return b

    worst = max((least_excess(r, lambda w: 0) for r in admitted.values()), default=0)
    over = sum(len(r) - assignable(r, lambda w: L) for r in admitted.values())
    vs_bound = max((least_excess(r, bound(k)) for k, r in admitted.items()), default=0)
    # The load generator's longest pause between two sends (scheduled every 1/RATE s): a
    # stall of the machine itself, which delays answers as much as any Redis fault.
    sends = sorted(r[0] for r in reqs)
    gap = max((b - x for x, b in zip(sends, sends[1:])), default=0)
    back = f"{(a.back_ms - a.fault_ms) / 1000:.2f}s" if a.back_ms else "never"
    row = [a.fault, a.policy, refused, stray, failed, open_admits, slow, f"{worst}/{L}", over,
           f"{vs_bound:+d}", back, recovered, f"{gap}ms"]
    print(" ".join(f"{str(v):{fmt}}" for v, (_, fmt) in zip(row, COLUMNS)))


if __name__ == "__main__":
    sys.exit(main())
