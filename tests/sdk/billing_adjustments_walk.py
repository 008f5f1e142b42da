"""Three months of a real price list on a sandbox test clock, driven by the
official SDK (paybridge-np, unchanged) against a running gateway: issue 40's
"Done when" walk. Driven by tests/e2e/billing_walk.rs, which starts the
gateway and passes BASE_URL, API_KEY and PDFTOTEXT (the `pdftotext` tool).

One customer, two subscriptions, VAT at 13% throughout:
- "Team" seats (`per_unit`, NPR 500 a seat a month), 3 seats from 2026-01-10,
  the first month paid in advance as customer credit;
  an installation fee (a one-off item) and a promotion code for a 20% coupon
  repeating two cycles, both from the next invoice; a mid-period upgrade to
  "Team Plus" (NPR 800 a seat) with prorations; customer credit; then 5 seats
  mid-period, prorated the same way.
- "API calls" (`metered`, 50 paisa a call) from 2026-01-15, billed in arrears
  on the next period's invoice; a repeated event counts once; an event for a
  period already invoiced is refused.

Every invoice is asserted to the paisa by the table INVOICES: each line (kind,
quantity, amount, period), subtotal, discount, VAT, total, credit applied,
amount due, and the text of its PDF (a tax invoice: the words, the seller's
PAN, the buyer's PAN, the fiscal year, every amount). The table's numbers are
worked by hand in docs/billing.md ("The adjustments walk"), not by the rules
under test. Exits non-zero on the first broken expectation.
"""

import datetime as dt
import json
import os
import subprocess
import sys
import time

import httpx
from paybridge_np import PayBridgeNP
from paybridge_np.errors import PayBridgeError

BASE = os.environ["BASE_URL"].rstrip("/")
KEY = os.environ["API_KEY"]
PDFTOTEXT = os.environ.get("PDFTOTEXT") or "pdftotext"

POLL = 0.05
DEADLINE = 60.0


def check(cond, what, got=None):
    if not cond:
        print(f"FAILED: {what}: {json.dumps(got, default=str, ensure_ascii=False)[:4000]}", file=sys.stderr)
        sys.exit(1)
    print(f"ok  {what}")


def refused(call, status, what, code=None, param=None):
    try:
        got = call()
    except PayBridgeError as e:
        err = (getattr(e, "raw", None) or {}).get("error", {})
        check(getattr(e, "status_code", None) == status and (code is None or err.get("code") == code)
              and (param is None or err.get("param") == param), what, getattr(e, "raw", str(e)))
        return
    check(False, what + " (accepted)", got)


client = PayBridgeNP(api_key=KEY, base_url=BASE, max_retries=0)
api = httpx.Client(base_url=BASE, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)

T0 = "2026-01-10T06:00:00Z"  # 11:45 in Nepal
NPT = dt.timezone(dt.timedelta(hours=5, minutes=45))


def at(day, hh=11, mm=0):
    """A Nepal day (YYYY-MM-DD) at hh:mm Nepal time, as RFC 3339 UTC."""
    y, m, d = (int(x) for x in day.split("-"))
    local = dt.datetime(y, m, d, hh, mm, tzinfo=NPT)
    return local.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


clock = api.post("/v1/billing/test-clocks", json={"frozenTime": T0, "name": "three months"})
check(clock.status_code == 201, "a test clock", clock.text)
CLOCK = clock.json()["id"]


def advance(to):
    r = api.post(f"/v1/billing/test-clocks/{CLOCK}/advance", json={"frozenTime": to})
    check(r.status_code == 200, f"advance to {to}", r.text)
    stop = time.monotonic() + DEADLINE
    while True:
        c = api.get(f"/v1/billing/test-clocks/{CLOCK}").json()
        if c.get("status") == "ready":
            break
        if time.monotonic() > stop:
            check(False, f"the clock ready at {to}", c)
        time.sleep(POLL)


# --- the price list

tax = client.tax.update_settings({"enabled": True, "rateBps": 1300, "label": "VAT",
                                  "registrationNumber": "301234567"})
check(tax["enabled"] is True and tax["rateBps"] == 1300, "tax.update_settings: 13% VAT", tax)
check(client.tax.get_settings()["registrationNumber"] == "301234567", "tax.get_settings", tax)

