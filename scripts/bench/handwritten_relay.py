#!/usr/bin/env python3
"""The documented baseline: the outbox relay a user writes from the usual articles.

THIS IS NOT `outbox`. It is the yardstick that `outbox relay` is measured against in
docs/benchmarks.md (issue 2): the loop the seed articles describe, written the way they
describe it, in Python with psycopg 3 and nats-py, against the same table, the same backlog
and the same NATS JetStream server as the real relay.

    loop:
        BEGIN
        SELECT id, aggregate_type, aggregate_id, event_type, payload
          FROM outbox WHERE state = 'pending'
          ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED
        for each row:  await js.publish(subject, payload, headers={"Nats-Msg-Id": id})
                       # one message at a time, each publish waits for its JetStream ack
        UPDATE outbox SET state = 'delivered', delivered_at = now() WHERE id = ANY(ids)
        COMMIT
        (sleep briefly when nothing was pending)

It is deliberately the straightforward version: no pipelining of publishes, no batching of
acks, one process. It is correct in the at-least-once sense (rows are marked only after the
broker acknowledged them), which is what makes it a fair baseline.

Runs until SIGTERM / SIGINT (finishes the batch in hand, then exits), or with --until-empty
exits on its own once a claim comes back empty.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time

import nats
import psycopg

CLAIM = """
    SELECT id, aggregate_type, aggregate_id, event_type, payload
    FROM outbox
    WHERE state = 'pending'
    ORDER BY seq
    LIMIT %s
    FOR UPDATE SKIP LOCKED
"""

MARK = "UPDATE outbox SET state = 'delivered', delivered_at = now() WHERE id = ANY(%s)"


async def run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    nc = await nats.connect(args.nats_url)
    js = nc.jetstream()
    conn = await psycopg.AsyncConnection.connect(args.db_url, autocommit=False)

    delivered = 0
    started = time.monotonic()
    try:
        while not stop.is_set():
            # BEGIN is implicit: psycopg opens a transaction at the first statement.
            cur = await conn.execute(CLAIM, (args.batch,))
            rows = await cur.fetchall()
            if not rows:
                await conn.commit()
                if args.until_empty:
                    break
                try:
                    await asyncio.wait_for(stop.wait(), timeout=args.idle_sleep)
                except asyncio.TimeoutError:
                    pass
                continue
            ids = []
            for event_id, aggregate_type, _aggregate_id, _event_type, payload in rows:
                # One publish at a time, each awaiting its JetStream acknowledgement.
                await js.publish(
                    f"{args.subject_prefix}.{aggregate_type}",
                    bytes(payload),
                    headers={"Nats-Msg-Id": str(event_id)},
                )
                ids.append(event_id)
            await conn.execute(MARK, (ids,))
            await conn.commit()
            delivered += len(ids)
    finally:
        elapsed = time.monotonic() - started
        await conn.close()
        await nc.drain()
    rate = delivered / elapsed if elapsed > 0 else 0.0
    print(
        f"handwritten relay: delivered {delivered} events in {elapsed:.2f}s ({rate:.0f}/s)",
        file=sys.stderr,
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db-url", required=True, help="postgres://... of the database holding `outbox`")
    p.add_argument("--nats-url", required=True, help="nats://host:port (JetStream enabled)")
    p.add_argument("--batch", type=int, default=100, help="LIMIT of the claim (default 100)")
    p.add_argument(
        "--subject-prefix",
        default="outbox.event",
        help="subject = PREFIX.<aggregate_type> (default outbox.event, as `outbox relay`)",
    )
    p.add_argument("--idle-sleep", type=float, default=0.1, help="pause when nothing is pending (s)")
    p.add_argument("--until-empty", action="store_true", help="exit once a claim finds nothing")
    return asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
