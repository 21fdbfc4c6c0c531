#!/usr/bin/env python3
"""The documented MySQL baseline: the outbox relay a user writes from the usual articles.

THIS IS NOT `outbox`. It is the yardstick for `outbox relay` over MySQL/MariaDB in
docs/benchmarks.md (issue 14): the same loop as handwritten_relay.py (the PostgreSQL
baseline), over the same MySQL table, backlog and NATS JetStream server as the real relay,
in Python with PyMySQL and nats-py.

    loop:
        BEGIN
        SELECT position, id, aggregate_type, payload FROM outbox
         WHERE state = 'pending' ORDER BY position LIMIT 100 FOR UPDATE SKIP LOCKED
        for each row:  await js.publish(subject, payload, headers={"Nats-Msg-Id": id})
                       # one message at a time, each publish waits for its JetStream ack
        UPDATE outbox SET state = 'delivered', delivered_at = NOW(6) WHERE position IN (...)
        COMMIT

Straightforward on purpose (no pipelined publishes, one process), and correct in the
at-least-once sense: rows are marked only after the broker acknowledged them. Exits once a
claim comes back empty (--until-empty) or on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from urllib.parse import unquote, urlparse

import nats
import pymysql

CLAIM = """
    SELECT position, id, aggregate_type, payload
    FROM outbox
    WHERE state = 'pending'
    ORDER BY position
    LIMIT %s
    FOR UPDATE SKIP LOCKED
"""


def connect(url: str) -> pymysql.connections.Connection:
    u = urlparse(url)
    return pymysql.connect(
        host=u.hostname or "127.0.0.1",
        port=u.port or 3306,
        user=unquote(u.username or "root"),
        password=unquote(u.password or ""),
        database=u.path.lstrip("/"),
        autocommit=False,
    )


async def run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    nc = await nats.connect(args.nats_url)
    js = nc.jetstream()
    conn = connect(args.db_url)
    delivered = 0
    started = time.monotonic()
    try:
        while not stop.is_set():
            with conn.cursor() as cur:
                cur.execute("BEGIN")
                cur.execute(CLAIM, (args.batch,))
                rows = cur.fetchall()
                if not rows:
                    conn.commit()
                    if args.until_empty:
                        break
                    await asyncio.sleep(args.idle_sleep)
                    continue
                positions = []
                for position, event_id, aggregate_type, payload in rows:
                    await js.publish(
                        f"{args.subject_prefix}.{aggregate_type}",
                        bytes(payload),
                        headers={"Nats-Msg-Id": str(event_id)},
                    )
                    positions.append(position)
                marks = ", ".join(["%s"] * len(positions))
                cur.execute(
                    "UPDATE outbox SET state = 'delivered', delivered_at = NOW(6) "
                    f"WHERE position IN ({marks})",
                    positions,
                )
                conn.commit()
                delivered += len(positions)
    finally:
        elapsed = time.monotonic() - started
        conn.close()
        await nc.drain()
    rate = delivered / elapsed if elapsed > 0 else 0.0
    print(f"{delivered} {elapsed:.3f} {rate:.0f}")
    print(
        f"handwritten relay (MySQL): delivered {delivered} events in {elapsed:.2f}s ({rate:.0f}/s)",
        file=sys.stderr,
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db-url", required=True, help="mysql://user:pw@host:port/db holding `outbox`")
    p.add_argument("--nats-url", required=True, help="nats://host:port (JetStream enabled)")
    p.add_argument("--batch", type=int, default=100, help="LIMIT of the claim (default 100)")
    p.add_argument("--subject-prefix", default="outbox.event")
    p.add_argument("--idle-sleep", type=float, default=0.1)
    p.add_argument("--until-empty", action="store_true")
    return asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