customer = client.customers.create({"name": "Everest Traders", "email": "accounts@everest.example",
                                    "metadata": {"pan": "609876543"}, "testClockId": CLOCK})
team = client.plans.create({"name": "Team", "amount": 50_000, "intervalUnit": "month", "pricingModel": "per_unit",
                            "gracePeriodDays": 30, "overdueAction": "keep_active"})
plus = client.plans.create({"name": "Team Plus", "amount": 80_000, "intervalUnit": "month",
                            "pricingModel": "per_unit", "gracePeriodDays": 30, "overdueAction": "keep_active"})
calls = client.plans.create({"name": "API calls", "amount": 50, "intervalUnit": "month", "billingScheme": "metered",
                             "gracePeriodDays": 30, "overdueAction": "keep_active"})
check(team["pricingModel"] == "per_unit" and calls["pricingModel"] == "metered", "plans: per_unit and metered",
      [team, calls])
coupon = client.coupons.create({"code": "LAUNCH20", "name": "Launch 20%", "discountType": "percent",
                                "percentOff": 20, "duration": "repeating", "durationInCycles": 2})
promo = client.promotion_codes.create({"couponId": coupon["id"], "code": "welcome20", "maxRedemptions": 10})
check(promo["code"] == "WELCOME20", "promotion_codes.create stores the code upper-case", promo)

# --- the table: every invoice, to the paisa
# (kind, quantity, amount, period start, period end exclusive)
INVOICES = {
    "A1": dict(lines=[("subscription", 3, 150_000, "2026-01-10", "2026-02-10"),
                      ("tax", 1, 19_500, "2026-01-10", "2026-02-10")],
               subtotal=150_000, discount=0, tax=19_500, total=169_500, credit=169_500, due=0, status="paid"),
    "B1": dict(lines=[], subtotal=0, discount=0, tax=0, total=0, credit=0, due=0, status="paid"),
    "A2": dict(lines=[("subscription", 3, 150_000, "2026-02-10", "2026-03-10"),
                      ("item", 1, 200_000, "2026-02-10", "2026-03-10"),
                      ("discount", 1, -70_000, "2026-02-10", "2026-03-10"),
                      ("tax", 1, 36_400, "2026-02-10", "2026-03-10")],
               subtotal=350_000, discount=70_000, tax=36_400, total=316_400, credit=0, due=316_400),
    "B2": dict(lines=[("usage", 1_200, 60_000, "2026-01-15", "2026-02-15"),
                      ("tax", 1, 7_800, "2026-02-15", "2026-03-15")],
               subtotal=60_000, discount=0, tax=7_800, total=67_800, credit=0, due=67_800),
    # Team -> Team Plus on 2026-02-25: 13 of the period's 28 days remain.
    "AP1": dict(lines=[("proration_credit", 3, -69_643, "2026-02-25", "2026-03-10"),
                       ("proration_debit", 3, 111_429, "2026-02-25", "2026-03-10"),
                       ("tax", 1, 5_432, None, None)],
                subtotal=41_786, discount=0, tax=5_432, total=47_218, credit=0, due=47_218, kind="proration"),
    "A3": dict(lines=[("subscription", 3, 240_000, "2026-03-10", "2026-04-10"),
                      ("discount", 1, -48_000, "2026-03-10", "2026-04-10"),
                      ("tax", 1, 24_960, "2026-03-10", "2026-04-10")],
               subtotal=240_000, discount=48_000, tax=24_960, total=216_960, credit=10_000, due=206_960),
    "B3": dict(lines=[("usage", 2_000, 100_000, "2026-02-15", "2026-03-15"),
                      ("tax", 1, 13_000, "2026-03-15", "2026-04-15")],
               subtotal=100_000, discount=0, tax=13_000, total=113_000, credit=0, due=113_000),
    # 3 -> 5 seats on 2026-03-20: 21 of the period's 31 days remain.
    "AP2": dict(lines=[("proration_credit", 3, -162_581, "2026-03-20", "2026-04-10"),
                       ("proration_debit", 5, 270_968, "2026-03-20", "2026-04-10"),
                       ("tax", 1, 14_090, None, None)],
                subtotal=108_387, discount=0, tax=14_090, total=122_477, credit=0, due=122_477, kind="proration"),
    "A4": dict(lines=[("subscription", 5, 400_000, "2026-04-10", "2026-05-10"),
                      ("tax", 1, 52_000, "2026-04-10", "2026-05-10")],
               subtotal=400_000, discount=0, tax=52_000, total=452_000, credit=0, due=452_000),
}
# The fiscal year of each (Shrawan 1 2082 is 2025-07-17; of 2083, 2026-07-17).
FISCAL_YEAR = "2082/83"


