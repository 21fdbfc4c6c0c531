#!/usr/bin/env python3
"""Helpers for scripts/bench/drain.sh (timing, NATS stream setup, latency run, report).

Subcommands:
  reset-stream   delete and recreate the JetStream stream both relays publish into
  stream-count   print how many messages the stream holds
  drain          start a command, time it until no row is pending, then stop it
  latency        fixed-rate producer + Prometheus histogram scrape (commit -> ack)
  assemble       build the results JSON (with ratios) from drain.sh's work directory
  report         print the results table and ratios of a results JSON file
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

STREAM = "OUTBOX"
SUBJECTS = ["outbox.event.>"]
PENDING = "SELECT count(*) FROM outbox WHERE state = 'pending'"


# --------------------------------------------------------------------------------- NATS


async def _reset_stream(url: str) -> None:
    import nats
    from nats.js.api import StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        await js.delete_stream(STREAM)
    except NotFoundError:
        pass
    # The same stream `outbox relay` creates when none covers its subjects: file storage,
    # 2-minute duplicate window, everything else default. Created here so that both relays
    # publish into an identical, empty stream.
    await js.add_stream(
        StreamConfig(
            name=STREAM,
            subjects=SUBJECTS,
            storage=StorageType.FILE,
            duplicate_window=120.0,
        )
    )
    await nc.close()


async def _stream_count(url: str) -> int:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    info = await js.stream_info(STREAM)
    await nc.close()
    return info.state.messages


# -------------------------------------------------------------------------------- drain

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int | None, children: bool = False) -> float:
    """CPU seconds of a process (with children=True also its reaped children: for the
    postmaster that is every backend that has exited)."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + ((cutime + cstime) if children else 0)) / _TICK


def _pg_cpu(postmaster: int | None) -> float:
    """CPU seconds of the whole PostgreSQL instance: postmaster with its reaped children, plus
    every live child process (backends, checkpointer, walwriter, autovacuum, ...)."""
    if not postmaster:
        return 0.0
    total = _proc_cpu(postmaster, children=True)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == postmaster:
                total += _proc_cpu(int(entry))
    return total


