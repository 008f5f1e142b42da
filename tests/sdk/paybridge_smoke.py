"""The official merchant SDK (paybridge-np), unchanged, against a running
gateway: every call it shares with the contract. Driven by tests/sdk.rs,
which starts the gateway and passes BASE_URL, API_KEY and PAID_ESEWA (a
settled eSewa payment). Exits non-zero on the first broken expectation.
"""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
from paybridge_np import InvalidRequestError, NotFoundError, PayBridgeNP

BASE = os.environ["BASE_URL"]
KEY = os.environ["API_KEY"]
PAID = os.environ["PAID_ESEWA"]


def check(cond, what, got=None):
    if not cond:
        print(f"FAILED: {what}: {json.dumps(got, default=str)[:2000]}", file=sys.stderr)
        sys.exit(1)
    print(f"ok  {what}")


class Receiver(BaseHTTPRequestHandler):
    hits = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
        Receiver.hits.append((dict(self.headers), body))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"thanks")

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", 0), Receiver)
threading.Thread(target=server.serve_forever, daemon=True).start()
hook_url = f"http://127.0.0.1:{server.server_address[1]}/paybridge/webhook"

client = PayBridgeNP(api_key=KEY, base_url=BASE, max_retries=0)

# Checkout: create, retrieve, list, expire.
session = client.checkout.create(
    {
        "amount": 250000,
        "returnUrl": "https://mystore.example/success",
        "cancelUrl": "https://mystore.example/cart",
        "metadata": {"order_id": "A-17"},
        "customer": {"name": "Sita Rai", "email": "sita@example.com", "phone": "9800000001"},
    }
)
check(session["id"].startswith("cs_") and session["livemode"] is False, "checkout.create", session)
check(
    set(session) >= {"id", "livemode", "checkout_url", "flow", "provider", "expires_at"},
    "checkout.create answers the SDK's CheckoutSession keys",
    session,
)
check(session["checkout_url"].startswith(BASE + "/c/"), "checkout_url is ours", session)
got = client.checkout.retrieve(session["id"])
check(got["id"] == session["id"] and got["status"] == "pending", "checkout.retrieve", got)
check(got["metadata"] == {"order_id": "A-17"}, "metadata kept", got)
listed = client.checkout.list(limit=5, offset=0, status="pending")
check(
    any(s["id"] == session["id"] for s in listed["data"]) and set(listed["meta"]) >= {"total", "limit", "offset"},
    "checkout.list",
    listed,
)
redirect = client.checkout.create(
    {"amount": 150000, "returnUrl": "https://mystore.example/success", "flow": "redirect", "provider": "khalti"}
)
check(redirect["flow"] == "redirect" and redirect["provider"] == "khalti", "checkout.create redirect", redirect)
expired = client.checkout.expire(redirect["id"])
check(expired["id"] == redirect["id"] and expired["status"] == "expired", "checkout.expire", expired)
again = client.checkout.expire(redirect["id"])
check(again["status"] == "expired", "checkout.expire again is a no-op", again)
try:
    client.checkout.create({"amount": "2500", "returnUrl": "https://mystore.example/success"})
    check(False, "a string amount is refused")
except InvalidRequestError as e:
    check(e.status_code == 400 and e.raw["error"].get("param") == "amount", "a string amount is a 400 naming amount", e.raw)

# Payments.
payments = client.payments.list(limit=10, offset=0)
check(any(p["id"] == PAID for p in payments["data"]), "payments.list", payments)
payment = client.payments.retrieve(PAID)
check(payment["id"] == PAID and payment["status"] == "success", "payments.retrieve", payment)
try:
    client.payments.retrieve("pay_doesnotexist00000000000")
    check(False, "unknown payment is a 404")
except NotFoundError as e:
    check(e.status_code == 404 and e.code == "not_found", "unknown payment: NotFoundError", e.raw)

