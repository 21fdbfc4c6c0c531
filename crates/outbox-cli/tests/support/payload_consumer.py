#!/usr/bin/env python3
"""A consumer of claim-checked and encrypted messages, written with boto3 and cryptography
only, by the rules of docs/payloads.md (not the project's own code).

    payload_consumer.py ENDPOINT create-bucket NAME
    payload_consumer.py ENDPOINT create-queue NAME          -> prints the queue URL
    payload_consumer.py ENDPOINT create-key                 -> prints the KMS key id
    payload_consumer.py ENDPOINT s3-get URL SHA256 SIZE     -> {"sha256", "size"} of the object,
                                                               after checking both headers' values
    payload_consumer.py ENDPOINT sqs QUEUE_URL COUNT        -> COUNT messages, each decoded:
        {"id", "headers", "body_b64", "payload_b64"}: body as received (docs/sinks.md), payload
        fetched from its claim-check object (size and sha256 checked) and decrypted
        (KMS Decrypt of encryption_data_key, AES-256-GCM with the event id as AAD)

Credentials and region come from the environment. Gives up after 60 s without a message.
"""
import base64
import hashlib
import json
import sys
import time
from urllib.parse import urlparse

import boto3
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from aws_consumer import decode_sqs  # beside this file: the SQS body and attribute rules


def client(name, endpoint):
    return boto3.client(name, endpoint_url=endpoint)


def fetch(s3, url, sha256, size):
    """The claim-checked object, checked against claim_check_size and claim_check_sha256."""
    parsed = urlparse(url)
    if parsed.scheme != "s3":
        raise SystemExit(f"not an s3:// claim check: {url}")
    body = s3.get_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"))["Body"].read()
    if len(body) != int(size):
        raise SystemExit(f"{url}: {len(body)} bytes, the message says {size}")
    digest = hashlib.sha256(body).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{url}: sha256 {digest}, the message says {sha256}")
    return body


def decrypt(kms, event_id, payload, headers):
    """The whole-payload mode: AES-256-GCM, the data key unwrapped by KMS, AAD = event id."""
    if headers["encryption"] != "aes-256-gcm":
        raise SystemExit(f"unexpected encryption {headers['encryption']!r}")
    data_key = kms.decrypt(CiphertextBlob=base64.b64decode(headers["encryption_data_key"]))[
        "Plaintext"
    ]
    nonce = base64.b64decode(headers["encryption_nonce"])
    return AESGCM(data_key).decrypt(nonce, payload, event_id.encode())


def sqs_message(message):
    """Headers (a dict) and payload of an SQS message, by aws_consumer.py's rules."""
    decoded = decode_sqs(message)
    return dict(decoded["headers"]), base64.b64decode(decoded["payload_b64"])


def consume_sqs(endpoint, queue_url, count):
    sqs, s3, kms = client("sqs", endpoint), client("s3", endpoint), client("kms", endpoint)
    seen, idle_since = 0, time.monotonic()
    while seen < count:
        messages = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            WaitTimeSeconds=1,
        ).get("Messages", [])
        if not messages and time.monotonic() - idle_since > 60:
            raise SystemExit(f"only {seen} of {count} messages arrived")
        for message in messages:
            headers, body = sqs_message(message)
            payload = body
            if "claim_check" in headers:
                payload = fetch(
                    s3,
                    headers["claim_check"],
                    headers["claim_check_sha256"],
                    headers["claim_check_size"],
                )
            if "encryption" in headers:
                payload = decrypt(kms, headers["id"], payload, headers)
            print(
                json.dumps(
                    {
                        "id": headers["id"],
                        "headers": headers,
                        "body_b64": base64.b64encode(body).decode(),
                        "payload_b64": base64.b64encode(payload).decode(),
                    }
                ),
                flush=True,
            )
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            seen += 1
            idle_since = time.monotonic()


def main():
    endpoint, command, *args = sys.argv[1:]
    if command == "create-bucket":
        client("s3", endpoint).create_bucket(Bucket=args[0])
    elif command == "create-queue":
        print(client("sqs", endpoint).create_queue(QueueName=args[0])["QueueUrl"])
    elif command == "create-key":
        print(client("kms", endpoint).create_key()["KeyMetadata"]["KeyId"])
    elif command == "s3-get":
        body = fetch(client("s3", endpoint), args[0], args[1], args[2])
        print(json.dumps({"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}))
    elif command == "sqs":
        consume_sqs(endpoint, args[0], int(args[1]))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
