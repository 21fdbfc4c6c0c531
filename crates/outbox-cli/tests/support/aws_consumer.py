#!/usr/bin/env python3
"""A consumer of what the outbox relay published to AWS, written with boto3 as an application
would (the AWS SDK for Python, not the project's own code). Prints one JSON object per message,
decoded by the documented rules (docs/sinks.md, "SQS and SNS" and "Kinesis").

    aws_consumer.py ENDPOINT create-queue NAME            -> prints the queue URL
    aws_consumer.py ENDPOINT create-topic NAME QUEUE_URL  -> topic ARN (queue subscribed, raw)
    aws_consumer.py ENDPOINT create-stream NAME SHARDS
    aws_consumer.py ENDPOINT sqs QUEUE_URL COUNT          -> COUNT messages, then exits
    aws_consumer.py ENDPOINT kinesis STREAM COUNT

Credentials and region come from the environment (AWS_ACCESS_KEY_ID, AWS_REGION, ...).
Gives up after 60 s without a new message.
"""
import base64
import json
import sys
import time

import boto3


def decode_sqs(message):
    attributes = {
        name: value["StringValue"]
        for name, value in message.get("MessageAttributes", {}).items()
    }
    encoding = attributes.pop("content-transfer-encoding", None)
    body = message["Body"]
    if encoding is None:
        payload = body.encode("utf-8")
    elif encoding == "base64":
        payload = base64.b64decode(body)
    elif encoding == "empty":
        payload = b""
    else:
        raise SystemExit(f"unknown content-transfer-encoding {encoding!r}")
    headers = [[n, v] for n, v in attributes.items() if n != "outbox-headers"]
    if "outbox-headers" in attributes:
        headers.extend(json.loads(attributes["outbox-headers"]))
    return {
        "payload_b64": base64.b64encode(payload).decode(),
        "headers": headers,
        "group_id": message.get("Attributes", {}).get("MessageGroupId"),
        "dedup_id": message.get("Attributes", {}).get("MessageDeduplicationId"),
    }


def consume_sqs(sqs, queue_url, count):
    seen, idle_since = 0, time.monotonic()
    while seen < count:
        answer = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
            WaitTimeSeconds=1,
        )
        messages = answer.get("Messages", [])
        if not messages and time.monotonic() - idle_since > 60:
            raise SystemExit(f"only {seen} of {count} messages arrived")
        for message in messages:
            print(json.dumps(decode_sqs(message)), flush=True)
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            seen += 1
            idle_since = time.monotonic()


def consume_kinesis(kinesis, stream, count):
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    iterators = {
        s["ShardId"]: kinesis.get_shard_iterator(
            StreamName=stream, ShardId=s["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for s in shards
    }
    seen, idle_since = 0, time.monotonic()
    while seen < count:
        got = 0
        for shard, iterator in list(iterators.items()):
            page = kinesis.get_records(ShardIterator=iterator)
            iterators[shard] = page["NextShardIterator"]
            for record in page["Records"]:
                print(json.dumps({
                    "shard": shard,
                    "partition_key": record["PartitionKey"],
                    "payload_b64": base64.b64encode(record["Data"]).decode(),
                }), flush=True)
                got += 1
        seen += got
        if got:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > 60:
            raise SystemExit(f"only {seen} of {count} records arrived")
        else:
            time.sleep(0.1)


def main():
    endpoint, command, *args = sys.argv[1:]
    session = boto3.session.Session()
    client = lambda service: session.client(service, endpoint_url=endpoint)
    if command == "create-queue":
        (name,) = args
        attributes = {"FifoQueue": "true"} if name.endswith(".fifo") else {}
        print(client("sqs").create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])
    elif command == "create-topic":
        name, queue_url = args
        attributes = {"FifoTopic": "true"} if name.endswith(".fifo") else {}
        sns = client("sns")
        arn = sns.create_topic(Name=name, Attributes=attributes)["TopicArn"]
        queue_arn = client("sqs").get_queue_attributes(
            QueueUrl=queue_url, AttributeNames=["QueueArn"]
        )["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn,
                      Attributes={"RawMessageDelivery": "true"})
        print(arn)
    elif command == "create-stream":
        name, shards = args
        kinesis = client("kinesis")
        kinesis.create_stream(StreamName=name, ShardCount=int(shards))
        kinesis.get_waiter("stream_exists").wait(StreamName=name)
    elif command == "sqs":
        queue_url, count = args
        consume_sqs(client("sqs"), queue_url, int(count))
    elif command == "kinesis":
        stream, count = args
        consume_kinesis(client("kinesis"), stream, int(count))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
