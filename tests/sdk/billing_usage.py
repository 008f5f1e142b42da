"""The official merchant SDK (paybridge-np), unchanged, against a running
gateway: its usage calls (report_usage, get_usage_summary,
list_usage_records) and pending invoice items (list/create/delete), issue 40
parts 6 and 7. Driven by tests/e2e/billing_usage.rs, which starts the gateway
and passes BASE_URL and API_KEY. Exits non-zero on the first broken
expectation.
"""

import datetime
import json
import os
import sys

from paybridge_np import PayBridgeError, PayBridgeNP

BASE = os.environ["BASE_URL"]
KEY = os.environ["API_KEY"]


def check(cond, what, got=None):
    if not cond:
        print(f"FAILED: {what}: {json.dumps(got, default=str)[:2000]}", file=sys.stderr)
        sys.exit(1)
    print(f"ok  {what}")


def refused(call, status, code, param, what):
    try:
        got = call()
    except PayBridgeError as e:
        err = (e.raw or {}).get("error", {})
        check(
            e.status_code == status
            and err.get("code") == code
            and (param is None or err.get("param") == param),
            what,
            e.raw,
        )
        return err
    check(False, what + " (accepted)", got)


client = PayBridgeNP(api_key=KEY, base_url=BASE, max_retries=0)
subs = client.subscriptions

customer = client.customers.create({"name": "Hari Shrestha"})
plan = client.plans.create(
    {"name": "API calls", "amount": 10, "intervalUnit": "month", "pricingModel": "metered"}
)
sub = subs.create({"customerId": customer["id"], "planId": plan["id"]})
# Usage is billed in arrears: the first invoice bills nothing and is paid.
check(sub["status"] == "active", "a metered subscription is active at once", sub)
sid = sub["id"]

# Usage: increments, a repeated event key counted once, a set.
first = subs.report_usage(sid, {"quantity": 120, "idempotency_key": "evt_a"})
check(first["id"].startswith("ur_") and first["quantity"] == 120, "report_usage", first)
again = subs.report_usage(sid, {"quantity": 999, "idempotency_key": "evt_a"})
check(again["id"] == first["id"] and again["quantity"] == 120, "a repeated key answers the first", again)
now = datetime.datetime.now(datetime.timezone.utc)
later = (now + datetime.timedelta(seconds=60)).isoformat()
subs.report_usage(sid, {"quantity": 30, "action": "increment"})
check(
    subs.report_usage(sid, {"quantity": 500, "action": "set", "timestamp": later})["action"] == "set",
    "report_usage set",
)
summary = subs.get_usage_summary(sid)
check(
    summary["quantity"] == 500
    and summary["recordCount"] == 3
    and summary["aggregationMethod"] == "sum"
    and summary["periodStart"] == sub["currentPeriodStart"]
    and summary["periodEnd"] == sub["currentPeriodEnd"],
    "get_usage_summary: the set made the total",
    summary,
)
check(summary["amount"] == 5000, "the summary's amount is quantity x unit price", summary)
records = subs.list_usage_records(sid, limit=2)
check(len(records["data"]) == 2 and records["hasMore"] is True, "list_usage_records(limit=2)", records)
check(records["data"][0]["action"] == "set", "newest first", records)
refused(
    lambda: subs.report_usage(sid, {"quantity": 1, "action": "decrement"}),
    400,
    "validation_failed",
    "action",
    "an action other than the two",
)
refused(
    lambda: subs.report_usage(sid, {"quantity": -1}),
    400,
    "validation_failed",
    "quantity",
    "a negative quantity",
)
refused(
    lambda: subs.get_usage_summary("sub_00000000000000000000000000"),
    404,
    "not_found",
    None,
    "another subscription",
)

# Invoice items: a bare array, created, deleted.
check(subs.list_invoice_items(sid) == [], "list_invoice_items: none yet")
setup = subs.create_invoice_item(sid, {"amount": 150000, "description": "Installation"})
check(
    setup["id"].startswith("ii_") and setup["quantity"] == 1 and setup["status"] == "pending",
    "create_invoice_item",
    setup,
)
router = subs.create_invoice_item(sid, {"amount": 2500, "description": "Cable", "quantity": 4})
check(router["total"] == 10000, "an item's total is amount x quantity", router)
items = subs.list_invoice_items(sid)
check(isinstance(items, list) and [i["id"] for i in items] == [setup["id"], router["id"]], "list_invoice_items", items)
gone = subs.delete_invoice_item(sid, router["id"])
check(gone["deleted"] is True and gone["id"] == router["id"], "delete_invoice_item", gone)
check([i["id"] for i in subs.list_invoice_items(sid)] == [setup["id"]], "deleted items leave the list")
refused(
    lambda: subs.delete_invoice_item(sid, router["id"]),
    404,
    "not_found",
    None,
    "delete_invoice_item twice",
)
refused(
    lambda: subs.create_invoice_item(sid, {"amount": 0, "description": "Free"}),
    400,
    "validation_failed",
    "amount",
    "an item of 0 paisa",
)

print("all SDK usage calls behaved")
