"""The official merchant SDK (paybridge-np), unchanged, against a running
gateway: every method of its `customers` (all but `add_credit`, issue 40),
`plans` and `invoices` resources (issue 39 "Done when"; `subscriptions` and
`dunning` are tests/sdk/billing_subscriptions.py's, paybridge_dunning.py's
and billing_walk.py's). Driven by tests/e2e/billing_walk.rs, which starts
the gateway with Fonepay configured for the project and passes BASE_URL and
API_KEY. Exits non-zero on the first broken expectation.
"""

import json
import os
import sys

from paybridge_np import InvalidRequestError, NotFoundError, PayBridgeNP

BASE = os.environ["BASE_URL"]
KEY = os.environ["API_KEY"]


def check(cond, what, got=None):
    if not cond:
        print(f"FAILED: {what}: {json.dumps(got, default=str, ensure_ascii=False)[:2000]}", file=sys.stderr)
        sys.exit(1)
    print(f"ok  {what}")


def refused(call, status, code, param, what):
    try:
        got = call()
    except (InvalidRequestError, NotFoundError) as e:
        err = e.raw.get("error", {})
        check(
            e.status_code == status and err.get("code") == code and (param is None or err.get("param") == param),
            what,
            e.raw,
        )
        return
    check(False, what + " (accepted)", got)


client = PayBridgeNP(api_key=KEY, base_url=BASE, max_retries=0)

# Customers: create, list (page, limit, search), get, update, delete.
sita = client.customers.create({
    "name": "Sita Rai", "email": "sita@example.com", "phone": "+977 980-0000001",
    "externalCustomerId": "member-1", "metadata": {"branch": "thamel"}, "locale": "ne",
})
check(sita["id"].startswith("cus_") and sita["livemode"] is False and sita["phone"] == "9800000001"
      and sita["email"] == "sita@example.com" and sita["locale"] == "ne", "customers.create", sita)
ram = client.customers.create({"name": "Ram Thapa", "email": "ram@example.com"})
refused(lambda: client.customers.create({"name": "X", "phone": "12345"}), 400, "validation_failed", "phone",
        "a phone that is no Nepali mobile is refused naming it")
refused(lambda: client.customers.create({"name": "X", "email": "not-an-address"}), 400, "validation_failed",
        "email", "an email that is no address is refused naming it")
page = client.customers.list(page=1, limit=1)
check(page["total"] == 2 and page["page"] == 1 and page["limit"] == 1 and [c["id"] for c in page["data"]] == [ram["id"]],
      "customers.list(page, limit): newest first", page)
for term in ("MEMBER-1", "sita@", "9800000001", "Sita"):
    found = client.customers.list(search=term)
    check([c["id"] for c in found["data"]] == [sita["id"]], f"customers.list(search={term!r})", found)
got = client.customers.get(sita["id"])
check(got == sita | {"updatedAt": got["updatedAt"]}, "customers.get answers as create did", [got, sita])
up = client.customers.update(sita["id"], {"email": None, "name": "Sita K. Rai"})
check(up["email"] is None and up["name"] == "Sita K. Rai" and up["phone"] == "9800000001", "customers.update", up)
refused(lambda: client.customers.update(sita["id"], {"phone": "12"}), 400, "validation_failed", "phone",
        "customers.update validates the phone")
refused(lambda: client.customers.get("cus_00000000000000000000000000"), 404, "not_found", None,
        "customers.get of an unknown id: NotFoundError")

# Plans: create, list (active), get, update; a new price is a new plan.
plan = client.plans.create({
    "name": "Yoga, monthly", "amount": 50000, "intervalUnit": "month", "gracePeriodDays": 3,
    "reminderDaysBeforeDue": 1, "overdueAction": "mark_past_due", "defaultProvider": "fonepay",
})
check(plan["id"].startswith("bp_") and plan["amount"] == 50000 and plan["intervalCount"] == 1
      and plan["active"] is True, "plans.create", plan)
big = client.plans.create({"name": "Fibre 100, quarterly", "amount": 450000, "intervalUnit": "quarter",
                           "calendar": "bs"})
for body, field in [
    ({"name": "X", "amount": 100, "intervalUnit": "month", "intervalCount": 0}, "intervalCount"),
    ({"name": "X", "amount": 100, "intervalUnit": "month", "trialDays": 366}, "trialDays"),
    ({"name": "X", "amount": 0, "intervalUnit": "month"}, "amount"),
]:
    refused(lambda: client.plans.create(body), 400, "validation_failed", field, f"plans.create refuses {field}")
