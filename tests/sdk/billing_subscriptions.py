"""The official merchant SDK (paybridge-np), unchanged, against a running
gateway: its subscription calls (issue 39 item 3) and the dunning
resource's subscription policy. Driven by tests/e2e/billing_subscriptions.rs,
which starts the gateway and passes BASE_URL and API_KEY. Exits non-zero on
the first broken expectation.
"""

import datetime
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
    except InvalidRequestError as e:
        err = e.raw.get("error", {})
        check(
            e.status_code == status and err.get("code") == code and err.get("param") == param,
            what,
            e.raw,
        )
        return
    check(False, what + " (accepted)", got)


client = PayBridgeNP(api_key=KEY, base_url=BASE, max_retries=0)

customer = client.customers.create({"name": "Sita Rai", "email": "sita@example.com"})
monthly = client.plans.create({"name": "Fibre 50", "amount": 150000, "intervalUnit": "month"})
trial_plan = client.plans.create(
    {"name": "Gym", "amount": 250000, "intervalUnit": "month", "trialDays": 14}
)

# Create without a trial: incomplete, its first invoice issued.
sub = client.subscriptions.create(
    {
        "customerId": customer["id"],
        "planId": monthly["id"],
        "referenceId": "member-7",
        "quantity": 1,
        "metadata": {"branch": "thamel"},
    }
)
check(sub["id"].startswith("sub_") and sub["status"] == "incomplete", "subscriptions.create", sub)
check(sub["customerId"] == customer["id"] and sub["plan"]["amount"] == 150000, "the answer names customer and plan", sub)
check(sub["currentPeriodStart"] is not None and sub["cancelAtPeriodEnd"] is False, "billing began", sub)

refused(
    lambda: client.subscriptions.create({"customerId": customer["id"], "planId": monthly["id"], "trialDays": 366}),
    400, "validation_failed", "trialDays", "trialDays 366 is refused naming it",
)
refused(
    lambda: client.subscriptions.create({"customerId": customer["id"], "planId": monthly["id"], "billingAnchorDay": 29}),
    400, "validation_failed", "billingAnchorDay", "billingAnchorDay 29 is refused naming it",
)
refused(
    lambda: client.subscriptions.create({"customerId": customer["id"], "planId": monthly["id"], "quantity": 2}),
    400, "validation_failed", "quantity", "quantity 2 is refused naming it",
)

# A trial: trialing; extend (only later), end (the first invoice).
trial = client.subscriptions.create({"customerId": customer["id"], "planId": trial_plan["id"]})
check(trial["status"] == "trialing" and trial["trialEndsAt"], "a trial plan's subscription trials", trial)
current_end = datetime.datetime.fromisoformat(trial["trialEndsAt"].replace("Z", "+00:00"))
earlier = (current_end - datetime.timedelta(days=1)).isoformat()
refused(
    lambda: client.subscriptions.extend_trial(trial["id"], {"trialEndsAt": earlier}),
    400, "validation_failed", "trialEndsAt", "an earlier trial end is refused naming trialEndsAt",
)
later = (current_end + datetime.timedelta(days=7)).isoformat()
extended = client.subscriptions.extend_trial(trial["id"], {"trialEndsAt": later})
check(extended["status"] == "trialing" and extended["trialEndsAt"] != trial["trialEndsAt"], "subscriptions.extend_trial", extended)
ended = client.subscriptions.end_trial(trial["id"])
check(
    set(ended) == {"subscription", "invoice"} and ended["subscription"]["status"] == "active"
    and ended["invoice"]["status"] == "open" and ended["invoice"]["amountDue"] == 250000,
    "subscriptions.end_trial answers {subscription, invoice}",
    ended,
)
try:
    client.subscriptions.end_trial(trial["id"])
    check(False, "a second end_trial is refused")
except InvalidRequestError as e:
    check(e.status_code == 409 and e.code == "subscription_state_conflict", "a second end_trial: 409", e.raw)

# Pause, resume, cancel.
paused = client.subscriptions.pause(trial["id"], {"pauseReason": "travelling"})
check(paused["status"] == "paused" and paused["pauseReason"] == "travelling", "subscriptions.pause", paused)
resumed = client.subscriptions.resume(trial["id"])
check(resumed["status"] == "active", "subscriptions.resume", resumed)
at_end = client.subscriptions.cancel(trial["id"], {"cancelReason": "moving", "atPeriodEnd": True})
check(at_end["status"] == "active" and at_end["cancelAtPeriodEnd"] is True, "subscriptions.cancel(atPeriodEnd)", at_end)
now = client.subscriptions.cancel(sub["id"])
check(now["status"] == "cancelled" and now["cancelledAt"], "subscriptions.cancel", now)

# Lists and reads.
listed = client.subscriptions.list(status="cancelled", customer_id=customer["id"])
check([s["id"] for s in listed["data"]] == [sub["id"]] and listed["total"] == 1, "subscriptions.list(status, customer_id)", listed)
by_plan = client.subscriptions.list(plan_id=trial_plan["id"], page=1, limit=10)
check([s["id"] for s in by_plan["data"]] == [trial["id"]] and by_plan["limit"] == 10, "subscriptions.list(plan_id)", by_plan)
got = client.subscriptions.get(trial["id"])
check(got["id"] == trial["id"] and got["metadata"] == {}, "subscriptions.get", got)
try:
    client.subscriptions.get("sub_doesnotexist")
    check(False, "an unknown subscription is a 404")
except NotFoundError as e:
    check(e.status_code == 404, "subscriptions.get unknown: NotFoundError", e.raw)

# The dunning policy of a subscription: null reverts to the default.
reverted = client.dunning.set_subscription_policy(trial["id"], None)
check(reverted["id"] == trial["id"] and reverted["dunningPolicyId"] is None, "dunning.set_subscription_policy(None)", reverted)

client.close()
print("all SDK subscription calls behaved")
