"""An independent eSewa/Khalti client library (nepal-gateways, from PyPI,
unchanged) against our simulators: initiate, pay on the simulator's page
as a browser would, verify the return the library's way (eSewa's signature
and status check, Khalti's lookup). Only the endpoints are pointed at the
simulators, as a deployer points them at a sandbox. Driven by
infra/tests/tools/simulators.rs with SIM_BASE; exits non-zero on failure.
"""

import base64
import json
import os
import sys
import uuid
from urllib.parse import parse_qs, urlparse

import requests
from nepal_gateways import EsewaClient, KhaltiClient

SIM = os.environ["SIM_BASE"]
SHOP = "https://shop.example"


def check(cond, what, got=None):
    if not cond:
        print(f"FAILED: {what}: {got!r}"[:2000], file=sys.stderr)
        sys.exit(1)
    print(f"ok  {what}")


browser = requests.Session()

# eSewa ePay v2 with the public UAT product code and key (the library's
# sandbox default). Amounts under Rs 1,000: above, eSewa writes the amount
# with a thousands separator this library does not strip.
esewa = EsewaClient(
    {
        "mode": "sandbox",
        "product_code": "EPAYTEST",
        "success_url": f"{SHOP}/esewa/success",
        "failure_url": f"{SHOP}/esewa/failure",
    }
)
esewa.initiation_endpoint = f"{SIM}/esewa/api/epay/main/v2/form"
esewa.status_check_endpoint = f"{SIM}/esewa/api/epay/transaction/status/"
order = f"ng-{uuid.uuid4().hex[:12]}"
init = esewa.initiate_payment(amount=100, order_id=order, tax_amount=10)
check(init.redirect_method == "POST" and init.redirect_url == esewa.initiation_endpoint, "esewa initiate", init.form_fields)
answer = browser.post(init.redirect_url, data=init.form_fields, allow_redirects=False)
check(answer.status_code in (302, 303), "the simulator takes the library's form", answer.text[:500])
wallet = answer.headers["location"]
paid = browser.post(wallet, data={"action": "pay"}, allow_redirects=False)
check(paid.status_code == 302, "pay on the wallet page", paid.text[:500])
back = urlparse(paid.headers["location"])
check(back.path == "/esewa/success", "back at success_url", paid.headers["location"])
data = parse_qs(back.query)["data"][0]
result = esewa.verify_payment({"data": data})
check(result.is_successful and result.status_code == "COMPLETE", "esewa verify (signature + status API)", result.raw_response)
check(float(result.verified_amount) == 110.0 and result.order_id == order, "esewa amount and order", result.raw_response)
# A tampered callback is refused by the library.
claim = json.loads(base64.b64decode(data))
claim["total_amount"] = "1.0"
try:
    esewa.verify_payment({"data": base64.b64encode(json.dumps(claim).encode()).decode()})
    check(False, "a tampered eSewa callback is refused")
except Exception as e:
    check("signature" in str(e).lower(), "a tampered eSewa callback is refused", str(e))

# Khalti KPG-2 with the test key Khalti's docs print.
khalti = KhaltiClient(
    {
        "mode": "sandbox",
        "live_secret_key": "live_secret_key_68791341fdd94846a146f0457ff7b455",
        "return_url_config": f"{SHOP}/khalti/return",
        "website_url_config": SHOP,
    }
)
khalti.initiation_endpoint = f"{SIM}/khalti/api/v2/epayment/initiate/"
khalti.lookup_endpoint = f"{SIM}/khalti/api/v2/epayment/lookup/"
order = f"ng-{uuid.uuid4().hex[:12]}"
init = khalti.initiate_payment(
    amount=150000,
    order_id=order,
    description="Dhaka topi",
    customer_info={"name": "Ram Bahadur", "email": "test@khalti.com", "phone": "9800000001"},
)
pidx = init.raw_response["pidx"]
check(init.redirect_url.startswith(f"{SIM}/khalti/pay/") and pidx, "khalti initiate", init.raw_response)
page = browser.get(init.redirect_url)
check(page.status_code == 200 and 'value="pay"' in page.text, "the payer page", page.text[:300])
paid = browser.post(
    f"{SIM}/khalti/pay/",
    data={"pidx": pidx, "action": "pay", "mobile": "9800000001"},
    allow_redirects=False,
)
check(paid.status_code == 302, "pay on the payer page", paid.text[:300])
back = urlparse(paid.headers["location"])
callback = {k: v[0] for k, v in parse_qs(back.query).items()}
check(back.path == "/khalti/return" and callback["status"] == "Completed", "back at return_url", callback)
result = khalti.verify_payment(callback)
check(result.is_successful and result.status_code == "Completed", "khalti verify (lookup)", result.raw_response)
check(result.raw_response["total_amount"] == 150000, "khalti amount", result.raw_response)
print("the independent client library worked unchanged")