check(client.plans.get(plan["id"])["name"] == "Yoga, monthly", "plans.get")
renamed = client.plans.update(plan["id"], {"name": "Yoga", "description": "Mornings", "gracePeriodDays": 5,
                                           "overdueAction": "pause", "defaultProvider": None})
check(renamed["name"] == "Yoga" and renamed["description"] == "Mornings" and renamed["gracePeriodDays"] == 5
      and renamed["overdueAction"] == "pause" and renamed["defaultProvider"] is None and renamed["amount"] == 50000,
      "plans.update (UpdatePlanParams)", renamed)
for field, value in (("amount", 60000), ("intervalUnit", "year"), ("trialDays", 7)):
    refused(lambda: client.plans.update(plan["id"], {field: value}), 400, "validation_failed", field,
            f"plans.update refuses {field} (a new price or interval is a new plan)")
off = client.plans.update(big["id"], {"active": False})
check(off["active"] is False, "plans.update(active=False)", off)
active = client.plans.list(active=True)
check([p["id"] for p in active["data"]] == [plan["id"]] and active["total"] == 1, "plans.list(active=True)", active)
inactive = client.plans.list(active=False, page=1, limit=10)
check([p["id"] for p in inactive["data"]] == [big["id"]] and inactive["limit"] == 10, "plans.list(active=False)",
      inactive)

# Invoices: a subscription without a trial is invoiced at once.
sub = client.subscriptions.create({"customerId": sita["id"], "planId": plan["id"], "trialDays": 0})
check(sub["status"] == "incomplete", "a subscription without a trial is incomplete", sub)
listed = client.invoices.list(subscription_id=sub["id"])
check(listed["total"] == 1, "invoices.list(subscription_id)", listed)
invoice = listed["data"][0]
check(invoice["status"] == "open" and invoice["amountDue"] == 50000 and invoice["number"].startswith("TEST-PI-")
      and invoice["customerId"] == sita["id"] and invoice["payUrl"] and invoice["pdfUrl"]
      and set(invoice["due"]) == {"ad", "bs"},
      "the first invoice: open, numbered, its pay page, PDF and Miti", invoice)
check(client.invoices.get(invoice["id"]) == invoice, "invoices.get answers as the list")
check([i["id"] for i in client.invoices.list(customer_id=sita["id"], status="open")["data"]] == [invoice["id"]],
      "invoices.list(customer_id, status)")
check(client.invoices.list(customer_id=ram["id"])["total"] == 0, "invoices.list(customer_id) of another customer")
check([i["id"] for i in client.invoices.list(search=invoice["number"], page=1, limit=5)["data"]] == [invoice["id"]],
      "invoices.list(search=number)")
check(client.invoices.list(status="paid")["total"] == 0, "invoices.list(status=paid)")
refused(lambda: client.invoices.list(status="nonsense"), 400, "validation_failed", "status",
        "invoices.list refuses an unknown status naming it")
refused(lambda: client.invoices.get("inv_00000000000000000000000000"), 404, "not_found", None,
        "invoices.get of an unknown id: NotFoundError")
qr = client.invoices.qr(invoice["id"])
check(qr["invoice_id"] == invoice["id"] and qr["amount"] == 50000 and qr["currency"] == "NPR"
      and qr["provider"] == "fonepay" and qr["status"] == "initiated" and qr["qr_message"].startswith("000201")
      and qr["qr_image"].startswith("data:image/png;base64,") and "/events" in qr["events_url"],
      "invoices.qr mints a Direct-QR for the amount due", qr)

# Above the sandbox Fonepay cap, the QR says so.
dear = client.plans.create({"name": "Gym, yearly", "amount": 1500000, "intervalUnit": "year"})
dear_sub = client.subscriptions.create({"customerId": sita["id"], "planId": dear["id"]})
dear_invoice = client.invoices.list(subscription_id=dear_sub["id"])["data"][0]
refused(lambda: client.invoices.qr(dear_invoice["id"]), 422, "fonepay_sandbox_cap", None,
        "invoices.qr above the sandbox Fonepay cap says so")

# A customer with an open subscription is kept; once it ends, deleted.
refused(lambda: client.customers.delete(sita["id"]), 409, "customer_has_subscriptions", None,
        "customers.delete while a subscription is open: 409")
client.subscriptions.cancel(sub["id"])
client.subscriptions.cancel(dear_sub["id"])
deleted = client.customers.delete(sita["id"])
check(deleted.get("deleted") is True, "customers.delete", deleted)
refused(lambda: client.customers.get(sita["id"]), 404, "not_found", None, "a deleted customer is gone")

client.close()
print("all SDK customer, plan and invoice calls behaved")