# Refunds (eSewa: recorded for the merchant to process, requires_action).
refund = client.refunds.create(
    {"paymentId": PAID, "amount": 1000, "reason": "customer_request", "notes": "damaged box"}
)
check(refund["id"].startswith("ref_") and refund["status"] == "requires_action", "refunds.create", refund)
check(client.refunds.retrieve(refund["id"])["id"] == refund["id"], "refunds.retrieve")
by_payment = client.refunds.list(payment_id=PAID, limit=10)
check([r["id"] for r in by_payment["data"]] == [refund["id"]], "refunds.list(payment_id)", by_payment)
try:
    client.refunds.create({"paymentId": PAID, "amount": 10**9, "reason": "other"})
    check(False, "an over-refund is refused")
except InvalidRequestError as e:
    check(e.status_code == 422, "an over-refund: 422", e.raw)

# Payment links: create, list, retrieve, update (pre-fills, maxUses null), cancel, delete.
link = client.payment_links.create({"title": "Ilam tea, 1 kg", "amount": 120000, "maxUses": 5})
check(link["id"].startswith("lnk_") and link["url"].startswith(BASE + "/l/"), "payment_links.create", link)
listed = client.payment_links.list(limit=10, active=True)
check(any(l["id"] == link["id"] for l in listed["data"]), "payment_links.list(active=True)", listed)
got = client.payment_links.retrieve(link["id"])
check(set(got["stats"]) >= {"views", "used_count", "conversion_rate"}, "payment_links.retrieve stats", got)
updated = client.payment_links.update(
    link["id"],
    {"title": "Ilam tea, 2 kg", "maxUses": None, "customerName": "Hari", "customerCity": "Ilam"},
)
check(
    updated["title"] == "Ilam tea, 2 kg" and updated["maxUses"] is None and updated["customerCity"] == "Ilam",
    "payment_links.update",
    updated,
)
cancelled = client.payment_links.cancel(link["id"])
check(cancelled["active"] is False, "payment_links.cancel", cancelled)
spare = client.payment_links.create({"title": "Spare", "minAmount": 1000, "maxAmount": 50000})
deleted = client.payment_links.delete(spare["id"])
check(deleted == {"deleted": True, "id": spare["id"], "livemode": False}, "payment_links.delete", deleted)

# Webhooks: create (secret once), list, update, deliveries, verify, delete.
endpoint = client.webhooks.create(url=hook_url, events=["payment.succeeded", "payment.failed"])
secret = endpoint["signing_secret"]
check(secret.startswith("whsec_"), "webhooks.create shows the secret", endpoint)
check(any(e["id"] == endpoint["id"] for e in client.webhooks.list()["data"]), "webhooks.list")
patched = client.webhooks.update(endpoint["id"], events=["payment.succeeded"], enabled=True)
check(patched["events"] == ["payment.succeeded"], "webhooks.update", patched)
sent = httpx.post(
    f"{BASE}/v1/webhooks/{endpoint['id']}/test",
    headers={"Authorization": f"Bearer {KEY}"},
    json={"type": "payment.succeeded"},
)
check(sent.status_code == 202, "a test event is sent", sent.text)
deadline = time.time() + 30
while not Receiver.hits and time.time() < deadline:
    time.sleep(0.2)
check(Receiver.hits, "the receiver got the event")
headers, body = Receiver.hits[0]
signature = {k.lower(): v for k, v in headers.items()}.get("x-service-signature")
event = PayBridgeNP.webhooks_static.construct_event(body, signature, secret)
check(event["type"] == "payment.succeeded" and event["livemode"] is False, "construct_event verifies", event)
check(
    all(k in event["data"] for k in ("id", "amount", "currency", "status", "object")),
    "flat data fields beside data.object",
    event,
)
deadline = time.time() + 30
while time.time() < deadline:
    deliveries = client.webhooks.list_deliveries(endpoint["id"])["data"]
    if deliveries and deliveries[0]["status"] == "success":
        break
    time.sleep(0.2)
check(
    deliveries and deliveries[0]["status"] == "success" and deliveries[0]["responseBody"] == "thanks"
    and deliveries[0]["payload"]["id"] == event["id"],
    "webhooks.list_deliveries",
    deliveries,
)
removed = client.webhooks.delete(endpoint["id"])
check(removed["deleted"] is True, "webhooks.delete", removed)

client.close()
print("all SDK calls behaved")
