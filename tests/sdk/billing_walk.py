"""A year of recurring billing on a sandbox test clock, as a merchant's code
drives it with the official SDK (paybridge-np, unchanged) against a running
gateway: issue 39's "Done when" walk. Driven by tests/e2e/billing_walk.rs,
which starts the gateway and passes BASE_URL, API_KEY, MERCHANT (the name
reminders carry) and SMS_LOG (a test-only read of the sandbox SMS log:
sandbox SMS are logged, never delivered, and no API lists their text).

Two subscriptions walk the same year, each on its own clock: a monthly plan
on Gregorian months (a customer reached in English) and one on Bikram Sambat
months (`calendar: "bs"`, a customer reached in Nepali), so BS month lengths
(29 to 32 days) show in the periods. Each walk: a 14-day trial (its
trial-ending reminder), the first invoice paid through the Khalti simulator
(the bill page, the hosted checkout, the wallet), more paid on time, a pause
and resume (the period that begins while paused is not billed), an invoice
paid late after going overdue, one dunned by a policy to its final action
(`mark_uncollectible`), and a cancel at period end; then the clock runs to a
year after its start and nothing more happens.

Every checkpoint is an explicit row of the month tables below: what the
clock is advanced to (or what the merchant or customer does), and exactly
what must have appeared since the previous checkpoint: webhooks by type and
count (signed, verified with the SDK's `construct_event`), reminders by kind
(each one SMS in the log and one email in the mail simulator's inbox, their
full text: the amount, the AD date with its Miti, the invoice number, and a
link that leads to the invoice), invoices by status, and the subscription's
status. Exits non-zero on the first broken expectation.

The reminder schedule asserted (docs/billing.md, "Reminders"): notices at
07:00 Nepal time of their day, never before the invoice is issued;
`due_today` on the due day (the period's first day); `before_due` on
`overdueOn - reminderDaysBeforeDue` showing the last day to pay; `overdue`
on `overdueOn`, again every `overdueReminderIntervalDays` without a dunning
policy; with one, a `dunning` reminder on `overdueOn + d` for each retry
interval d, then the final action; `trial_ending` three days before the
trial ends.
"""

import datetime as dt
import json
import os
import sys
import threading
import time
from collections import Counter
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import urlsplit

import httpx
from paybridge_np import PayBridgeNP

BASE = os.environ["BASE_URL"].rstrip("/")
KEY = os.environ["API_KEY"]
MERCHANT = os.environ["MERCHANT"]
SMS_LOG = os.environ["SMS_LOG"]

# How often a poll asks, and how long a wait may take at most.
POLL = 0.05
DEADLINE = 60.0


def check(cond, what, got=None):
    if not cond:
        print(f"FAILED: {what}: {json.dumps(got, default=str, ensure_ascii=False)[:4000]}", file=sys.stderr)
        sys.exit(1)
    print(f"ok  {what}")


def must(cond, what, got=None):
    """`check` without the line (for the reads a poll repeats)."""
    if not cond:
        check(cond, what, got)


def until(what, probe, deadline=DEADLINE):
    """Calls `probe` every POLL until it answers (ok, seen) with ok; fails
    with the last `seen` after `deadline` seconds."""
    stop = time.monotonic() + deadline
    while True:
        ok, seen = probe()
        if ok:
            return seen
        if time.monotonic() > stop:
            check(False, f"timed out waiting for {what}", seen)
        time.sleep(POLL)


# --- time: Nepal days (UTC+05:45), BS dates as the tables spell them

NPT = dt.timezone(dt.timedelta(hours=5, minutes=45))
DAY = dt.timedelta(days=1)


def at(day, hh=7, mm=45):
    """`day` (a Nepal day) at hh:mm Nepal time, as the API's RFC 3339."""
    local = dt.datetime(day.year, day.month, day.day, hh, mm, tzinfo=NPT)
    return local.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s):
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00"))


def d(s):
    return dt.date.fromisoformat(s)


MONTHS_LATIN = ["Baisakh", "Jestha", "Asar", "Shrawan", "Bhadra", "Asoj", "Kartik", "Mangsir", "Poush",
                "Magh", "Falgun", "Chaitra"]
MONTHS_DEVANAGARI = ["बैशाख", "जेठ", "असार", "साउन", "भदौ", "असोज", "कार्तिक", "मंसिर", "पुष", "माघ", "फागुन", "चैत"]
DIGITS = "०१२३४५६७८९"