def npr(paisa):
    """As the PDF prints it: NPR 3,16,400.00 (South Asian grouping)."""
    sign = "-" if paisa < 0 else ""
    rupees, cents = divmod(abs(paisa), 100)
    digits = str(rupees)
    if len(digits) > 3:
        head, tail = digits[:-3], digits[-3:]
        groups = []
        while len(head) > 2:
            groups.insert(0, head[-2:])
            head = head[:-2]
        if head:
            groups.insert(0, head)
        digits = ",".join(groups + [tail])
    return f"{sign}NPR {digits}.{cents:02d}"


check(npr(31_640_000) == "NPR 3,16,400.00" and npr(-7_000_000) == "-NPR 70,000.00" and npr(5_432) == "NPR 54.32",
      "the amount format")


def pdf_text(inv_id):
    r = api.get(f"/v1/billing/invoices/{inv_id}/pdf")
    check(r.status_code == 200 and r.content.startswith(b"%PDF"), f"{inv_id}: its PDF", r.text[:200])
    out = subprocess.run([PDFTOTEXT, "-layout", "-", "-"], input=r.content, capture_output=True, check=True)
    return out.stdout.decode()


def assert_invoice(name, inv):
    want = INVOICES[name]
    got_lines = [(ln["kind"], ln["quantity"], ln["amount"], ln["periodStart"], ln["periodEnd"])
                 for ln in inv["lines"]]
    want_lines = [(k, q, a, s or inv["periodStart"], e or inv["periodEnd"]) for k, q, a, s, e in want["lines"]]
    check(got_lines == want_lines, f"{name}: its lines", {"got": got_lines, "want": want_lines})
    totals = (inv["subtotal"], inv["discountTotal"], inv["taxTotal"], inv["total"], inv["amount"],
              inv["creditApplied"], inv["amountDue"])
    check(totals == (want["subtotal"], want["discount"], want["tax"], want["total"], want["total"], want["credit"],
                     want["due"]), f"{name}: subtotal, discount, VAT, total, credit, due", inv)
    check(inv["status"] == want.get("status", "open") and inv["kind"] == want.get("kind", "cycle"),
          f"{name}: {want.get('status', 'open')}, {want.get('kind', 'cycle')}", inv)
    check(inv["taxRateBps"] == 1300 and inv["taxRegistrationNumber"] == "301234567", f"{name}: the VAT snapshot", inv)
    text = pdf_text(inv["id"])
    flat = " ".join(text.split())
    for words in ["Tax Invoice", "301234567", "609876543", f"FY {FISCAL_YEAR}", inv["number"],
                  npr(want["total"]), npr(want["due"])] + [npr(a) for _, _, a, _, _ in want["lines"] if a]:
        check(words in flat, f"{name}: the PDF shows {words!r}", text)
    if want["tax"]:
        check(f"VAT (13.00%)" in flat and npr(want["subtotal"] - want["discount"]) in flat,
              f"{name}: the PDF shows the taxable amount and VAT", text)


def invoices_of(sub_id):
    return sorted(client.invoices.list(subscription_id=sub_id, limit=100)["data"], key=lambda i: i["number"])


# --- January: two subscriptions, the fee and the code for later

# Paid in advance: the first invoice takes it all and is paid at issue.
advance_paid = client.customers.add_credit(customer["id"], 169_500, note="paid in advance, cash")
check(advance_paid["creditBalance"] == 169_500, "customers.add_credit: NPR 1,695 in advance", advance_paid)
a = client.subscriptions.create({"customerId": customer["id"], "planId": team["id"], "quantity": 3})
check(a["status"] == "active" and a["quantity"] == 3, "Team for 3 seats, active: paid from credit", a)
check(client.customers.get(customer["id"])["creditBalance"] == 0, "the credit was used up")
[a1] = invoices_of(a["id"])
assert_invoice("A1", a1)
item = client.subscriptions.create_invoice_item(a["id"], {"amount": 200_000, "description": "Installation",
                                                          "quantity": 1})
