"""What a third-party AMQP client gets from the same RabbitMQ, for comparison with the sink.

    python rabbitmq_client.py AMQP_URL EVENTS [WINDOW]

Publishes EVENTS messages like the sink's (persistent, mandatory, a message id, four string
headers, a ~40-byte JSON body) to the `bench` exchange with routing key `bench.Order`, through
aio-pika with publisher confirms, WINDOW messages in flight (default 500, the relay's batch):
each window is published at once and its confirms awaited together, as the sink does. Prints
messages/s on stdout. The `bench` queue must be bound (drain_brokers.sh's rabbit_queue).
"""

import asyncio
import sys
import time
import uuid

import aio_pika


async def main(url: str, events: int, window: int) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange("bench")
        start = time.monotonic()
        sent = 0
        while sent < events:
            n = min(window, events - sent)
            batch = []
            for i in range(sent, sent + n):
                body = ('{"order_id":"o_%d","n":%d}' % (i % 1000, i)).encode()
                message = aio_pika.Message(
                    body,
                    message_id=str(uuid.uuid4()),
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    headers={
                        "id": str(uuid.uuid4()),
                        "event_type": "order.placed",
                        "aggregate_type": "Order",
                        "aggregate_id": "o_%d" % (i % 1000),
                    },
                )
                batch.append(exchange.publish(message, "bench.Order", mandatory=True))
            await asyncio.gather(*batch)
            sent += n
        elapsed = time.monotonic() - start
    print(f"{events / elapsed:.0f}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 500))