# Bikram Sambat month lengths of the years walked (published calendar), and
# a published anchor: BS 2082 Baisakh 1 is 2025-04-14.
BS_MONTHS = {
    2082: [31, 31, 32, 31, 31, 31, 30, 29, 30, 29, 30, 30],
    2083: [31, 31, 32, 31, 31, 31, 30, 29, 30, 29, 30, 30],
}
BS_ANCHOR = dt.date(2025, 4, 14)


def bs(day):
    n, year, month = (day - BS_ANCHOR).days, 2082, 0
    while n >= BS_MONTHS[year][month]:
        n -= BS_MONTHS[year][month]
        month += 1
        if month == 12:
            year, month = year + 1, 0
    return year, month + 1, n + 1


def miti(day, locale):
    y, m, dd = bs(day)
    if locale == "ne":
        digits = lambda n: "".join(DIGITS[int(c)] for c in str(n))  # noqa: E731
        return f"{digits(y)} {MONTHS_DEVANAGARI[m - 1]} {digits(dd)}"
    return f"{y} {MONTHS_LATIN[m - 1]} {dd}"


# --- the month tables

T0 = "2026-01-10T06:00:00Z"  # 11:45 in Nepal, 2082 Poush 26
TRIAL_END = d("2026-01-24")  # 14 days on, 11:45 Nepal time
A_YEAR_ON = "2027-01-10T06:00:00Z"

# The first day of each period, periods 0 to 11 (the last is never billed:
# the cancel at period end takes effect on it). Gregorian months: the 24th.
AD_PERIODS = [d(f"{2026 + (m // 12)}-{m % 12 + 1:02d}-24") for m in range(12)]
# Bikram Sambat months: the 10th of each BS month from 2082 Magh 10. Their
# lengths: 29, 30, 30, 31, 31, 32, 31, 31, 31, 30, 29 days.
BS_PERIODS = [d(s) for s in [
    "2026-01-24",  # 2082 Magh 10
    "2026-02-22",  # 2082 Falgun 10
    "2026-03-24",  # 2082 Chaitra 10
    "2026-04-23",  # 2083 Baisakh 10 (begins while paused: not billed)
    "2026-05-24",  # 2083 Jestha 10 (paid late)
    "2026-06-24",  # 2083 Asar 10 (dunned: uncollectible)
    "2026-07-26",  # 2083 Shrawan 10
    "2026-08-26",  # 2083 Bhadra 10
    "2026-09-26",  # 2083 Asoj 10
    "2026-10-27",  # 2083 Kartik 10
    "2026-11-26",  # 2083 Mangsir 10 (cancel at period end asked)
    "2026-12-25",  # 2083 Poush 10 (cancelled, not billed)
]]
check(
    [bs(p)[2] for p in BS_PERIODS] == [10] * 12 and [bs(p)[1] for p in BS_PERIODS] == [10, 11, 12] + list(range(1, 10)),
    "the BS table is the 10th of consecutive BS months",
    [bs(p) for p in BS_PERIODS],
)
check(miti(d("2026-01-10"), "en") == "2082 Poush 26" and miti(d("2025-04-14"), "ne") == "२०८२ बैशाख १",
      "the Miti helper agrees with the published dates")

GRACE = 5  # overdueOn = due + 5
BEFORE = 2  # before_due on overdueOn - 2 = due + 3, showing due + 4
EVERY = 3  # overdue reminders every 3 days without dunning
RETRIES = [2, 5]  # the dunning policy: overdueOn + 2, overdueOn + 5
BILLED = [0, 1, 2, 4, 5, 6, 7, 8, 9, 10]  # periods with an invoice
PAID_ON_TIME = [0, 1, 2, 6, 7, 8, 9, 10]
PAID_LATE, DUNNED, PAUSED_PERIOD, CANCEL_ASKED, CANCELLED_ON = 4, 5, 3, 10, 11

WEBHOOK_TYPES = [
    "subscription.created", "subscription.activated", "subscription.trial_will_end",
    "subscription.trial_ended", "subscription.trial_extended", "subscription.past_due",
    "subscription.paused", "subscription.resumed", "subscription.cancelled",
    "billing_invoice.created", "billing_invoice.paid", "billing_invoice.overdue",
    "billing_invoice.voided", "billing_invoice.uncollectible", "billing_invoice.payment_refunded",
]