items = client.subscriptions.list_invoice_items(a["id"])
check(isinstance(items, list) and [i["id"] for i in items] == [item["id"]], "the fee waits for the next invoice",
      items)
applied = client.subscriptions.apply_coupon(a["id"], {"promotionCode": "Welcome20"})
check(json.dumps(applied).find(coupon["id"]) >= 0, "apply_coupon by promotion code", applied)

advance(at("2026-01-15"))
b = client.subscriptions.create({"customerId": customer["id"], "planId": calls["id"]})
[b1] = invoices_of(b["id"])
assert_invoice("B1", b1)
check(client.subscriptions.get(b["id"])["status"] == "active", "nothing to pay: B is active at once", b)
key = "calls-2026-01-16"
first = client.subscriptions.report_usage(b["id"], {"quantity": 700, "action": "increment",
                                                    "timestamp": at("2026-01-16"), "idempotency_key": key})
again = client.subscriptions.report_usage(b["id"], {"quantity": 700, "action": "increment",
                                                    "timestamp": at("2026-01-16"), "idempotency_key": key})
check(first.get("id") == again.get("id"), "a repeated usage event counts once", [first, again])
client.subscriptions.report_usage(b["id"], {"quantity": 500, "timestamp": at("2026-01-20"),
                                            "idempotency_key": "calls-2026-01-20"})
summary = client.subscriptions.get_usage_summary(b["id"])
check(summary["quantity"] == 1_200, "the period's usage: 1,200 calls", summary)
refused(lambda: client.subscriptions.report_usage(b["id"], {"quantity": 1, "action": "decrement"}), 400,
        "a usage action other than increment or set is refused")

# --- February: the fee and the discount; usage billed in arrears; an upgrade

advance(at("2026-02-10"))
a2 = invoices_of(a["id"])[1]
assert_invoice("A2", a2)
check(client.subscriptions.list_invoice_items(a["id"]) == [], "the fee was consumed once")
advance(at("2026-02-15"))
b2 = invoices_of(b["id"])[1]
assert_invoice("B2", b2)
refused(lambda: client.subscriptions.report_usage(b["id"], {"quantity": 5, "timestamp": at("2026-01-20"),
                                                             "idempotency_key": "late"}),
        409, "usage for a period already invoiced is refused")
client.subscriptions.report_usage(b["id"], {"quantity": 2_000, "timestamp": at("2026-02-20"),
                                            "idempotency_key": "calls-2026-02-20"})

advance(at("2026-02-25"))
preview = client.subscriptions.preview_proration(a["id"], plus["id"])
check((preview["creditAmount"], preview["debitAmount"], preview["netAmount"]) == (69_643, 111_429, 41_786),
      "preview_proration: 13 of 28 days", preview)
changed = client.subscriptions.change_plan(a["id"], {"newPlanId": plus["id"], "prorationBehavior": "create_prorations"})
check(json.dumps(changed).find(plus["id"]) >= 0, "change_plan at once", changed)
ap1 = [i for i in invoices_of(a["id"]) if i["kind"] == "proration"][0]
assert_invoice("AP1", ap1)

# --- March: credit, the second discounted cycle, more seats

advance(at("2026-03-01"))
credit = client.customers.add_credit(customer["id"], 10_000, note="goodwill")
check(credit["creditBalance"] == 10_000, "customers.add_credit: NPR 100 goodwill", credit)
advance(at("2026-03-10"))
a3 = [i for i in invoices_of(a["id"]) if i["kind"] == "cycle"][2]
assert_invoice("A3", a3)
advance(at("2026-03-15"))
b3 = invoices_of(b["id"])[2]
assert_invoice("B3", b3)
advance(at("2026-03-20"))
seats = client.subscriptions.update_quantity(a["id"], 5)
check(seats.get("quantity", 5) == 5, "update_quantity: 5 seats", seats)
ap2 = [i for i in invoices_of(a["id"]) if i["kind"] == "proration"][1]
assert_invoice("AP2", ap2)

# --- April: the discount has run out

advance(at("2026-04-10"))
a4 = [i for i in invoices_of(a["id"]) if i["kind"] == "cycle"][3]
assert_invoice("A4", a4)
check(len(invoices_of(a["id"])) == 6 and len(invoices_of(b["id"])) == 3, "exactly the invoices of the table")
print("the three months billed as the table says")
