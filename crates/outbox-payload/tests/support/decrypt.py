"""A consumer of outbox's encrypted messages, written from docs/payloads.md ("Encryption") only.

Reads one message as JSON on stdin: {"id": "<event id>", "payload": "<base64 of the body>",
"headers": {"name": "value", ...}} and writes the plaintext payload to stdout.

Libraries: boto3 (KMS Decrypt of the data key; endpoint and credentials from the standard AWS
environment, e.g. AWS_ENDPOINT_URL for a local server) and cryptography (AES-256-GCM). For
`file:` keys, the key file's path is in the environment variable OUTBOX_KEY_FILE.
"""

import base64
import binascii
import json
import os
import sys

from cryptography.hazmat.primitives.ciphers.aead import AESGCM


def load_key_file(path):
    """32 raw bytes, 64 hex characters or base64 of 32 bytes, optional trailing newline."""
    content = open(path, "rb").read()
    if len(content) == 32:
        return content
    text = content.removesuffix(b"\n").removesuffix(b"\r")
    if len(text) == 32:
        return text
    if len(text) == 64:
        return binascii.unhexlify(text)
    return base64.b64decode(text, validate=True)


def data_key(headers):
    wrapped = base64.b64decode(headers["encryption_data_key"])
    key_id = headers["encryption_key_id"]
    if key_id.startswith("file:"):
        master = AESGCM(load_key_file(os.environ["OUTBOX_KEY_FILE"]))
        return master.decrypt(wrapped[:12], wrapped[12:], b"outbox data key")
    import boto3

    return boto3.client("kms").decrypt(CiphertextBlob=wrapped)["Plaintext"]


def decrypt(event_id, body, headers):
    mode = headers.get("encryption")
    if mode is None:
        return body
    aes = AESGCM(data_key(headers))
    if mode == "aes-256-gcm":
        nonce = base64.b64decode(headers["encryption_nonce"])
        return aes.decrypt(nonce, body, event_id.encode())
    if mode == "aes-256-gcm-fields":
        doc = json.loads(body)
        for name in headers["encryption_fields"].split(","):
            sealed = base64.b64decode(doc[name]["enc"])
            plain = aes.decrypt(sealed[:12], sealed[12:], f"{event_id}/{name}".encode())
            doc[name] = json.loads(plain)
        return json.dumps(doc, separators=(",", ":")).encode()
    raise ValueError(f"unknown encryption {mode!r}")


def main():
    message = json.load(sys.stdin)
    plain = decrypt(message["id"], base64.b64decode(message["payload"]), message["headers"])
    sys.stdout.buffer.write(plain)


if __name__ == "__main__":
    main()
