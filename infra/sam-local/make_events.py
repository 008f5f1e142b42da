"""Writes infra/sam-local/events/<Function>/<Event>.json: one event for
`sam local invoke -e` per event of each function in template.yaml (an API
Gateway HTTP API v2 request per route, the SQS batch of each queue-driven
function, the stream record of the fan-out, the EventBridge event of the
scheduler) and the function URL request of the event streams.

    python infra/sam-local/make_events.py

tests/e2e/sam_local.rs fails when a route or trigger of the template has no
event here (or an event no route), and runs every one of them against the
function's binary. `__KEY__` stands for an API key (dhukuti-admin seed
prints one): `sed "s/__KEY__/$KEY/" FILE > /tmp/event.json`. The ids in the
paths are well formed and unknown: replace them with yours.
"""

import json
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "infra", "sam-local", "events")
API_ID = "abc123def4"
HOST = f"{API_ID}.execute-api.ap-south-1.amazonaws.com"
TIME = ("27/Nov/2026:08:10:00 +0000", 1795767000000)

# Well-formed ids nobody has (a ULID of zeros after each kind's prefix).
ZERO = "00000000000000000000000000"
ID_OF = {
    "/v1/payments/": "pay_", "/v1/checkout/": "cs_", "/v1/sessions/": "cs_",
    "/v1/refunds/": "ref_", "/v1/payment-links/": "lnk_", "/c/": "cs_",
    "/l/": "lnk_", "/v1/qr/": "cs_", "/v1/mobile/sessions/": "cs_",
    "/v1/webhooks/": "we_", "/v1/invoices/": "oinv_", "/dashboard/invoices/": "oinv_",
    "/v1/reports/": "rpt_", "/v1/reconciliation/runs/": "rrun_",
}
PARAMS = {
    "{payment}": "pay_" + ZERO,
    "{outcome}": "success",
    "{file}": "swagger-ui.css",
    "{proxy+}": "login",
    "{token}": "0000000000",
    "{n}": "1",
}
# A request body for the routes that take one (the smallest valid shape
# where it is short; else an empty object, which the route refuses as 4xx).
BODIES = {
    ("POST", "/v1/checkout"): {"amount": 150000, "returnUrl": "https://shop.example/thanks",
                               "cancelUrl": "https://shop.example/cart",
                               "description": "Order 1001"},
}
PUBLIC = ("/c/", "/l/", "/r/", "/docs", "/openapi.json", "/dashboard")


class Loader(yaml.SafeLoader):
    pass


def _tag(loader, suffix, node):
    if isinstance(node, yaml.ScalarNode):
        return {suffix: loader.construct_scalar(node)}
    if isinstance(node, yaml.SequenceNode):
        return {suffix: loader.construct_sequence(node)}
    return {suffix: loader.construct_mapping(node)}


Loader.add_multi_constructor("!", _tag)


def concrete(path):
    for prefix, kind in ID_OF.items():
        if path.startswith(prefix) and "{id}" in path:
            path = path.replace("{id}", kind + ZERO, 1)
            break
    for param, value in PARAMS.items():
        path = path.replace(param, value)
    return path


def http_event(method, path, route, body=None):
    method = "GET" if method == "ANY" else method
    raw = concrete(path)
    headers = {
        "accept": "application/json",
        "host": HOST,
        "user-agent": "curl/8.5.0",
        "x-forwarded-for": "203.0.113.7",
        "x-forwarded-port": "443",
        "x-forwarded-proto": "https",
    }
    if not raw.startswith(PUBLIC):
        headers["authorization"] = "Bearer __KEY__"
    event = {
        "version": "2.0",
        "routeKey": f"{'ANY' if route[0] == 'ANY' else method} {path}",
        "rawPath": raw,
        "rawQueryString": "",
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": API_ID,
            "domainName": HOST,
            "domainPrefix": API_ID,
            "http": {"method": method, "path": raw, "protocol": "HTTP/1.1",
                     "sourceIp": "203.0.113.7", "userAgent": "curl/8.5.0"},
            "requestId": "c6af9ac6-7b61-11e6-9a41-93e8deadbeef",
            "routeKey": f"{method} {path}",
            "stage": "$default",
            "time": TIME[0],
            "timeEpoch": TIME[1],
        },
        "isBase64Encoded": False,
    }
    if method in ("POST", "PATCH", "PUT"):
        payload = body if body is not None else BODIES.get((method, path), {})
        event["body"] = json.dumps(payload)
        headers["content-type"] = "application/json"
        headers["idempotency-key"] = "sam-local-" + method.lower() + path.replace("/", "-").replace("{", "").replace("}", "")
    return event


