"""The official merchant SDK (paybridge-np), unchanged, against a running
gateway: plan changes, the proration preview and seats (issue 40 parts 4
and 5): subscriptions.preview_proration, change_plan and update_quantity.
Driven by tests/e2e/billing_changes.rs, which starts the gateway and
passes BASE_URL and API_KEY.
Exits non-zero on the first broken expectation.
"""

import json
import os
import sys

from paybridge_np import InvalidRequestError, NotFoundError, PayBridgeNP

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
    except (InvalidRequestError, NotFoundError) as e:
        err = e.raw.get("error", {})
        check(
            e.status_code == status and err.get("code") == code and err.get("param") == param,
            what,
            e.raw,
        )
        return
    check(False, what + " (accepted)", got)


client = PayBridgeNP(api_key=KEY, base_url=BASE, max_retries=0)
subs = client.subscriptions

customer = client.customers.create({"name": "Sita Rai"})
basic = client.plans.create(
    {"name": "Basic", "amount": 99900, "intervalUnit": "month", "trialDays": 7}
)
pro = client.plans.create({"name": "Pro", "amount": 199900, "intervalUnit": "month"})
yearly = client.plans.create({"name": "Yearly", "amount": 999000, "intervalUnit": "year"})

# A trial ended now: active, billing from today, its first period whole.
sub = subs.create({"customerId": customer["id"], "planId": basic["id"]})
ended = subs.end_trial(sub["id"])
check(ended["subscription"]["status"] == "active", "the trial ended", ended)

# The preview on the period's first day: all of it remains.
preview = subs.preview_proration(sub["id"], pro["id"])
check(
    preview["creditAmount"] == 99900
    and preview["debitAmount"] == 199900
    and preview["netAmount"] == 100000
    and preview["currency"] == "NPR"
    and preview["currentPlan"]["id"] == basic["id"]
    and preview["newPlan"]["id"] == pro["id"]
    and preview["periodStart"] == ended["subscription"]["currentPeriodStart"]
    and preview["periodEnd"] == ended["subscription"]["currentPeriodEnd"],
    "subscriptions.preview_proration",
    preview,
)
again = subs.get(sub["id"])
check(again["planId"] == basic["id"], "the preview changed nothing", again)

# Refused: the current plan, another interval, a plan that is not there.
refused(
    lambda: subs.change_plan(sub["id"], {"newPlanId": basic["id"]}),
    400, "validation_failed", "newPlanId", "the current plan is refused",
)
refused(
    lambda: subs.change_plan(sub["id"], {"newPlanId": yearly["id"]}),
    400, "validation_failed", "newPlanId", "another interval is refused",
)
refused(
    lambda: subs.preview_proration(sub["id"], "bp_01nosuchplan0000000000000"),
    404, "not_found", "newPlanId", "an unknown plan is 404",
)

# create_prorations: now, with a proration invoice for the net, as previewed.
changed = subs.change_plan(
    sub["id"], {"newPlanId": pro["id"], "prorationBehavior": "create_prorations"}
)
check("prorationApplied" in changed and changed["prorationApplied"], "change_plan applied", changed)
invoice = changed["prorationInvoice"]
check(
    changed["planId"] == pro["id"]
    and invoice is not None
    and invoice["amountDue"] == preview["netAmount"]
    and invoice["status"] == "open"
    and [l["kind"] for l in invoice["lines"]] == ["proration_credit", "proration_debit"]
    and invoice["lines"][0]["amount"] == -99900
    and invoice["lines"][1]["amount"] == 199900,
    "the proration invoice bills the previewed net",
    changed,
)

# The default (none) schedules the change for the next period.
scheduled = subs.change_plan(sub["id"], {"newPlanId": basic["id"]})
check(
    scheduled["planId"] == pro["id"]
    and not scheduled["prorationApplied"]
    and scheduled["prorationInvoice"] is None
    and scheduled["pendingPlanChange"]["plan"]["id"] == basic["id"]
    and scheduled["pendingPlanChange"]["effectiveOn"] == scheduled["currentPeriodEnd"],
    "change_plan schedules by default",
    scheduled,
)

# Quantity: a flat plan has none to change.
refused(
    lambda: subs.update_quantity(sub["id"], 3),
    400, "validation_failed", "quantity", "a flat plan has no seats",
)
refused(
    lambda: subs.update_quantity(sub["id"], 0),
    400, "validation_failed", "quantity", "quantity 0 is refused",
)

# Seats: a per-unit plan bills amount x quantity; a change is prorated.
seats = client.plans.create(
    {"name": "Team", "amount": 50000, "intervalUnit": "month", "pricingModel": "per_unit", "trialDays": 7}
)
team = subs.create({"customerId": customer["id"], "planId": seats["id"], "quantity": 3})
check(team["quantity"] == 3, "a per-unit subscription takes a quantity", team)
team = subs.end_trial(team["id"])["subscription"]
more = subs.update_quantity(team["id"], 5)
check(
    more["quantity"] == 5
    and more["prorationApplied"]
    and more["prorationInvoice"]["amountDue"] == 100000,
    "update_quantity prorates the new seats",
    more,
)
same = subs.update_quantity(team["id"], 5)
check(same["quantity"] == 5 and same["prorationInvoice"] is None, "the same quantity bills nothing", same)
fewer = subs.update_quantity(team["id"], 2)
check(
    fewer["quantity"] == 2 and fewer["prorationInvoice"] is None and fewer["creditGranted"] == 150000,
    "fewer seats become credit",
    fewer,
)

print("all SDK plan change calls behaved")