def steps(p):
    """The walk over the periods `p` (Nepal days): each row is (title, what
    to do, what must have appeared since the previous row). A reminder is
    (kind, period or None for the trial, the day its text shows)."""
    out = []
    row = lambda title, do, hooks=None, notices=(), invoices=None, sub=None: out.append(  # noqa: E731
        (title, do, hooks or {}, list(notices), invoices or {}, sub))
    row("subscribed (trialing)", ("none",), {"subscription.created": 1}, sub="trialing")
    # Three days before the trial ends (11:45 Nepal time: at once).
    row("trial ends in 3 days", ("advance", at(TRIAL_END - 2 * DAY)),
        {"subscription.trial_will_end": 1}, [("trial_ending", None, TRIAL_END)], sub="trialing")
    row("trial ended: the first invoice", ("advance", "2026-01-24T07:00:00Z"),
        {"subscription.trial_ended": 1, "billing_invoice.created": 1}, [("due_today", 0, p[0])],
        {0: "open"}, "active")
    row("the first invoice paid through Khalti", ("pay", 0), {"billing_invoice.paid": 1}, (), {0: "paid"}, "active")
    for k in (1, 2):
        row(f"period {k}: invoiced", ("advance", at(p[k])), {"billing_invoice.created": 1},
            [("due_today", k, p[k])], {k: "open"}, "active")
        row(f"period {k}: paid on its day", ("pay", k), {"billing_invoice.paid": 1}, (), {k: "paid"}, "active")
    row("paused mid-period 2", ("advance", at(p[2] + 12 * DAY)), sub="active")
    row("pause", ("pause",), {"subscription.paused": 1}, sub="paused")
    row("period 3 begins while paused: not billed", ("advance", at(p[3] + 3 * DAY)), sub="paused")
    row("resume", ("resume",), {"subscription.resumed": 1}, sub="active")
    k = PAID_LATE
    row(f"period {k}: invoiced", ("advance", at(p[k])), {"billing_invoice.created": 1},
        [("due_today", k, p[k])], {k: "open"}, "active")
    row(f"period {k}: due soon", ("advance", at(p[k] + 3 * DAY)), {}, [("before_due", k, p[k] + 4 * DAY)],
        {k: "open"}, "active")
    row(f"period {k}: overdue (mark_past_due)", ("advance", at(p[k] + GRACE * DAY)),
        {"billing_invoice.overdue": 1, "subscription.past_due": 1}, [("overdue", k, p[k])],
        {k: "overdue"}, "past_due")
    row(f"period {k}: overdue again after {EVERY} days", ("advance", at(p[k] + (GRACE + EVERY) * DAY)),
        {}, [("overdue", k, p[k])], {k: "overdue"}, "past_due")
    row(f"period {k}: paid late", ("pay", k), {"billing_invoice.paid": 1, "subscription.activated": 1}, (),
        {k: "paid"}, "active")
    row(f"period {k}: its reminders on the invoice's dunning view",
        ("reminders", k, [(0, "due_today"), (3, "before_due"), (GRACE, "overdue"), (GRACE + EVERY, "overdue")]))
    row("a paid invoice gets no more reminders", ("advance", at(p[k] + (GRACE + 4 * EVERY) * DAY)), sub="active")
    row("the subscription's own dunning policy", ("set_policy",), sub="active")
    k = DUNNED
    row(f"period {k}: invoiced", ("advance", at(p[k])), {"billing_invoice.created": 1},
        [("due_today", k, p[k])], {k: "open"}, "active")
    row(f"period {k}: due soon, then overdue and dunned", ("advance", at(p[k] + GRACE * DAY)),
        {"billing_invoice.overdue": 1, "subscription.past_due": 1},
        [("before_due", k, p[k] + 4 * DAY), ("overdue", k, p[k])], {k: "overdue"}, "past_due")
    row(f"period {k}: dunned to the final action", ("advance", at(p[k] + (GRACE + RETRIES[-1]) * DAY)),
        {"billing_invoice.uncollectible": 1}, [("dunning", k, None), ("dunning", k, None)],
        {k: "uncollectible"}, "past_due")
    row("the dunning is exhausted", ("dunning_exhausted", k))
    row(f"period {k}: its reminders on the invoice's dunning view",
        ("reminders", k, [(0, "due_today"), (3, "before_due"), (GRACE, "overdue")]
         + [(GRACE + r, "dunning") for r in RETRIES]))
    for k in PAID_ON_TIME[3:]:
        row(f"period {k}: invoiced", ("advance", at(p[k])), {"billing_invoice.created": 1},
            [("due_today", k, p[k])], {k: "open"}, "past_due" if k == 6 else "active")
        hooks = {"billing_invoice.paid": 1}
        if k == 6:
            hooks["subscription.activated"] = 1  # past_due: only a payment brings it back
        row(f"period {k}: paid on its day", ("pay", k), hooks, (), {k: "paid"}, "active")
    row("cancel at period end", ("cancel_at_period_end",), sub="active")
    k = CANCELLED_ON
    row(f"period {k}: cancelled, not billed", ("advance", at(p[k])), {"subscription.cancelled": 1}, sub="cancelled")
    row("a year on: nothing more", ("advance", A_YEAR_ON), sub="cancelled")
    return out