def _machine_busy() -> float:
    """CPU seconds the whole machine spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice
    idle = v[3] + v[4]
    busy = sum(v[:8]) - idle
    return busy / _TICK


def _self_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def wait_quiet(args: argparse.Namespace) -> int:
    """Waits (up to --max seconds) until the machine has been nearly idle for --window
    seconds: other sessions share this machine, and a scenario started while someone
    compiles measures them as much as us. Prints what it did as JSON."""
    t0 = time.monotonic()
    quiet = False
    busy_seen = None
    while True:
        b0 = _machine_busy()
        time.sleep(args.window)
        busy_seen = (_machine_busy() - b0) / args.window
        if busy_seen <= args.threshold:
            quiet = True
            break
        if time.monotonic() - t0 >= args.max:
            break
    print(json.dumps({"waited_s": round(time.monotonic() - t0, 1), "quiet": quiet,
                      "busy_cores_before": round(busy_seen, 2)}))
    return 0


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _xacts(db_url: str) -> tuple[int, int]:
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as c:
        return c.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()


def drain(args: argparse.Namespace) -> int:
    import psycopg

    conn = psycopg.connect(args.db_url, autocommit=True)
    rows = conn.execute(PENDING).fetchone()[0]
    log = open(args.log, "ab")
    stop_sig = signal.SIGINT if args.stop_signal == "INT" else signal.SIGTERM

    xact0 = _xacts(args.db_url)
    cpu0 = {
        "machine": _machine_busy(),
        "self": _self_cpu(),
        "postgres": _pg_cpu(args.pg_pid),
        "nats_server": _proc_cpu(args.nats_pid),
        "command": _children_cpu(),
    }
    t0 = time.monotonic()
    proc = subprocess.Popen(args.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    pending = rows
    polls = 0
    elapsed = None
    error = None
    while True:
        time.sleep(args.poll)
        pending = conn.execute(PENDING).fetchone()[0]
        polls += 1
        now = time.monotonic()
        if pending == 0:
            elapsed = now - t0
            break
        if proc.poll() is not None:
            error = f"exited with {proc.returncode} while {pending} rows were still pending"
            break
        if now - t0 > args.timeout:
            error = f"timed out after {args.timeout}s with {pending} rows pending"
            break

    exit_code = proc.poll()
    stop_elapsed = None
    if exit_code is None:
        t_stop = time.monotonic()
        proc.send_signal(stop_sig)
        try:
            exit_code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            exit_code = proc.wait()
            error = (error or "") + " (did not stop within 30s of the signal; killed)"
        stop_elapsed = time.monotonic() - t_stop
    log.close()

    remaining = conn.execute("SELECT count(*) FROM outbox").fetchone()[0]
    conn.close()
    # Let the postmaster reap the finished backends (their CPU and stats land on exit).
    time.sleep(0.3)
    wall = time.monotonic() - t0
    cpu = {
        "postgres": _pg_cpu(args.pg_pid) - cpu0["postgres"],
        "nats_server": _proc_cpu(args.nats_pid) - cpu0["nats_server"],
        "command": _children_cpu() - cpu0["command"],
    }
    # Everything else the machine did meanwhile (other sessions, the kernel, this poller):
    # a scenario with much of it was measured on a busy machine.
    cpu["other"] = (_machine_busy() - cpu0["machine"]) - sum(cpu.values())
    cpu["poller"] = _self_cpu() - cpu0["self"]
    xact1 = _xacts(args.db_url)
    # Our own transactions: the row count above, the polls, the final count, and the two
    # pg_stat_database reads.
    commits = xact1[0] - xact0[0] - (polls + 3)
    result = {
        "rows": rows,
        "elapsed_s": round(elapsed, 3) if elapsed is not None else None,
        "rows_per_s": round(rows / elapsed, 1) if elapsed else None,
        "poll_interval_s": args.poll,
        "polls": polls,
        "rows_left_in_table": remaining,
        "exit_code": exit_code,
        "stop_s": round(stop_elapsed, 3) if stop_elapsed is not None else None,
        "error": error,
        # Database transactions of the measured command (claims + outcomes; a claim that
        # found nothing commits too), and rows per transaction.
        "db_commits": commits,
        "db_rollbacks": xact1[1] - xact0[1],
        "rows_per_commit": round(rows / commits, 1) if commits > 0 else None,
        # CPU seconds from the start until just after the stop (cpu_wall_s), per component;
        # `command` is the relay / pgbench / baseline, `other` the rest of the machine
        # (includes `poller`, this script). Nearly all of it falls inside elapsed_s, so
        # cpu_s / elapsed_s is how many cores each kept busy.
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "cpu_wall_s": round(wall, 2),
    }
    json.dump(result, sys.stdout)
    print()
    return 0 if error is None else 1


# ------------------------------------------------------------------------------ latency


def _histogram(metrics_text: str, name: str) -> tuple[list[tuple[float, float]], float, float]:
    buckets = []
    total = count = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(name + "_bucket"):
            m = re.search(r'le="([^"]+)"\}\s+(\S+)', line)
            le = math.inf if m.group(1) == "+Inf" else float(m.group(1))
            buckets.append((le, float(m.group(2))))
        elif line.startswith(name + "_sum"):
            total = float(line.split()[-1])
        elif line.startswith(name + "_count"):
            count = float(line.split()[-1])
    buckets.sort()
    return buckets, total, count


def _diff_histograms(after, before):
    b = dict(before[0])
    buckets = [(le, c - b.get(le, 0.0)) for le, c in after[0]]
    return buckets, after[1] - before[1], after[2] - before[2]


def _quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus-style histogram_quantile: linear interpolation inside the bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le  # beyond the last finite bound: report the bound
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return None


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def latency(args: argparse.Namespace) -> int:
    """Runs the producer command (a rate-limited pgbench) against a running relay and reads
    the relay's commit->ack histogram before and after; the difference covers exactly the
    events of this run."""
    import psycopg

    name = "outbox_commit_to_ack_seconds"
    deadline = time.monotonic() + 30
    while True:
        try:
            before = _histogram(_scrape(args.metrics_url), name)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

    conn = psycopg.connect(args.db_url, autocommit=True)
    t0 = time.monotonic()
    prod = subprocess.run(args.cmd, capture_output=True, text=True)
    produce_s = time.monotonic() - t0
    if prod.returncode != 0:
        print(prod.stdout + prod.stderr, file=sys.stderr)
        raise SystemExit(f"producer failed with exit code {prod.returncode}")
    # Let the relay catch up, then read the histogram.
    deadline = time.monotonic() + 60
    while conn.execute(PENDING).fetchone()[0] > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    left = conn.execute(PENDING).fetchone()[0]
    time.sleep(0.5)
    after = _histogram(_scrape(args.metrics_url), name)
    conn.close()
    buckets, total, count = _diff_histograms(after, before)

    def grab(pattern):
        m = re.search(pattern, prod.stdout)
        return float(m.group(1)) if m else None

    result = {
        "target_rate": args.rate,
        "producer_s": round(produce_s, 2),
        "producer_tps": grab(r"tps = ([0-9.]+)"),
        "producer_txns": grab(r"number of transactions actually processed: ([0-9]+)"),
        "producer_schedule_lag_ms": grab(r"rate limit schedule lag: avg ([0-9.]+)"),
        "producer_latency_ms": grab(r"latency average = ([0-9.]+) ms"),
        "pending_after_catch_up": left,
        "acked_in_window": int(count),
        "mean_s": round(total / count, 6) if count else None,
        "p50_s": _quantile(buckets, 0.50),
        "p90_s": _quantile(buckets, 0.90),
        "p99_s": _quantile(buckets, 0.99),
        "buckets": [[("+Inf" if math.isinf(le) else le), c] for le, c in buckets],
    }
    for k in ("p50_s", "p90_s", "p99_s"):
        if result[k] is not None:
            result[k] = round(result[k], 6)
    json.dump(result, sys.stdout)
    print()
    return 0


# ------------------------------------------------------------------------------- report


def _fmt_rate(x):
    return "-" if x is None else f"{x:,.0f}"


def report_markdown(res: dict) -> None:
    """The tables of docs/benchmarks.md. A run marked † had more than 0.3 cores of other work
    on the machine while it was measured."""
    sc = res["scenarios"]
    print("| scenario | rows | median rows/s | each run, rows/s | rows/txn | CPU cores: pg / nats / relay·client / other |")
    print("| --- | ---: | ---: | --- | ---: | --- |")
    for key, s in sc.items():
        runs = []
        rr = s.get("runs_rows_per_s", [])
        oc = s.get("runs_other_cores") or [None] * len(rr)
        for r, o in zip(rr, oc):
            t = f"{r / 1000:.1f}k" if r else "failed"
            if o is not None and o > 0.3:
                t += "†"
            runs.append(t)
        cpu = s.get("cpu_s") or {}
        el = s.get("elapsed_s")
        parts = ("postgres", "nats_server", "command", "other")
        busy = " / ".join(f"{max(cpu.get(x, 0), 0) / el:.2f}" if x in cpu else "n/a" for x in parts) if cpu and el else "-"
        rpc = "-" if s.get("what") == "pgbench" or not s.get("rows_per_commit") else f"{s['rows_per_commit']:.0f}"
        rate = f"**{s['rows_per_s']:,.0f}**" if s.get("rows_per_s") else "failed"
        print(f"| `{key}` | {s.get('rows', 0):,} | {rate} | {' · '.join(runs)} | {rpc} | {busy} |")
    print()
    print("| ratio | of the medians | per round | target |")
    print("| --- | ---: | --- | --- |")
    for r in res.get("ratios", []):
        def f(x):
            return "-" if x is None else (f"{x:.1f}×" if r["unit"] == "x" else f"{x:.0%}")
        print(f"| {r['name']} | **{f(r['value'])}** | {' · '.join(f(x) for x in r.get('per_round', []))} | {r['target']} |")
    lat = res.get("latency")
    if lat and not lat.get("error"):
        print()
        print(f"Latency at {lat['target_rate']:.0f} events/s (producer achieved {lat['producer_tps']:.0f}/s, "
              f"{lat['acked_in_window']} events): p50 {lat['p50_s'] * 1000:.1f} ms, p90 {lat['p90_s'] * 1000:.1f} ms, "
              f"p99 {lat['p99_s'] * 1000:.1f} ms, mean {lat['mean_s'] * 1000:.1f} ms.")


def report(args: argparse.Namespace) -> int:
    with open(args.results) as f:
        res = json.load(f)
    if args.markdown:
        report_markdown(res)
        return 0
    sc = res["scenarios"]
    print()
    print(f"outbox drain benchmark, {res['date']}  ({res['machine']['nproc']} cores, "
          f"{res['machine']['cpu']}, {res['machine']['mem_gib']} GiB)")
    print()
    ncpu = res["machine"]["nproc"]
    print(f"{'scenario (median run)':<31} {'rows':>7} {'seconds':>7} {'rows/s':>8} {'min-max rows/s':>16} "
          f"{'rows/txn':>8}  CPU cores (of {ncpu}): pg / nats / relay|client / other")
    print("-" * 132)
    for key, s in sc.items():
        el = s.get("elapsed_s")
        cpu = s.get("cpu_s") or {}
        wall = s.get("elapsed_s")
        if cpu and wall:
            # `other` is a difference of two clocks read at slightly different moments; a
            # few hundredths below zero mean zero.
            busy = " / ".join(f"{max(cpu.get(k, 0), 0) / wall:.2f}" for k in ("postgres", "nats_server", "command", "other"))
        else:
            busy = "-"
        # pgbench keeps committing empty claims between the end of the drain and the next
        # poll (up to 100 ms at ~1,000/s per client), so its rows per transaction is not
        # comparable; shown for the relays only.
        rpc = None if s.get("what") == "pgbench" else s.get("rows_per_commit")
        spread = (f"{s['min_rows_per_s'] / 1000:.1f}k-{s['max_rows_per_s'] / 1000:.1f}k"
                  if s.get("min_rows_per_s") and len(s.get("runs_rows_per_s", [])) > 1 else "")
        print(f"{key:<31} {s.get('rows', 0):>7} {('-' if el is None else f'{el:.2f}'):>7} "
              f"{_fmt_rate(s.get('rows_per_s')):>8} {spread:>16} {('-' if rpc is None else f'{rpc:.0f}'):>8}  {busy}"
              + (f"  [{s['runs_not_quiet']} run(s) started on a busy machine]" if s.get("runs_not_quiet") else "")
              + (f"   ERROR: {s['error']}" if s.get("error") else ""))
    if res.get("ratios"):
        print()
        print(f"{'ratio (of the medians)':<56} {'value':>7}  {'per round':<22} target")
        print("-" * 125)

        def fmt(x, unit):
            if x is None:
                return "-"
            return f"{x:.1f}x" if unit == "x" else f"{x:.0%}"

        for r in res["ratios"]:
            per = " ".join(fmt(x, r["unit"]) for x in r.get("per_round", [])) if len(r.get("per_round", [])) > 1 else ""
            print(f"{r['name']:<56} {fmt(r['value'], r['unit']):>7}  {per:<22} {r.get('target', '')}")
    lat = res.get("latency")
    if lat:
        print()
        if lat.get("error"):
            print(f"latency: ERROR {lat['error']}")
        else:
            def ms(x):
                return "-" if x is None else f"{x * 1000:.1f} ms"
            print(f"commit->ack latency at {lat['target_rate']:.0f}/s (producer achieved {lat['producer_tps']}/s, "
                  f"{lat['acked_in_window']} events): p50 {ms(lat['p50_s'])}, p90 {ms(lat['p90_s'])}, "
                  f"p99 {ms(lat['p99_s'])}, mean {ms(lat['mean_s'])} (from histogram buckets)")
    print()
    return 0


def assemble(args: argparse.Namespace) -> int:
    """Builds the results file from drain.sh's work directory: meta.json, scenarios/NN_key.json
    (in run order) and latency.json if the latency run happened."""
    with open(os.path.join(args.work, "meta.json")) as f:
        res = json.load(f)
    runs: dict[str, list[dict]] = {}
    sdir = os.path.join(args.work, "scenarios")
    for name in sorted(os.listdir(sdir)):
        if name.endswith(".json"):
            key = name[4:-5].rsplit("@", 1)[0]
            with open(os.path.join(sdir, name)) as f:
                runs.setdefault(key, []).append(json.load(f))
    res["scenarios"] = {}
    for key, rs in runs.items():
        ok = [r for r in rs if r.get("rows_per_s") and not r.get("error")]
        if ok:
            # The median run (the lower middle one for an even count) stands for the scenario.
            ok.sort(key=lambda r: r["rows_per_s"])
            s = dict(ok[(len(ok) - 1) // 2])
        else:
            s = dict(rs[-1])
        s["runs_rows_per_s"] = [r.get("rows_per_s") for r in rs]
        # Runs that started while the machine was still busy with other work.
        s["runs_not_quiet"] = sum(1 for r in rs if (r.get("quiet_wait") or {}).get("quiet") is False)
        s["runs_other_cores"] = [
            round(r["cpu_s"]["other"] / r["elapsed_s"], 2) if r.get("cpu_s") and r.get("elapsed_s") and "other" in r["cpu_s"] else None
            for r in rs
        ]
        s["runs_failed"] = len(rs) - len(ok)
        if ok:
            s["min_rows_per_s"] = ok[0]["rows_per_s"]
            s["max_rows_per_s"] = ok[-1]["rows_per_s"]
        res["scenarios"][key] = s
    lat = os.path.join(args.work, "latency.json")
    if os.path.exists(lat):
        with open(lat) as f:
            res["latency"] = json.load(f)
    add_ratios(res)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    return 0


def add_ratios(res: dict) -> None:
    """Adds the ratio list (the pairs drain.sh measured) to a results dict."""
    sc = res["scenarios"]

    def rate(k):
        s = sc.get(k)
        return None if not s or s.get("error") else s.get("rows_per_s")

    out = []

    def add(name, num, den, unit, target):
        a, b = rate(num), rate(den)
        ra = (sc.get(num) or {}).get("runs_rows_per_s") or []
        rb = (sc.get(den) or {}).get("runs_rows_per_s") or []
        out.append({
            "name": name, "numerator": num, "denominator": den, "unit": unit, "target": target,
            # Ratio of the two medians.
            "value": (a / b) if a and b else None,
            # Ratio within each round (both runs measured minutes apart at most).
            "per_round": [round(x / y, 3) if x and y else None for x, y in zip(ra, rb)],
        })

    add("relay(delete) / hand-written, into JetStream", "nats.relay.delete", "nats.handwritten", "x", ">= 10x (aim 20x)")
    add("relay(mark) / hand-written, into JetStream", "nats.relay.mark", "nats.handwritten", "x", ">= 10x (aim 20x)")
    for k in sc:
        if k.startswith("nats.relay.delete."):
            add(f"context: {k[len('nats.relay.'):]} / hand-written", k, "nats.handwritten", "x", "(not a target)")
    for b in res["params"]["ceiling_batches"]:
        for mode in ("delete", "mark"):
            add(f"null-sink relay / pgbench claim+{mode}, batch {b}",
                f"null.relay.{mode}.b{b}", f"pgbench.claim_{mode}.b{b}", "%", ">= 80%")
    for mode in ("delete", "mark"):
        add(f"1 worker vs 1 client: null-sink relay / pgbench claim+{mode}, batch 500",
            f"null.relay.{mode}.b500.w1", f"pgbench.claim_{mode}.b500.c1", "%", "(context)")
    add("hand-written relay / pgbench of its own statements",
        "nats.handwritten", "pgbench.handwritten.b100", "%", "(how far the baseline is from its DB ceiling)")
    res["ratios"] = out


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd_name", required=True)

    s = sub.add_parser("reset-stream")
    s.add_argument("--nats-url", required=True)
    s = sub.add_parser("stream-count")
    s.add_argument("--nats-url", required=True)

    s = sub.add_parser("drain")
    s.add_argument("--db-url", required=True)
    s.add_argument("--log", required=True)
    s.add_argument("--poll", type=float, default=0.1)
    s.add_argument("--timeout", type=float, default=900)
    s.add_argument("--stop-signal", choices=["TERM", "INT"], default="TERM")
    s.add_argument("--pg-pid", type=int, help="postmaster pid, for CPU accounting")
    s.add_argument("--nats-pid", type=int, help="nats-server pid, for CPU accounting")
    s.add_argument("cmd", nargs=argparse.REMAINDER)

    s = sub.add_parser("wait-quiet")
    s.add_argument("--max", type=float, default=60)
    s.add_argument("--window", type=float, default=2)
    s.add_argument("--threshold", type=float, default=0.25, help="busy cores")

    s = sub.add_parser("latency")
    s.add_argument("--db-url", required=True)
    s.add_argument("--metrics-url", required=True)
    s.add_argument("--rate", type=float, default=1000, help="the producer's rate (for the record)")
    s.add_argument("cmd", nargs=argparse.REMAINDER)

    s = sub.add_parser("report")
    s.add_argument("results")
    s.add_argument("--markdown", action="store_true", help="the tables of docs/benchmarks.md")
    s = sub.add_parser("assemble")
    s.add_argument("--work", required=True)
    s.add_argument("--out", required=True)

    args = p.parse_args()
    if args.cmd_name == "reset-stream":
        asyncio.run(_reset_stream(args.nats_url))
        return 0
    if args.cmd_name == "stream-count":
        print(asyncio.run(_stream_count(args.nats_url)))
        return 0
    if args.cmd_name == "drain":
        if args.cmd and args.cmd[0] == "--":
            args.cmd = args.cmd[1:]
        return drain(args)
    if args.cmd_name == "wait-quiet":
        return wait_quiet(args)
    if args.cmd_name == "latency":
        if args.cmd and args.cmd[0] == "--":
            args.cmd = args.cmd[1:]
        return latency(args)
    if args.cmd_name == "report":
        return report(args)
    if args.cmd_name == "assemble":
        return assemble(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