def sqs_event(queue, bodies):
    return {"Records": [{
        "messageId": f"0000000{i}-0000-4000-8000-000000000000",
        "receiptHandle": f"handle-{i}",
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": str(TIME[1]),
                       "SenderId": "123456789012", "ApproximateFirstReceiveTimestamp": str(TIME[1])},
        "messageAttributes": {},
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": f"arn:aws:sqs:ap-south-1:123456789012:{queue}",
        "awsRegion": "ap-south-1",
    } for i, body in enumerate(bodies)]}


def stream_event():
    evt = "evt_" + ZERO
    return {"Records": [{
        "eventID": "1",
        "eventName": "INSERT",
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "ap-south-1",
        "dynamodb": {
            "ApproximateCreationDateTime": TIME[1] // 1000,
            "Keys": {"pk": {"S": f"EVT#{evt}"}, "sk": {"S": "EVT"}},
            "NewImage": {"pk": {"S": f"EVT#{evt}"}, "sk": {"S": "EVT"}},
            "SequenceNumber": "111",
            "SizeBytes": 26,
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
        "eventSourceARN": "arn:aws:dynamodb:ap-south-1:123456789012:table/dhukuti/stream/2026-11-27T00:00:00.000",
    }]}


def schedule_event():
    return {
        "version": "0", "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
        "detail-type": "Scheduled Event", "source": "aws.events",
        "account": "123456789012", "time": "2026-11-27T08:10:00Z", "region": "ap-south-1",
        "resources": ["arn:aws:events:ap-south-1:123456789012:rule/dhukuti-sweep"],
        "detail": {},
    }


def events_for(name, fn):
    out = {}
    for ev_name, ev in (fn["Properties"].get("Events") or {}).items():
        kind, props = ev["Type"], ev["Properties"]
        if kind == "HttpApi":
            out[ev_name] = http_event(props["Method"], props["Path"], (props["Method"],))
        elif kind == "SQS":
            queue = ("dhukuti-webhooks" if "Webhook" in name
                     else "dhukuti-mail" if "Mail" in name else "dhukuti-sms")
            if "Webhook" in name:
                good = json.dumps({"event_id": "evt_" + ZERO, "endpoint_id": "we_" + ZERO, "attempt": 1})
            elif "Mail" in name:
                good = json.dumps({"mail_id": "mail_" + ZERO})
            else:
                good = json.dumps({"sms_id": "sms_" + ZERO})
            out[ev_name] = sqs_event(queue, [good, "not a message"])
        elif kind == "DynamoDB":
            out[ev_name] = stream_event()
        elif kind == "Schedule":
            out[ev_name] = schedule_event()
        else:
            sys.exit(f"{name}.{ev_name}: no event for type {kind}")
    if fn["Properties"].get("FunctionUrlConfig"):
        # The function URL (payload v2 too): GET /c/{id}/events.
        event = http_event("GET", "/c/{id}/events", ("GET",))
        event["routeKey"] = "$default"
        event["requestContext"]["routeKey"] = "$default"
        event["headers"]["accept"] = "text/event-stream"
        out["FunctionUrl"] = event
    return out


def main():
    with open(os.path.join(ROOT, "template.yaml")) as f:
        template = yaml.load(f, Loader=Loader)
    for name, res in template["Resources"].items():
        if res["Type"] != "AWS::Serverless::Function":
            continue
        for ev_name, event in events_for(name, res).items():
            d = os.path.join(OUT, name)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, ev_name + ".json"), "w") as f:
                f.write(json.dumps(event, indent=2) + "\n")


if __name__ == "__main__":
    main()