# --- the webhook receiver (a merchant's endpoint on 127.0.0.1)

class Receiver(BaseHTTPRequestHandler):
    hits = []  # (path, headers, body)
    lock = threading.Lock()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
        with Receiver.lock:
            Receiver.hits.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", 0), Receiver)
threading.Thread(target=server.serve_forever, daemon=True).start()
HOOKS = f"http://127.0.0.1:{server.server_address[1]}"

client = PayBridgeNP(api_key=KEY, base_url=BASE, max_retries=0)
api = httpx.Client(base_url=BASE, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
web = httpx.Client(follow_redirects=False, timeout=60)

billing_hooks = client.webhooks.create(url=f"{HOOKS}/billing", events=WEBHOOK_TYPES)
SECRET = billing_hooks["signing_secret"]
# `invoice.paid` stays the one-time invoice's: this endpoint gets nothing.
one_time = client.webhooks.create(url=f"{HOOKS}/one-time", events=["invoice.paid"])


VERIFIED = []  # the events of Receiver.hits, in order, each verified once


def events():
    """Every billing event delivered so far, by id, each verified (its
    signature and its timestamp's tolerance) the first time it is read: a
    slow run must not find an early delivery "too old" when it reads it
    again minutes later."""
    with Receiver.lock:
        hits = list(Receiver.hits)
    for path, headers, body in hits[len(VERIFIED):]:
        must(path == "/billing", "only the billing endpoint gets billing events", (path, body))
        VERIFIED.append(
            PayBridgeNP.webhooks_static.construct_event(body, headers.get("x-service-signature"), SECRET)
        )
    out = {}
    for event in VERIFIED:
        if event["id"] in out:
            check(False, "an event delivered twice", event)
        out[event["id"]] = event
    return out


def sms_log():
    r = httpx.get(f"{SMS_LOG}/sms", timeout=30)
    must(r.status_code == 200, "the SMS log answers", r.text)
    return r.json()["sms"]


def inbox():
    r = httpx.get(f"{BASE}/sim/mail/_control/messages", timeout=30)
    must(r.status_code == 200, "the mail inbox answers", r.text)
    return r.json()["messages"]


# --- the customer's browser: the bill page, the checkout, Khalti

class Forms(HTMLParser):
    def __init__(self):
        super().__init__()
        self.forms = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self.forms.append({"action": a.get("action", ""), "fields": []})
        elif tag == "input" and self.forms and a.get("type") == "hidden" and a.get("name"):
            self.forms[-1]["fields"].append((a["name"], a.get("value") or ""))


def absolute(u):
    return BASE + u if u.startswith("/") else u


FORM = {"content-type": "application/x-www-form-urlencoded"}


def pay(invoice):
    """The customer opens the invoice's pay page, picks Khalti and pays in
    the simulator's wallet; the return settles the payment."""
    r = web.post(invoice["payUrl"], content=b"", headers=FORM)
    check(r.status_code == 303 and "/c/cs_" in r.headers.get("location", ""), "the bill page opens a checkout",
          [r.status_code, dict(r.headers), r.text[:500]])
    session = r.headers["location"].rsplit("/c/", 1)[1]
    r = web.post(f"{BASE}/c/{session}/pay", content=b"provider=khalti", headers=FORM)
    check(r.status_code == 303, "the picker hands off to Khalti", [r.status_code, r.text[:500]])
    wallet = absolute(r.headers["location"])
    check(wallet.startswith(f"{BASE}/sim/khalti/pay"), "Khalti's page", wallet)
    page = web.get(wallet)
    parser = Forms()
    parser.feed(page.text)
    check(page.status_code == 200 and parser.forms, "Khalti's page has its form", page.text[:500])
    form = parser.forms[0]
    fields = form["fields"] + [("action", "pay")]
    r = web.post(absolute(form["action"]), data=dict(fields))
    check(r.status_code == 302, "Khalti pays and sends the customer back", [r.status_code, r.text[:500]])
    back = web.get(absolute(r.headers["location"]))
    check(back.status_code == 303, "the return settles the payment", [back.status_code, back.text[:500]])


# --- reminders: the exact text, and where its link leads

def amount_text(paisa):
    return f"{paisa // 100:,}.{paisa % 100:02d}"


def prefix(locale, kind, number, amount, day):
    """The reminder's text up to its link (the link is the last word)."""
    m, amt = MERCHANT, amount_text(amount)
    when = f"{day.isoformat()} ({miti(day, 'en')})" if day else None
    mt = miti(day, "ne") if day else None
    if locale == "en":
        return {
            "before_due": f"{m}: invoice {number} of Rs {amt} is due {when}. Pay: ",
            "due_today": f"{m}: invoice {number} of Rs {amt} is due today {when}. Pay: ",
            "overdue": f"{m}: invoice {number} of Rs {amt} was due {when} and is unpaid. Pay: ",
            "trial_ending": f"{m}: your trial ends {when}; then Rs {amt} is charged. Details: ",
            "dunning": f"{m}: payment of Rs {amt} for invoice {number} failed. Please pay: ",
        }[kind]
    return {
        "before_due": f"{m}: रु. {amt} को बिल {mt} सम्म तिर्नुहोस्। ",
        "due_today": f"{m}: रु. {amt} को बिल आज {mt} तिर्नुहोस्। ",
        "overdue": f"{m}: रु. {amt} को बिल {mt} मा तिर्नुपर्ने थियो। ",
        "trial_ending": f"{m}: परीक्षण {mt} मा सकिन्छ, त्यसपछि रु. {amt}। ",
        "dunning": f"{m}: रु. {amt} भुक्तानी असफल भयो। तिर्नुहोस्: ",
    }[kind]


def subject(locale, kind, number):
    m = MERCHANT
    if locale == "en":
        return {
            "before_due": f"{m}: invoice {number} is due soon",
            "due_today": f"{m}: invoice {number} is due today",
            "overdue": f"{m}: invoice {number} is overdue",
            "trial_ending": f"{m}: your trial ends soon",
            "dunning": f"{m}: payment for invoice {number} failed",
        }[kind]
    return {
        "before_due": f"{m}: बिल {number} तिर्ने मिति नजिकियो",
        "due_today": f"{m}: बिल {number} आज तिर्नुपर्छ",
        "overdue": f"{m}: बिल {number} को म्याद नाघ्यो",
        "trial_ending": f"{m}: तपाईंको परीक्षण सकिँदैछ",
        "dunning": f"{m}: बिल {number} को भुक्तानी असफल",
    }[kind]


def split_link(text):
    cut = text.rfind(" ")
    return text[: cut + 1], text[cut + 1:]


def leads_to(link, invoice):
    """The reminder's link leads to the invoice's pay page: it is the pay
    page, or a short `/r/` link that sends the customer there. A trial's
    link (`invoice` None) is a short link to a page showing the trial's
    end."""
    check(link.startswith("http"), "a reminder's link is a URL", link)
    path = urlsplit(link).path
    if invoice is not None and link == invoice["payUrl"]:
        return
    check(path.startswith("/r/"), "a reminder's link is the pay page or a short link", [link, invoice])
    r = web.get(BASE + path)
    if invoice is None:
        check(r.status_code == 200 and TRIAL_END.isoformat() in r.text, "the trial's link shows the trial's end",
              [link, r.status_code, r.text[:1000]])
        return
    to = urlsplit(r.headers.get("location", "")).path
    check(r.status_code in (302, 303, 307) and to == urlsplit(invoice["payUrl"]).path,
          "the short link leads to the bill page", [link, r.status_code, to, invoice["payUrl"]])


# --- one subscription's walk

class Walk:
    def __init__(self, label, calendar, locale, periods, amount, phone, email):
        self.label, self.calendar, self.locale, self.periods = label, calendar, locale, periods
        self.amount, self.phone, self.email = amount, phone, email
        self.seen_events, self.seen_sms, self.seen_mail = set(), set(), 0
        self.invoices = {}  # period -> invoice id
        clock = api.post("/v1/billing/test-clocks", json={"frozenTime": T0, "name": f"{label} year"})
        check(clock.status_code == 201 and clock.json()["status"] == "ready", f"{label}: a test clock", clock.text)
        self.clock = clock.json()["id"]
        # The SDK passes `testClockId` through unchanged: the customer lives on the clock.
        customer = client.customers.create({"name": f"{label} customer", "email": email, "phone": phone,
                                            "locale": locale, "testClockId": self.clock})
        check(customer["testClockId"] == self.clock, f"{label}: customers.create on the clock", customer)
        self.plan = client.plans.create({
            "name": f"Fibre 50 ({label})", "amount": amount, "currency": "NPR", "intervalUnit": "month",
            "intervalCount": 1, "calendar": calendar, "trialDays": 14, "gracePeriodDays": GRACE,
            "reminderDaysBeforeDue": BEFORE, "overdueReminderIntervalDays": EVERY, "overdueAction": "mark_past_due",
        })
        check(self.plan["id"].startswith("bp_"), f"{label}: plans.create", self.plan)
        self.policy = client.dunning.create_policy(
            name=f"{label}: two reminders", retry_intervals_days=RETRIES, final_action="mark_uncollectible")
        sub = client.subscriptions.create({"customerId": customer["id"], "planId": self.plan["id"],
                                           "referenceId": f"{label}-line-7"})
        check(sub["status"] == "trialing" and sub["testClockId"] == self.clock
              and parse_time(sub["trialEndsAt"]) == parse_time("2026-01-24T06:00:00Z"),
              f"{label}: subscriptions.create trials from the clock's time", sub)
        self.sub = sub["id"]

    # what the merchant and the customer do
    def advance(self, to):
        r = api.post(f"/v1/billing/test-clocks/{self.clock}/advance", json={"frozenTime": to})
        check(r.status_code == 200 and r.json()["status"] in ("advancing", "ready"),
              f"{self.label}: advance to {to} answers at once", r.text)

        def ready():
            c = api.get(f"/v1/billing/test-clocks/{self.clock}")
            body = c.json()
            return c.status_code == 200 and body["status"] == "ready", body

        clock = until(f"{self.label}: the clock ready at {to}", ready)
        check(parse_time(clock["frozenTime"]) == parse_time(to), f"{self.label}: the clock is at {to}", clock)

    def do(self, action):
        kind = action[0]
        if kind == "advance":
            self.advance(action[1])
        elif kind == "pay":
            pay(client.invoices.get(self.invoices[action[1]]))
        elif kind == "pause":
            s = client.subscriptions.pause(self.sub, {"pauseReason": "travelling"})
            check(s["status"] == "paused", f"{self.label}: subscriptions.pause", s)
        elif kind == "resume":
            s = client.subscriptions.resume(self.sub)
            check(s["status"] == "active", f"{self.label}: subscriptions.resume", s)
        elif kind == "cancel_at_period_end":
            s = client.subscriptions.cancel(self.sub, {"cancelReason": "moving", "atPeriodEnd": True})
            check(s["cancelAtPeriodEnd"] is True and s["status"] == "active",
                  f"{self.label}: subscriptions.cancel(atPeriodEnd)", s)
        elif kind == "dunning_exhausted":
            inv = self.invoices[action[1]]
            dun = client.dunning.get_invoice_status(inv)
            # Each interval's reminder went by SMS (logged) and email (queued),
            # at 07:00 Nepal time of overdueOn + its days.
            overdue_on = self.periods[action[1]] + GRACE * DAY
            got = sorted((a["interval"], parse_time(a["at"]), a["channel"], a["outcome"], a["kind"])
                         for a in dun["attempts"])
            want = sorted((i, parse_time(at(overdue_on + r * DAY, 7, 0)), ch, out, "reminder")
                          for i, r in enumerate(RETRIES) for ch, out in (("sms", "logged"), ("email", "queued")))
            check(dun["status"] == "exhausted" and dun["policyId"] == self.policy["id"] and got == want
                  and dun["invoiceStatus"] == "uncollectible" and dun["nextAttemptOn"] is None,
                  f"{self.label}: dunning.get_invoice_status: exhausted after its intervals", dun)
        elif kind == "reminders":
            # Every notice of the invoice, each channel with its outcome and
            # the message it sent (the SMS the log has).
            _, k, schedule = action
            dun = client.dunning.get_invoice_status(self.invoices[k])
            got = sorted((d(r["day"]), r["kind"], r["channel"], r["outcome"]) for r in dun["reminders"])
            want = sorted((self.periods[k] + off * DAY, kd, ch, out) for off, kd in schedule
                          for ch, out in (("sms", "logged"), ("email", "queued")))
            # A message id names the SMS in the log. (Known gap: when two
            # drivers of the clock race, the one that finds the SMS already
            # claimed records no id: only ids present are compared.)
            sms_ids = {r["messageId"] for r in dun["reminders"] if r["channel"] == "sms" and r["messageId"]}
            mail_ids = [r["messageId"] for r in dun["reminders"] if r["channel"] == "email"]
            check(got == want and sms_ids <= self.seen_sms and all(i and i.startswith("mail_") for i in mail_ids),
                  f"{self.label}: dunning.get_invoice_status lists invoice {k}'s reminders", dun)
        elif kind == "set_policy":
            s = client.dunning.set_subscription_policy(self.sub, self.policy["id"])
            check(s["dunningPolicyId"] == self.policy["id"], f"{self.label}: dunning.set_subscription_policy", s)

    # what must have appeared
    def mine(self, event):
        o = event["data"]["object"]
        return o.get("id") == self.sub or o.get("subscriptionId") == self.sub

    def learn_invoices(self):
        listed = client.invoices.list(subscription_id=self.sub, limit=100)
        by_start = {d(i["periodStart"]): i for i in listed["data"]}
        for k, p in enumerate(self.periods):
            if p in by_start:
                self.invoices[k] = by_start[p]["id"]
        check(set(by_start) <= set(self.periods), f"{self.label}: every invoice is for a period of the table",
              sorted(map(str, by_start)))
        return listed

    def verify(self, title, hooks, notices, invoices, sub_status):
        what = f"{self.label}: {title}"
        # Webhooks: exactly these, by type and count.
        def new_events():
            got = [e for e in events().values() if self.mine(e) and e["id"] not in self.seen_events]
            counts = Counter(e["type"] for e in got)
            return counts == Counter(hooks), (dict(counts), hooks)
        until(f"{what}: webhooks", new_events)
        fresh = [e for e in events().values() if self.mine(e) and e["id"] not in self.seen_events]
        for e in fresh:
            o = e["data"]["object"]
            if e["type"].startswith("subscription."):
                check(o["id"] == self.sub, f"{what}: {e['type']} carries the subscription", e)
            else:
                check(o["subscriptionId"] == self.sub, f"{what}: {e['type']} carries the invoice", e)
            self.seen_events.add(e["id"])
        listed = self.learn_invoices()
        by_id = {i["id"]: i for i in listed["data"]}
        # The subscription's and the invoices' statuses.
        s = client.subscriptions.get(self.sub)
        if sub_status:
            check(s["status"] == sub_status, f"{what}: the subscription is {sub_status}", s)
        for k, status in invoices.items():
            check(k in self.invoices, f"{what}: period {k} has its invoice", listed)
            inv = by_id[self.invoices[k]]
            p = self.periods[k]
            nxt = self.periods[k + 1]
            check(inv["status"] == status and inv["amountDue"] == self.amount
                  and d(inv["periodStart"]) == p and d(inv["periodEnd"]) == nxt and d(inv["dueDate"]) == p
                  and d(inv["overdueOn"]) == p + GRACE * DAY and inv["due"]["ad"] == p.isoformat()
                  and miti(p, "en") in inv["due"]["bs"],
                  f"{what}: invoice {k} is {status}, for {p} to {nxt} ({(nxt - p).days} days, due {miti(p, 'en')})",
                  inv)
        check(sorted(self.invoices) == [k for k in BILLED if k in self.invoices]
              and len(listed["data"]) == len(self.invoices),
              f"{what}: invoices only for billed periods", sorted(self.invoices))
        # Fresh webhook objects name only this walk's invoices.
        for e in fresh:
            if e["type"].startswith("billing_invoice."):
                check(e["data"]["object"]["id"] in by_id, f"{what}: {e['type']} names an invoice of the walk", e)
        # Reminders: one SMS and one email each, their exact text.
        expected = Counter()
        for kind, k, day in notices:
            number = by_id[self.invoices[k]]["number"] if k is not None else None
            expected[(prefix(self.locale, kind, number, self.amount, day), subject(self.locale, kind, number), k)] += 1

        def new_sms():
            got = [m for m in sms_log() if m["to"].endswith(self.phone[-9:]) and m["id"] not in self.seen_sms]
            return len(got) >= sum(expected.values()), got
        got = until(f"{what}: SMS", new_sms)
        got_prefixes = Counter(split_link(m["text"])[0] for m in got)
        check(got_prefixes == Counter({p: n for (p, _, _), n in expected.items()}),
              f"{what}: the SMS log has exactly {sum(expected.values())} new reminders, their text exact",
              [m["text"] for m in got])
        by_prefix = {p: k for (p, _, k) in expected}
        for m in got:
            check(m["status"] == "logged", f"{what}: a sandbox SMS is logged, never delivered", m)
            head, link = split_link(m["text"])
            k = by_prefix[head]
            leads_to(link, by_id[self.invoices[k]] if k is not None else None)
            if k is not None:
                check(m.get("invoiceId") == self.invoices[k], f"{what}: the SMS is bound to its invoice", m)
            self.seen_sms.add(m["id"])
        total = self.seen_mail + sum(expected.values())

        def new_mail():
            mine = [m for m in inbox() if m["to"] == self.email]
            return len(mine) >= total, mine
        mine = until(f"{what}: emails", new_mail)
        fresh_mail = mine[self.seen_mail:]
        check(len(mine) == total, f"{what}: exactly {len(fresh_mail)} new emails", [m["subject"] for m in fresh_mail])
        got_mail = Counter((split_link(m["text"].split("\n")[0])[0], m["subject"]) for m in fresh_mail)
        check(got_mail == Counter({(p, s): n for (p, s, _), n in expected.items()}),
              f"{what}: each reminder's email, its subject and text exact", [(m["subject"], m["text"]) for m in fresh_mail])
        for m in fresh_mail:
            head, link = split_link(m["text"].split("\n")[0])
            k = by_prefix[head]
            check(f'href="{link}"' in m["html"], f"{what}: the email links the same link", m["html"])
            leads_to(link, by_id[self.invoices[k]] if k is not None else None)
        self.seen_mail = total
        print(f"ok  {what}: {dict(Counter(hooks))} webhooks, {sum(expected.values())} SMS and emails")

    def run(self):
        for title, action, hooks, notices, invoices, sub_status in steps(self.periods):
            self.do(action)
            self.verify(title, hooks, notices, invoices, sub_status)


walks = [
    Walk("AD", "ad", "en", AD_PERIODS, 150000, "9841000001", "ad-customer@example.com"),
    Walk("BS", "bs", "ne", BS_PERIODS, 120000, "9841000002", "bs-customer@example.com"),
]
for w in walks:
    w.run()

# A year for both: the totals, and nothing arrived late or twice.
time.sleep(1.0)  # longer than a webhook retry: anything extra would show now
for w in walks:
    mine = [e for e in events().values() if w.mine(e)]
    check(len(mine) == len(w.seen_events), f"{w.label}: no webhook came late", [e["type"] for e in mine])
    counts = Counter(e["type"] for e in mine)
    check(counts == Counter({
        "subscription.created": 1, "subscription.trial_will_end": 1, "subscription.trial_ended": 1,
        "billing_invoice.created": len(BILLED), "billing_invoice.paid": len(BILLED) - 1,
        "subscription.paused": 1, "subscription.resumed": 1, "billing_invoice.overdue": 2,
        "subscription.past_due": 2, "subscription.activated": 2, "billing_invoice.uncollectible": 1,
        "subscription.cancelled": 1,
    }), f"{w.label}: a year's webhooks", dict(counts))
    sms = [m for m in sms_log() if m["to"].endswith(w.phone[-9:])]
    mails = [m for m in inbox() if m["to"] == w.email]
    # 1 trial ending + 10 due today + 2 before due + 3 overdue + 2 dunning.
    check(len(sms) == 18 and len(mails) == 18, f"{w.label}: a year's reminders: 18 SMS, 18 emails",
          [len(sms), len(mails)])
check(len(sms_log()) < 100, "the SMS log read was complete")
with Receiver.lock:
    check(all(path == "/billing" for path, _, _ in Receiver.hits), "the invoice.paid endpoint got nothing")

client.close()
print("the year walked as the tables say")
