"""The official merchant SDK (paybridge-np), unchanged, against a running
gateway: its `dunning` resource (all but `set_subscription_policy`, the
subscriptions' own). Driven by tests/e2e/dunning.rs, which starts the
gateway and passes BASE_URL, API_KEY and INVOICE_ID (a billing invoice
overdue and being dunned, its customer unreachable). Exits non-zero on
the first broken expectation.
"""

import json
import os
import sys

from paybridge_np import InvalidRequestError, NotFoundError, PayBridgeNP

BASE = os.environ["BASE_URL"]
KEY = os.environ["API_KEY"]
INVOICE = os.environ["INVOICE_ID"]


def check(cond, what, got=None):
    if not cond:
        print(f"FAILED: {what}: {json.dumps(got, default=str)[:2000]}", file=sys.stderr)
        sys.exit(1)
    print(f"ok  {what}")


client = PayBridgeNP(api_key=KEY, base_url=BASE, max_retries=0)
dunning = client.dunning

# Policies: create (the SDK's defaults, then a default), list, get, update.
plain = dunning.create_policy(name="Standard 3-strike", retry_intervals_days=[1, 3, 7])
check(
    plain["id"].startswith("dpol_")
    and plain["finalAction"] == "cancel"
    and plain["isDefault"] is False
    and plain["active"] is True
    and plain["retryIntervalsDays"] == [1, 3, 7],
    "dunning.create_policy",
    plain,
)
default = dunning.create_policy(
    name="Gentle", retry_intervals_days=[2, 5], final_action="pause", is_default=True
)
check(default["isDefault"] is True and default["finalAction"] == "pause", "create_policy default", default)

listed = dunning.list_policies()
ids = [p["id"] for p in listed["data"]]
check(plain["id"] in ids and default["id"] in ids, "dunning.list_policies", listed)
defaults = [p["id"] for p in listed["data"] if p["isDefault"]]
check(defaults == [default["id"]], "one default", listed)

got = dunning.get_policy(plain["id"])
check(got["name"] == "Standard 3-strike", "dunning.get_policy", got)

updated = dunning.update_policy(plain["id"], name="Strict", finalAction="mark_uncollectible", isDefault=True)
check(
    updated["name"] == "Strict"
    and updated["finalAction"] == "mark_uncollectible"
    and updated["isDefault"] is True,
    "dunning.update_policy",
    updated,
)
check(dunning.get_policy(default["id"])["isDefault"] is False, "the old default is cleared")
off = dunning.update_policy(default["id"], active=False)
check(off["active"] is False, "update_policy active", off)

try:
    dunning.create_policy(name="Bad", retry_intervals_days=[])
    check(False, "an empty retryIntervalsDays is refused")
except InvalidRequestError as e:
    check(e.status_code == 400 and e.code == "validation_failed", "create_policy bad intervals", e.to_dict())
try:
    dunning.get_policy("dpol_01jd0000000000000000000000")
    check(False, "an unknown policy is not found")
except NotFoundError as e:
    check(e.code == "not_found", "get_policy unknown", e.to_dict())

# An invoice's dunning: its state and attempts, retry now, stop.
state = dunning.get_invoice_status(INVOICE)
check(state["invoiceId"] == INVOICE and state["status"] == "active", "dunning.get_invoice_status", state)
before = len(state["attempts"])
retried = dunning.retry_invoice_now(INVOICE)
check(
    retried["status"] == "active" and len(retried["attempts"]) == before + 1,
    "dunning.retry_invoice_now",
    retried,
)
check(retried["attempts"][-1]["kind"] == "reminder", "an attempt is a reminder", retried)
stopped = dunning.stop_invoice(INVOICE)
check(stopped["status"] == "stopped", "dunning.stop_invoice", stopped)
try:
    dunning.retry_invoice_now(INVOICE)
    check(False, "a stopped dunning takes no attempt")
except InvalidRequestError as e:
    check(e.status_code == 409 and e.code == "state_conflict", "retry after stop", e.to_dict())

print("all SDK dunning calls behaved")
