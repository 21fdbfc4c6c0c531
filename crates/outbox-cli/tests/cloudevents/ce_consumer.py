"""Reads what `outbox relay` published in a CloudEvents format with the CloudEvents Python SDK
(PyPI `cloudevents` 2.x, `cloudevents.core.bindings`), as a consumer in another language would.
Used by `crates/outbox-cli/tests/cloudevents.rs`.

    ce_consumer.py decode          messages on stdin, one JSON object per line:
                                   {"binding": "kafka" | "rabbitmq" | "http",
                                    "headers": [[name, value], ...], "content_type": str | null,
                                    "key": str | null, "body_b64": str}
    ce_consumer.py serve OUT       an HTTP server on 127.0.0.1 (a free port, printed as
                                   `listening PORT`) that parses every POST with `from_http`,
                                   appends the event to OUT and answers 200 (400 when the SDK
                                   refuses the request)

Each event is printed (decode) or appended (serve) as one JSON object: its attributes, and
its data as `data_json` (the SDK parsed JSON) or `data_b64` (text or bytes).
"""

import base64
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cloudevents.core.bindings import http as ce_http
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.bindings import rabbitmq as ce_rabbitmq
from cloudevents.core.formats.json import JSONFormat


def describe(event):
    out = {}
    for name, value in event.get_attributes().items():
        out[name] = value.isoformat() if hasattr(value, "isoformat") else value
    data = event.get_data()
    if isinstance(data, (dict, list, int, float, bool)):
        out["data_json"] = data
    elif data is None:
        out["data_b64"] = ""
    else:
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        out["data_b64"] = base64.b64encode(raw).decode("ascii")
    return out


def parse(message):
    body = base64.b64decode(message["body_b64"])
    headers = message["headers"]
    binding = message["binding"]
    if binding == "kafka":
        key = message.get("key")
        msg = ce_kafka.KafkaMessage(
            headers={n: v.encode("utf-8") for n, v in headers},
            key=key.encode("utf-8") if key is not None else None,
            value=body,
        )
        return ce_kafka.from_kafka(msg, JSONFormat())
    if binding == "rabbitmq":
        msg = ce_rabbitmq.RabbitMQMessage(
            headers={n: v for n, v in headers},
            content_type=message.get("content_type"),
            body=body,
        )
        return ce_rabbitmq.from_rabbitmq(msg, JSONFormat())
    if binding == "http":
        msg = ce_http.HTTPMessage(headers={n: v for n, v in headers}, body=body)
        return ce_http.from_http(msg, JSONFormat())
    raise ValueError(f"unknown binding {binding!r}")


def decode():
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(describe(parse(json.loads(line)))), flush=True)


def serve(out_path):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            headers = {name.lower(): value for name, value in self.headers.items()}
            try:
                event = ce_http.from_http(
                    ce_http.HTTPMessage(headers=headers, body=body), JSONFormat()
                )
                line = json.dumps(describe(event))
                status = 200
            except Exception as e:  # the SDK refused it: the relay dead-letters it
                line = json.dumps({"error": f"{type(e).__name__}: {e}"})
                status = 400
            with open(out_path, "a", encoding="utf-8") as out:
                out.write(line + "\n")
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def do_HEAD(self):
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if sys.argv[1:2] == ["decode"]:
        decode()
    elif sys.argv[1:2] == ["serve"] and len(sys.argv) == 3:
        serve(sys.argv[2])
    else:
        sys.exit(__doc__)
