"""The official merchant SDK (paybridge-np), unchanged, against a running
gateway: every method of its `coupons` and `promotion_codes` resources and
`subscriptions.apply_coupon` / `remove_discount` (issue 40 item 1). Driven by
tests/e2e/billing_coupons.rs, which passes BASE_URL and API_KEY. Exits
non-zero on the first broken expectation.
"""

import json
import os
import sys

from paybridge_np import PayBridgeError, PayBridgeNP

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
    except PayBridgeError as e:
        err = (getattr(e, "raw", None) or {}).get("error", {})
        check(
            getattr(e, "status_code", None) == status and err.get("code") == code
            and (param is None or err.get("param") == param),
            what,
            getattr(e, "raw", str(e)),
        )
        return err
    check(False, what + " (accepted)", got)


client = PayBridgeNP(api_key=KEY, base_url=BASE, max_retries=0)

plan = client.plans.create({"name": "Fibre 50", "amount": 150000, "intervalUnit": "month", "trialDays": 14})
tv = client.plans.create({"name": "TV", "amount": 50000, "intervalUnit": "month"})
sita = client.customers.create({"name": "Sita Rai"})
ram = client.customers.create({"name": "Ram Thapa"})

# Coupons: create (percent, amount), list (active, limit), get, deactivate.
launch = client.coupons.create({
    "code": "LAUNCH", "name": "Launch discount", "discountType": "percent", "percentOff": 50,
    "duration": "repeating", "durationInCycles": 3, "maxRedemptions": 100,
})
check(launch["id"].startswith("cpn_") and launch["percentOff"] == 50 and launch["durationInCycles"] == 3
      and launch["maxRedemptions"] == 100 and launch["active"] is True, "coupons.create (percent)", launch)
flat = client.coupons.create({
    "code": "TVFLAT", "name": "Rs 200 off TV", "discountType": "amount", "amountOff": 20000,
    "duration": "forever", "appliesToPlanIds": [tv["id"]], "metadata": {"campaign": "dashain"},
})
check(flat["amountOff"] == 20000 and flat["appliesToPlanIds"] == [tv["id"]], "coupons.create (amount)", flat)
for body, field in [
    ({"percentOff": 0}, "percentOff"),
    ({"percentOff": 101}, "percentOff"),
    ({"duration": "repeating"}, "durationInCycles"),
]:
    base = {"code": "BAD", "name": "Bad", "discountType": "percent", "percentOff": 10, "duration": "once"}
    refused(lambda: client.coupons.create(base | body), 400, "validation_failed", field,
            f"coupons.create refuses {body}")
refused(lambda: client.coupons.create({"code": "BAD", "name": "Bad", "discountType": "amount", "amountOff": 0,
                                       "duration": "once"}), 400, "validation_failed", "amountOff",
        "coupons.create refuses amountOff 0")
refused(lambda: client.coupons.create({"code": "launch", "name": "Again", "discountType": "percent",
                                       "percentOff": 5, "duration": "once"}), 409, "coupon_code_taken", "code",
        "coupons.create refuses a taken code, any case")
listed = client.coupons.list(limit=1)
check(listed["total"] == 2 and len(listed["data"]) == 1 and listed["data"][0]["id"] == flat["id"],
      "coupons.list(limit)", listed)
check(client.coupons.get(launch["id"]) == launch, "coupons.get", client.coupons.get(launch["id"]))

# Promotion codes: create (upper-cased), list, get, validate.
promo = client.promotion_codes.create({"couponId": launch["id"], "code": "launch50", "maxRedemptions": 500,
                                       "expiresAt": "2031-06-01T00:00:00Z"})
check(promo["id"].startswith("promo_") and promo["code"] == "LAUNCH50" and promo["couponId"] == launch["id"],
      "promotion_codes.create upper-cases", promo)
vip = client.promotion_codes.create({"couponId": launch["id"], "code": "VIP", "customerIds": [sita["id"]],
                                     "minimumAmount": 100000, "firstTimeTransaction": True})
refused(lambda: client.promotion_codes.create({"couponId": launch["id"], "code": "Launch50"}), 409,
        "promotion_code_taken", "code", "promotion_codes.create refuses a taken code")
codes = client.promotion_codes.list(coupon_id=launch["id"], active=True, limit=10)
check(codes["total"] == 2 and {c["id"] for c in codes["data"]} == {promo["id"], vip["id"]},
      "promotion_codes.list(coupon_id, active, limit)", codes)
check(client.promotion_codes.get(promo["id"]) == promo, "promotion_codes.get")
v = client.promotion_codes.validate({"code": "launch50", "planId": plan["id"], "amount": 50000})
check(v["valid"] is True and v["coupon"]["id"] == launch["id"] and v["promotion_code"]["id"] == promo["id"]
      and v["discount_preview"]["discount"] == 25000, "promotion_codes.validate: valid", v)
v = client.promotion_codes.validate({"code": "VIP", "customerId": ram["id"], "planId": plan["id"]})
check(v["valid"] is False and isinstance(v["reason"], str), "promotion_codes.validate: another customer", v)
v = client.promotion_codes.validate({"code": "VIP", "customerId": sita["id"], "amount": 99999})
check(v["valid"] is False, "promotion_codes.validate: below the minimum", v)
v = client.promotion_codes.validate({"code": "VIP", "customerId": sita["id"], "planId": plan["id"]})
check(v["valid"] is True, "promotion_codes.validate: the customer, first time, above the minimum", v)
check(client.promotion_codes.get(vip["id"])["redeemedCount"] == 0, "validate redeems nothing")

# Apply to a subscription, by code then by coupon; remove.
sub = client.subscriptions.create({"customerId": sita["id"], "planId": plan["id"]})
applied = client.subscriptions.apply_coupon(sub["id"], {"promotionCode": "vip"})
check(applied["id"] == sub["id"] and applied["discount"]["couponId"] == launch["id"]
      and applied["discount"]["promotionCode"] == "VIP" and applied["discount"]["cyclesRemaining"] == 3,
      "subscriptions.apply_coupon(promotionCode)", applied)
err = refused(lambda: client.subscriptions.apply_coupon(sub["id"], {"couponId": flat["id"]}), 400,
              "validation_failed", "couponId", "apply_coupon refuses a coupon for another plan")
check(err.get("reason") == "plan_not_eligible", "... saying why", err)
check(client.coupons.get(launch["id"])["redeemedCount"] == 1 and client.promotion_codes.get(vip["id"])["redeemedCount"] == 1,
      "the coupon's and the code's counters")
removed = client.subscriptions.remove_discount(sub["id"])
check(removed["id"] == sub["id"] and removed["discount"] is None, "subscriptions.remove_discount", removed)
refused(lambda: client.subscriptions.remove_discount(sub["id"]), 404, "not_found", None,
        "remove_discount without a discount: NotFoundError")
again = client.subscriptions.apply_coupon(sub["id"], {"couponId": launch["id"]})
check(again["discount"]["promotionCodeId"] is None, "subscriptions.apply_coupon(couponId)", again)

# Deactivate: the code by PATCH, the coupon by DELETE (soft).
off = client.promotion_codes.deactivate(promo["id"])
check(off["active"] is False, "promotion_codes.deactivate", off)
v = client.promotion_codes.validate({"code": "LAUNCH50"})
check(v["valid"] is False, "a deactivated code does not validate", v)
gone = client.coupons.deactivate(flat["id"])
check(gone["id"] == flat["id"] and gone["active"] is False, "coupons.deactivate", gone)
check(client.coupons.list(active=True)["total"] == 1, "coupons.list(active=True)")

print("all SDK coupon calls behaved")
