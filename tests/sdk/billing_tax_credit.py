"""The official merchant SDK (paybridge-np), unchanged, against a running
gateway: its `tax` resource (get_settings, update_settings) and
`customers.add_credit` (issue 40 parts 2 and 3). Driven by
tests/e2e/billing_taxcredit.rs, which passes BASE_URL and API_KEY. Exits
non-zero on the first broken expectation.
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

# Tax settings: the defaults, a change, bad input refused.
s = client.tax.get_settings()
check(s["enabled"] is False and s["rateBps"] == 1300 and s["label"] == "VAT" and s["registrationNumber"] is None,
      "tax.get_settings: the defaults", s)
s = client.tax.update_settings({"enabled": True, "rateBps": 1300, "label": "VAT", "registrationNumber": "301234567"})
check(s["enabled"] is True and s["rateBps"] == 1300 and s["registrationNumber"] == "301234567",
      "tax.update_settings: Nepal's 13% VAT with the PAN", s)
refused(lambda: client.tax.update_settings({"rateBps": 10001}), 400, "validation_failed", "rateBps",
        "a rate above 100% is refused naming rateBps")
refused(lambda: client.tax.update_settings({"registrationNumber": "12-34"}), 400, "validation_failed",
        "registrationNumber", "a PAN that is not 9 digits is refused naming registrationNumber")
s = client.tax.get_settings()
check(s["rateBps"] == 1300 and s["registrationNumber"] == "301234567", "a refused update stored nothing", s)
s = client.tax.update_settings({"label": None})
check(s["label"] == "VAT" and s["enabled"] is True, "tax.update_settings: only the keys sent change", s)

# Customer credit: add, deduct, beyond the balance and 0 refused.
cus = client.customers.create({"name": "Sita Rai"})
check(cus["creditBalance"] == 0, "a new customer has no credit", cus)
got = client.customers.add_credit(cus["id"], 50000, note="paid in advance")
check(got["id"] == cus["id"] and got["creditBalance"] == 50000, "customers.add_credit(50000, note)", got)
got = client.customers.add_credit(cus["id"], -12500)
check(got["creditBalance"] == 37500, "customers.add_credit(-12500) deducts", got)
refused(lambda: client.customers.add_credit(cus["id"], -37501), 400, "validation_failed", "amount",
        "a deduction beyond the balance is refused naming amount")
refused(lambda: client.customers.add_credit(cus["id"], 0), 400, "validation_failed", "amount",
        "an amount of 0 is refused naming amount")
refused(lambda: client.customers.add_credit("cus_01jzzzzzzzzzzzzzzzzzzzzzzz", 100), 404, "not_found", None,
        "credit for a customer that does not exist is a 404")
got = client.customers.get(cus["id"])
check(got["creditBalance"] == 37500, "customers.get shows the balance", got)

print("all SDK tax and credit calls behaved")
