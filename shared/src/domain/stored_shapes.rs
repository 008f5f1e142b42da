//! Nothing stored changes shape: a store written by main at `0c604e9`
//! (`shared/fixtures/store/`: the redb file the local gateway keeps and a
//! DynamoDB scan of the same items, 293 items of every kind the end-to-end
//! suite writes; its README says how it was made) is read back here, every
//! item is named by its key, and every item of a record type decodes into
//! that type and serializes back to the attributes it was read from.
//!
//! A change to a record's fields, its serde attributes, its key or its
//! index entries that would make old items unreadable, or make the next
//! write of an old item differ from it, fails here.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::AttributeValue;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::record::Record;
use crate::store::embedded::EmbeddedStore;
use crate::store::{Index, Item, PK, SK};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/store");

/// What the fixture must hold of each kind, at least.
const KINDS: usize = 36;

/// How an item of one kind is checked.
enum Check {
    /// A typed item: it decodes into its type, which writes back every
    /// attribute of the item (a record: with the key and index entries it
    /// computes itself).
    Record {
        roundtrip: fn(&Item) -> Result<Map<String, Value>, String>,
    },
    /// Written as attributes, not a record type: each item has every
    /// attribute of `always` and none outside `also`.
    Attributes {
        always: &'static [&'static str],
        also: &'static [&'static str],
    },
}

/// The record `T` read from `item` and written again as a whole item: its
/// fields, and the key and index entries it computes.
fn roundtrip<T: Record>(item: &Item) -> Result<Map<String, Value>, String> {
    let record: T = super::record::from_item(item.clone()).map_err(|e| e.to_string())?;
    record.to_item().map_err(|e| e.to_string())
}

/// A record type read from its items and written back whole.
fn record<T: Record>() -> Check {
    Check::Record {
        roundtrip: roundtrip::<T>,
    }
}

/// The typed item `T` read from `item` and serialized again, with the
/// item's key (items only ever updated, whose key their fields do not
/// hold).
fn shape_roundtrip<T: DeserializeOwned + Serialize>(
    item: &Item,
) -> Result<Map<String, Value>, String> {
    let typed: T = super::record::from_item(item.clone()).map_err(|e| e.to_string())?;
    let Value::Object(mut back) = serde_json::to_value(&typed).map_err(|e| e.to_string())? else {
        return Err("a typed item serializes to an object".into());
    };
    for attr in [PK, SK] {
        if let Some(v) = item.get(attr) {
            back.insert(attr.to_owned(), v.clone());
        }
    }
    Ok(back)
}

/// A typed item that is changed by updates only.
fn shape<T: DeserializeOwned + Serialize>() -> Check {
    Check::Record {
        roundtrip: shape_roundtrip::<T>,
    }
}

/// The record `T` read from `item` and written again whole, under the
/// item's key: a record whose key holds what no attribute does (a
/// cookie's hash, an email address), so only its entries are computed.
fn keyed_roundtrip<T: Record>(item: &Item) -> Result<Map<String, Value>, String> {
    let mut back = roundtrip::<T>(item)?;
    for attr in [PK, SK] {
        if let Some(v) = item.get(attr) {
            back.insert(attr.to_owned(), v.clone());
        }
    }
    Ok(back)
}

fn keyed<T: Record>() -> Check {
    Check::Record {
        roundtrip: keyed_roundtrip::<T>,
    }
}

/// A checkout session read and written back ([`roundtrip`]), but for the
/// open-sessions entry of a session already final, which is kept as
/// stored: two sessions of the fixture were moved to `success` by an
/// end-to-end test's raw update (`e2e/checkout.rs`, `e2e/sms.rs`), which
/// left the entry. No production path leaves it (every move to a final
/// status unindexes), and a session is written whole only when created.
fn session_roundtrip(item: &Item) -> Result<Map<String, Value>, String> {
    let mut back = roundtrip::<super::checkout::CheckoutSession>(item)?;
    let status = item.get("status").and_then(Value::as_str);
    if matches!(status, Some("success" | "failed" | "expired")) {
        for attr in [Index::Gsi2.pk_attr(), Index::Gsi2.sk_attr()] {
            if let Some(v) = item.get(attr) {
                back.insert(attr.to_owned(), v.clone());
            }
        }
    }
    Ok(back)
}

/// A payment or refund read and written back ([`roundtrip`]), without
/// the filtered lists' entries when the item had none: an item from
/// before the lists gains them through the migration's update
/// (`listing::migrate`), never by being written whole (done only when
/// created).
fn listed_roundtrip<T: Record>(item: &Item) -> Result<Map<String, Value>, String> {
    let mut back = roundtrip::<T>(item)?;
    if !item.contains_key(Index::Gsi3.pk_attr()) {
        for index in [Index::Gsi3, Index::Gsi4, Index::Gsi5, Index::Gsi6] {
            back.remove(index.pk_attr());
            back.remove(index.sk_attr());
        }
    }
    Ok(back)
}

fn listed<T: Record>() -> Check {
    Check::Record {
        roundtrip: listed_roundtrip::<T>,
    }
}

/// The filtered lists' counter items and their marker (newer than the
/// fixture).
fn list_counts() -> Check {
    record::<super::listing::ListCounts>()
}

const COUNT_TTL: Check = Check::Attributes {
    always: &["count", "ttl"],
    also: &[],
};
const FENCE: Check = Check::Attributes {
    always: &["resource_id", "ttl"],
    also: &[],
};

/// The kind of the item at (`pk`, `sk`), and how to check it.
fn kind_of(pk: &str, sk: &str) -> Option<(&'static str, Check)> {
    use super::{
        account, active, billing, checkout, dashboard, idempotency, invoices, links, mail, outbox,
        payments, refunds, sms, webhooks,
    };
    let head = pk.split('#').next().unwrap_or("");
    let parts = pk.split('#').count();
    Some(match (head, sk) {
        ("ACTIVE", _) => ("active project", record::<active::Active>()),
        ("AKEY", "AKEY") => ("api key", record::<account::ApiKey>()),
        ("CLOCK", "CLOCK") => ("test clock", record::<billing::test_clock::TestClock>()),
        ("RPT", "RPT") => ("report", record::<super::reports::Report>()),
        ("BCR", "BCR") => (
            "bank credit",
            record::<super::reconciliation::settlements::BankCredit>(),
        ),
        ("PROJ", _) if pk.ends_with("#BCREF") => (
            "bank reference claim",
            record::<super::reconciliation::settlements::ReferenceClaim>(),
        ),
        ("RPTQ", "RPTQ") => ("report quota", shape::<super::reports::ReportQuota>()),
        ("BILLDUE", _) => ("billing sweep tenant", record::<billing::due::DueTenant>()),
        ("BINV", "BINV") => (
            "billing invoice",
            record::<billing::invoice::BillingInvoice>(),
        ),
        ("BINV", "SHORT") | ("SUB", "SHORT") => (
            "short link pointer",
            record::<super::short_links::ShortBack>(),
        ),
        ("SHORT", "SHORT") => ("short link", record::<super::short_links::ShortLink>()),
        ("BINV", "DUNNING") => (
            "invoice dunning state",
            record::<billing::dunning::DunningState>(),
        ),
        ("BINV", "NOTICES") => (
            "invoice notice schedule",
            record::<billing::notice_due::NoticeSchedule>(),
        ),
        ("BINV" | "SUB", s) if s.starts_with("NOTICE#SMS#") => (
            "notice sms claim",
            record::<billing::notice_due::NoticeSmsClaim>(),
        ),
        ("SUB", s) if s.starts_with("NOTICE#TRIAL#") => (
            "trial notice schedule",
            record::<billing::notice_due::NoticeSchedule>(),
        ),
        ("AKEY", s) if s.starts_with("SPEND#") => {
            ("api key spend", record::<checkout::SpendCounter>())
        }
        ("CS", "CS") => (
            "checkout session",
            Check::Record {
                roundtrip: session_roundtrip,
            },
        ),
        ("DEMAIL", "DEMAIL") => ("dashboard email claim", keyed::<dashboard::EmailClaim>()),
        ("DEMO", "DEMO") => (
            "demo account",
            Check::Attributes {
                always: &["merchant_id", "project_id", "payments_seeded"],
                also: &[],
            },
        ),
        ("DPOL", "DPOL") => (
            "dunning policy",
            record::<billing::dunning::DunningPolicy>(),
        ),
        ("DDEV", "DDEV") => ("dashboard known device", keyed::<dashboard::KnownDevice>()),
        ("DINVITE", "DINVITE") => ("dashboard invitation", record::<dashboard::Invitation>()),
        ("DFORM", "FENCE") => ("dashboard form fence", FENCE),
        ("DSESS", "DSESS") => ("dashboard session", keyed::<dashboard::DashboardSession>()),
        ("DUSER", "DUSER") => ("dashboard user", record::<dashboard::DashboardUser>()),
        ("DUSER", s) if s.starts_with("DMEM#") => {
            ("dashboard membership", record::<dashboard::Membership>())
        }
        ("DUSER", "DFAIL") => (
            "dashboard failed sign-ins",
            keyed::<dashboard::FailedSignIns>(),
        ),
        ("EVT", "EVT") => ("event", record::<outbox::Event>()),
        ("EVT", s) if s.starts_with("WHD#") => ("webhook delivery", record::<webhooks::Delivery>()),
        ("IDEM", "IDEM") => ("idempotency record", shape::<idempotency::Claim>()),
        ("IDEMFENCE", "FENCE") => ("idempotency fence", FENCE),
        ("LNK", "LNK") => ("payment link", record::<links::PaymentLink>()),
        ("MAIL", "MAIL") => ("mail message", record::<mail::MailMessage>()),
        ("MAILOCC", "OCC") => ("mail occurrence", record::<mail::MailOccurrence>()),
        ("MAILSUP", s) if s.starts_with("A#") => {
            ("mail suppression", record::<mail::MailSuppression>())
        }
        ("MAILVER", s) if s.starts_with("A#") => {
            ("mail verified address", record::<mail::MailVerified>())
        }
        ("MER", "MER") => ("merchant", record::<account::Merchant>()),
        ("MER", _) if pk.ends_with("#AUDIT") => ("audit entry", record::<dashboard::AuditEntry>()),
        ("OINV", "OINV") => ("invoice", record::<invoices::Invoice>()),
        ("OPENREF", _) => ("open refund marker", keyed::<refunds::OpenRefund>()),
        ("OVERPAY", "OVERPAY") => (
            "overpayment refund due",
            record::<billing::invoice::refund_due::RefundDue>(),
        ),
        ("PAY", "PAY") => ("payment", listed::<payments::Payment>()),
        ("PAY", _) if pk.ends_with("#EVT") => {
            ("payment timeline entry", record::<outbox::TimelineEntry>())
        }
        ("SUB", _) if pk.ends_with("#EVT") => (
            "subscription timeline entry",
            record::<outbox::TimelineEntry>(),
        ),
        ("CUS", _) if pk.ends_with("#EVT") => (
            "billing customer timeline entry",
            record::<outbox::TimelineEntry>(),
        ),
        ("PROJ", "PROJ") => ("project", record::<account::Project>()),
        ("PROJ", s) if s.starts_with("CRED#") => (
            "provider credentials",
            record::<super::credentials::StoredCredentials>(),
        ),
        ("PROJ", s) if s.starts_with("FEE#") => {
            ("provider fee rate", record::<super::fees::FeeRate>())
        }
        ("PROJ", s) if s.starts_with("FPCAP#") => {
            ("fonepay month cap", shape::<super::fonepay_cap::MonthCap>())
        }
        ("PROJ", s) if s.starts_with("SLOT#") && pk.ends_with("#STREAMS") => {
            ("event stream slot", record::<super::streams::Lease>())
        }
        ("PROJ", "SEQ#PI") if parts == 3 => (
            "invoice number sequence",
            record::<invoices::InvoiceSequence>(),
        ),
        ("PROJ", "DPOL#DEFAULT") if parts == 3 => (
            "dunning default",
            record::<billing::dunning::DefaultPolicy>(),
        ),
        ("PROJ", "LIST#INIT") => (
            "filtered lists marker",
            record::<super::listing::ListsMarker>(),
        ),
        ("PROJ", s) if s.starts_with("LIST#") => ("filtered lists counters", list_counts()),
        ("PROJ", "ALL#INIT") => (
            "session totals marker",
            record::<super::totals::AllTimeMarker>(),
        ),
        ("PROJ", s) if s.starts_with("ALL#") => {
            ("session totals", record::<super::totals::AllTimeCounts>())
        }
        ("PROJ", s) if s.starts_with("DAY#") => {
            ("daily counters", record::<checkout::stats::DayCounters>())
        }
        ("PROJ", "COUNT") if pk.ends_with("#WECOUNT") => (
            "webhook endpoint count",
            record::<webhooks::EndpointCounter>(),
        ),
        ("PROJ", _) if pk.ends_with("#WE") => ("webhook endpoint", record::<webhooks::Endpoint>()),
        ("PROJ", s) if pk.ends_with("#BCUS") && s.starts_with("cus_") => (
            "billing customer",
            record::<super::billing::customers::Customer>(),
        ),
        ("PROJ", s) if pk.ends_with("#CREDIT") && s.starts_with("cbt_") => (
            "credit entry",
            record::<super::billing::credit::CreditEntry>(),
        ),
        ("PROJ", "BILLING#SETTINGS") if parts == 3 => (
            "billing settings",
            record::<super::billing::tax::TaxSettings>(),
        ),
        ("PROJ", s) if pk.ends_with("#BPLAN") && s.starts_with("bp_") => {
            ("billing plan", record::<super::billing::plans::Plan>())
        }
        ("PROJ", s) if pk.ends_with("#COUPON") && s.starts_with("cpn_") => {
            ("coupon", record::<billing::coupons::Coupon>())
        }
        ("PROJ", s) if pk.ends_with("#PROMO") && s.starts_with("promo_") => (
            "promotion code",
            record::<billing::coupons::PromotionCode>(),
        ),
        ("PROJ", _) if pk.ends_with("#COUPONCODE") || pk.ends_with("#PROMOCODE") => {
            ("coupon code claim", record::<billing::coupons::CodeClaim>())
        }
        ("SUB", "DISCOUNT") => (
            "subscription discount",
            record::<billing::discounts::Discount>(),
        ),
        ("RATE", "RATE") => ("api key rate window", COUNT_TTL),
        ("RRUN", "RRUN") => (
            "reconciliation run",
            record::<super::reconciliation::runs::Run>(),
        ),
        ("RRUN", s) if s.starts_with("F#") => (
            "reconciliation finding",
            record::<super::reconciliation::runs::StoredFinding>(),
        ),
        ("PROJ", _) if pk.ends_with("#RDIG") => (
            "statement digest claim",
            keyed::<super::reconciliation::runs::DigestClaim>(),
        ),
        ("PULL", _) if parts == 2 => (
            "pulled tenant",
            record::<super::credentials::PulledTenant>(),
        ),
        ("PULLDAY", _) => (
            "daily pull claim",
            record::<super::reconciliation::daily::PullClaim>(),
        ),
        ("PULLCUR", "CURSOR") => (
            "daily pull cursor",
            record::<super::reconciliation::daily::PullCursor>(),
        ),
        ("STU", "STU") => (
            "statement upload",
            record::<super::reconciliation::uploads::StatementUpload>(),
        ),
        ("REF", "REF") => ("refund", listed::<refunds::Refund>()),
        ("SUB", "SUB") => (
            "subscription",
            record::<billing::subscription::Subscription>(),
        ),
        ("SUB", s) if s.starts_with("PERIOD#") => (
            "billing period claim",
            record::<billing::invoice::PeriodClaim>(),
        ),
        ("SUB", s) if pk.ends_with("#USAGE") && s.starts_with("R#") => {
            ("usage record", record::<billing::usage::UsageRecord>())
        }
        ("SUB", s) if pk.ends_with("#USAGE") && s.starts_with("K#") => (
            "usage idempotency key",
            record::<billing::usage::UsageKeyClaim>(),
        ),
        ("SUB", "SEAL") if pk.ends_with("#USAGE") => {
            ("usage seal", record::<billing::usage::UsageSeal>())
        }
        ("SUB", s) if pk.ends_with("#ITEMS") && s.starts_with("ii_") => {
            ("invoice item", record::<billing::items::InvoiceItem>())
        }
        ("SUB", "COUNT") if pk.ends_with("#ITEMS") => (
            "pending invoice item count",
            record::<billing::items::PendingCount>(),
        ),
        ("SMS", "SMS") => ("sms reminder", record::<sms::SmsReminder>()),
        ("SMSCNT", _) => ("sms hour count", record::<sms::SmsCount>()),
        ("SMSQUOTA", _) => ("sms month quota", record::<sms::SmsCount>()),
        ("SMSRCPT", "R") => ("sms recipient window", record::<sms::SmsRecipientWindow>()),
        ("THROTTLE", "THROTTLE") => ("public route budget", COUNT_TTL),
        _ => return None,
    })
}

/// `always` missing from `item`, and attributes neither in `always` nor
/// `also`.
fn attribute_problems(item: &Item, always: &[&str], also: impl Fn(&str) -> bool) -> Vec<String> {
    let mut out: Vec<String> = always
        .iter()
        .filter(|a| !item.contains_key(**a))
        .map(|a| format!("{a}: missing"))
        .collect();
    out.extend(
        item.keys()
            .filter(|a| *a != PK && *a != SK && !always.contains(&a.as_str()) && !also(a))
            .map(|a| format!("{a}: not an attribute of this kind")),
    );
    out
}

/// What is wrong with `item` of its kind, if anything.
fn problems(item: &Item, check: &Check) -> Vec<String> {
    match check {
        Check::Record { roundtrip } => {
            let back = match roundtrip(item) {
                Ok(back) => back,
                Err(e) => return vec![format!("does not decode: {e}")],
            };
            let mut out = Vec::new();
            for (attr, value) in item {
                match back.get(attr) {
                    Some(v) if crate::store::cond::values_equal(v, value) => {}
                    Some(v) => out.push(format!("{attr}: stored {value}, written back {v}")),
                    None => out.push(format!("{attr}: stored {value}, not written back")),
                }
            }
            // An update that REMOVEs an optional attribute leaves it absent
            // where a whole-record write stores `null`: both read as `None`.
            for (attr, value) in &back {
                if !item.contains_key(attr) && !value.is_null() {
                    out.push(format!("{attr}: not stored, written back {value}"));
                }
            }
            out
        }
        Check::Attributes { always, also } => {
            attribute_problems(item, always, |a| also.contains(&a))
        }
    }
}

/// Checks every item; answers how many items of each kind there were.
fn check_all(source: &str, items: &[Item]) -> BTreeMap<&'static str, usize> {
    let mut seen = BTreeMap::new();
    let mut failures = Vec::new();
    for item in items {
        let (Some(pk), Some(sk)) = (
            item.get(PK).and_then(Value::as_str),
            item.get(SK).and_then(Value::as_str),
        ) else {
            failures.push(format!("an item without a string key: {item:?}"));
            continue;
        };
        let Some((kind, check)) = kind_of(pk, sk) else {
            failures.push(format!("{pk} / {sk}: no kind has this key"));
            continue;
        };
        *seen.entry(kind).or_insert(0) += 1;
        for problem in problems(item, &check) {
            failures.push(format!("{kind} {pk} / {sk}: {problem}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{source}: {} problems:\n{}",
        failures.len(),
        failures.join("\n")
    );
    seen
}

fn redb_items() -> Vec<Item> {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    };
    // Opened on a copy: opening a redb file may write to it.
    let copy = dir.path().join("dhukuti.redb");
    if let Err(e) = std::fs::copy(format!("{FIXTURE}/dhukuti.redb"), &copy) {
        panic!("copy the fixture: {e}");
    }
    let store = match EmbeddedStore::open(&copy) {
        Ok(s) => s,
        Err(e) => panic!("the fixture opens: {e}"),
    };
    match store.scan_all() {
        Ok(items) => items,
        Err(e) => panic!("the fixture reads: {e}"),
    }
}

/// DynamoDB JSON (`{"S": "x"}`, `{"N": "1"}`, ...) as the SDK's value.
fn attribute(v: &Value) -> AttributeValue {
    let Some((tag, inner)) = v.as_object().and_then(|m| m.iter().next()) else {
        panic!("not a DynamoDB JSON value: {v}")
    };
    match (tag.as_str(), inner) {
        ("S", Value::String(s)) => AttributeValue::S(s.clone()),
        ("N", Value::String(n)) => AttributeValue::N(n.clone()),
        ("BOOL", Value::Bool(b)) => AttributeValue::Bool(*b),
        ("NULL", Value::Bool(b)) => AttributeValue::Null(*b),
        ("L", Value::Array(l)) => AttributeValue::L(l.iter().map(attribute).collect()),
        ("M", Value::Object(m)) => {
            AttributeValue::M(m.iter().map(|(k, v)| (k.clone(), attribute(v))).collect())
        }
        _ => panic!("unexpected DynamoDB JSON value: {v}"),
    }
}

/// The scan, read as the DynamoDB backend reads an item.
fn dynamodb_items() -> Vec<Item> {
    let text = match std::fs::read_to_string(format!("{FIXTURE}/dynamodb.json")) {
        Ok(t) => t,
        Err(e) => panic!("read the fixture: {e}"),
    };
    let dump: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => panic!("the fixture parses: {e}"),
    };
    let Some(items) = dump["Items"].as_array() else {
        panic!("the fixture has Items")
    };
    items
        .iter()
        .map(|raw| {
            let Some(map) = raw.as_object() else {
                panic!("an item is an object: {raw}")
            };
            let attrs: HashMap<String, AttributeValue> =
                map.iter().map(|(k, v)| (k.clone(), attribute(v))).collect();
            match serde_dynamo::from_item::<_, Item>(attrs) {
                Ok(item) => item,
                Err(e) => panic!("an item decodes as the backend decodes it: {e}"),
            }
        })
        .collect()
}

#[test]
fn every_item_main_wrote_to_redb_reads_back_and_writes_back_the_same() {
    let items = redb_items();
    assert_eq!(items.len(), 293, "the fixture's items");
    let seen = check_all("redb", &items);
    assert_eq!(seen.len(), KINDS, "kinds in the fixture: {seen:?}");
}

#[test]
fn every_item_main_wrote_to_dynamodb_reads_back_and_writes_back_the_same() {
    let items = dynamodb_items();
    assert_eq!(items.len(), 293, "the fixture's items");
    let seen = check_all("dynamodb", &items);
    assert_eq!(seen.len(), KINDS, "kinds in the fixture: {seen:?}");
}

#[test]
fn both_fixtures_hold_the_same_items() {
    let mut redb = redb_items();
    let mut dynamodb = dynamodb_items();
    let key = |i: &Item| {
        (
            i.get(PK).map(Value::to_string),
            i.get(SK).map(Value::to_string),
        )
    };
    redb.sort_by_key(key);
    dynamodb.sort_by_key(key);
    assert_eq!(redb.len(), dynamodb.len());
    for (a, b) in redb.iter().zip(&dynamodb) {
        assert!(
            crate::store::cond::values_equal(&Value::Object(a.clone()), &Value::Object(b.clone())),
            "redb {a:?}\ndynamodb {b:?}"
        );
    }
}

/// Issue 39: the billing records (newer than the fixture) have their
/// kinds, and an item written now reads back and writes back the same.
#[test]
fn billing_customers_and_plans_have_their_kinds() {
    use super::billing::{customers, plans};
    use super::{Mode, Tenant};
    use crate::time::{Clock, SystemClock};
    let t = Tenant::new(crate::ids::ProjectId::stored("prj_1"), Mode::Sandbox);
    let now = SystemClock.now();
    let customer = serde_json::from_value(serde_json::json!({"name": "Sita", "email": "s@x.np"}))
        .map_err(|e| e.to_string())
        .and_then(|b| customers::new_customer(&t, b, now).map_err(|e| e.to_string()));
    let plan = serde_json::from_value(
        serde_json::json!({"name": "Monthly", "amount": 100, "intervalUnit": "month"}),
    )
    .map_err(|e| e.to_string())
    .and_then(|b| plans::new_plan(&t, b, now).map_err(|e| e.to_string()));
    let items = match (customer, plan) {
        (Ok(c), Ok(p)) => [c.to_item(), p.to_item()],
        other => panic!("{other:?}"),
    };
    for (item, want) in items.into_iter().zip(["billing customer", "billing plan"]) {
        let item = item.unwrap_or_else(|e| panic!("{e}"));
        let pk = item.get(PK).and_then(Value::as_str).unwrap_or("");
        let sk = item.get(SK).and_then(Value::as_str).unwrap_or("");
        let Some((kind, check)) = kind_of(pk, sk) else {
            panic!("{pk} / {sk}: no kind")
        };
        assert_eq!(kind, want);
        assert!(
            problems(&item, &check).is_empty(),
            "{:?}",
            problems(&item, &check)
        );
    }
}

#[test]
fn a_changed_record_shape_is_caught() {
    // The check is not vacuous: an attribute the record drops, one it
    // renames, and a value it writes back differently each fail.
    let items = redb_items();
    let Some(payment) = items
        .iter()
        .find(|i| i.get(SK).and_then(Value::as_str) == Some("PAY"))
    else {
        panic!("the fixture has a payment")
    };
    let Some((_, check)) = kind_of("PAY#x", "PAY") else {
        panic!("payments have a kind")
    };
    assert!(problems(payment, &check).is_empty());
    let mut extra = payment.clone();
    extra.insert("surprise".into(), Value::from(1));
    assert!(!problems(&extra, &check).is_empty(), "an unknown attribute");
    let mut changed = payment.clone();
    changed.insert("amount".into(), Value::from("100"));
    assert!(!problems(&changed, &check).is_empty(), "a string amount");
    let mut missing = payment.clone();
    missing.remove("created_at");
    assert!(!problems(&missing, &check).is_empty(), "a missing field");
    let mut moved = payment.clone();
    moved.insert("gsi1sk".into(), Value::from("elsewhere"));
    assert!(
        !problems(&moved, &check).is_empty(),
        "an index entry the record does not compute"
    );
}

/// Before issue 37 (14) a session kept one provider field, written by the
/// merchant and again by every attempt. Such an item reads with no
/// attempt provider: its `provider` (the merchant's, or its attempt's,
/// which cannot be told apart) is the one it pays with and binds as it
/// did. A session written since keeps the two apart, and an attempt's
/// provider is written to `attempt_provider` only (an added field, so
/// the old items above write back unchanged).
#[test]
fn a_session_written_with_one_provider_field_reads_as_before() {
    use super::checkout::CheckoutSession;
    let items = redb_items();
    let sessions: Vec<CheckoutSession> = items
        .iter()
        .filter(|i| i.get(SK).and_then(Value::as_str) == Some("CS"))
        .map(|i| match super::record::from_item(i.clone()) {
            Ok(s) => s,
            Err(e) => panic!("a session reads: {e}"),
        })
        .collect();
    assert!(
        sessions.iter().all(|s| s.attempt_provider.is_none()),
        "no item of main holds the new field"
    );
    let attempted: Vec<&CheckoutSession> = sessions
        .iter()
        .filter(|s| s.payment_id.is_some() && s.provider.is_some())
        .collect();
    assert!(!attempted.is_empty(), "the fixture has attempted sessions");
    for s in attempted {
        assert_eq!(s.current_provider(), s.provider, "{}", s.id);
    }
    let Some(item) = items
        .iter()
        .find(|i| i.get(SK).and_then(Value::as_str) == Some("CS"))
    else {
        panic!("the fixture has a session")
    };
    let Some((_, check)) = kind_of("CS#x", "CS") else {
        panic!("sessions have a kind")
    };
    let mut new = item.clone();
    new.insert("attempt_provider".into(), Value::from("esewa"));
    assert!(
        problems(&new, &check).is_empty(),
        "the new field writes back"
    );
}

/// The billing records (issue 39) are newer than the fixture: every item a
/// subscription's life writes (the subscription, its period claim, the
/// invoice with a payment and an overpayment, the number counter, dunning
/// policies, the default pointer, an invoice's dunning state) has its kind
/// here and writes back as it was stored.
#[tokio::test]
async fn every_billing_item_has_a_kind_and_writes_back_the_same() {
    use super::billing::dunning::{self, Attempt, AttemptKind, AttemptOutcome, Channel};
    use super::billing::invoice::{self, PaymentSource};
    use super::billing::subscription::{self, NewSubscription};
    use super::{Mode, Provider, Tenant};
    use crate::testenv::at;
    use std::sync::Arc;

    let store = match EmbeddedStore::in_memory() {
        Ok(s) => Arc::new(s),
        Err(e) => panic!("in-memory store: {e}"),
    };
    let deps = crate::AppState::new(
        store.clone(),
        Arc::new(crate::time::ManualClock::new(at("2026-01-10T06:00:00Z"))),
        crate::Config {
            public_base_url: "http://127.0.0.1:8080".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    );
    let tenant = Tenant::new("proj_shapes", Mode::Sandbox);
    let now = at("2026-01-10T06:00:00Z");
    let mut metadata = Map::new();
    metadata.insert("seat".into(), Value::from("A-1"));
    let input = NewSubscription {
        customer_id: "cus_1".into(),
        plan_id: "bp_1".into(),
        terms: super::billing::terms::monthly(),
        reference_id: Some("order-7".into()),
        metadata,
        start: now,
        trial_ends_at: None,
        billing_anchor_day: Some(5),
        dunning_policy_id: None,
        test_clock_id: None,
    };
    let sub = subscription::new_subscription(&tenant, input, now).unwrap();
    subscription::create(&deps, &sub).await.unwrap();
    let period = sub.current_period().unwrap();
    let inv = invoice::issue_invoice(&deps, &sub, period, now)
        .await
        .unwrap()
        .invoice;
    for payment in ["pay_1", "pay_2"] {
        let source = PaymentSource::Online {
            payment_id: payment.into(),
            provider: Provider::Khalti,
        };
        invoice::pay_invoice(&deps, &tenant, &inv.id, source, inv.amount_due, now)
            .await
            .unwrap();
    }
    let p = dunning::new_policy(
        &tenant,
        "Standard",
        &[1, 3, 7],
        dunning::FinalAction::Cancel,
        now,
    )
    .unwrap();
    dunning::create_policy(&deps, &p, true).await.unwrap();
    let q = dunning::new_policy(&tenant, "Other", &[2], dunning::FinalAction::Pause, now).unwrap();
    dunning::create_policy(&deps, &q, false).await.unwrap();
    dunning::set_default(&deps, &tenant, &q.id).await.unwrap();
    let state = dunning::start_dunning(&deps, &tenant, &inv.id, &p.id)
        .await
        .unwrap();
    let attempt = Attempt {
        at: now,
        kind: AttemptKind::Reminder,
        channel: Channel::Sms,
        outcome: AttemptOutcome::Logged,
        interval: Some(0),
        occurrence: None,
    };
    dunning::append_attempt(&deps, &state, attempt)
        .await
        .unwrap();
    super::billing::test_clock::create(&deps, &tenant, "Year walk", now, now)
        .await
        .unwrap();
    // The notices' records: a trial's schedule and SMS claims of both.
    use super::billing::notice_due::{NoticeSchedule, NoticeSmsClaim};
    let trial = NoticeSchedule::for_trial(&sub, now.plus(chrono::Duration::days(3)), now, now);
    let mut ops = vec![trial.write(None).unwrap()];
    for invoice_id in [Some(inv.id.clone()), None] {
        let claim = NoticeSmsClaim {
            project_id: tenant.project.clone(),
            mode: tenant.mode,
            subscription_id: sub.id.clone(),
            invoice_id,
            occurrence: format!("{}#due_today#2026-01-10", inv.id),
            sms_id: Some(crate::ids::SmsId::new()),
            created_at: now,
        };
        ops.push(claim.put_new().unwrap());
    }
    deps.store.transact(ops).await.unwrap();

    let items = match store.scan_all() {
        Ok(items) => items,
        Err(e) => panic!("scan: {e}"),
    };
    let seen = check_all("billing", &items);
    for kind in [
        "subscription",
        "billing period claim",
        "billing invoice",
        "invoice number sequence",
        "dunning policy",
        "dunning default",
        "invoice dunning state",
        "billing sweep tenant",
        "test clock",
        "invoice notice schedule",
        "trial notice schedule",
        "notice sms claim",
        "subscription timeline entry",
        "billing customer timeline entry",
    ] {
        assert!(seen.contains_key(kind), "{kind} written: {seen:?}");
    }
}

/// Short pay links (issue 39 part 6) are newer than the fixture: the token
/// item and both kinds of back-pointer have their kinds and write back as
/// they were stored.
#[tokio::test]
async fn short_links_have_their_kinds() {
    use super::billing::invoice;
    use super::billing::subscription::{self, NewSubscription};
    use super::short_links::{self, ShortTarget};
    use super::{Mode, Tenant};
    use crate::testenv::at;
    use std::sync::Arc;

    let store = match EmbeddedStore::in_memory() {
        Ok(s) => Arc::new(s),
        Err(e) => panic!("in-memory store: {e}"),
    };
    let now = at("2026-01-10T06:00:00Z");
    let deps = crate::AppState::new(
        store.clone(),
        Arc::new(crate::time::ManualClock::new(now)),
        crate::Config {
            public_base_url: "http://127.0.0.1:8080".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    );
    let tenant = Tenant::new("proj_short", Mode::Sandbox);
    let input = NewSubscription {
        customer_id: "cus_1".into(),
        plan_id: "bp_1".into(),
        terms: super::billing::terms::monthly(),
        reference_id: None,
        metadata: Map::new(),
        start: now,
        trial_ends_at: None,
        billing_anchor_day: None,
        dunning_policy_id: None,
        test_clock_id: None,
    };
    let sub = subscription::new_subscription(&tenant, input, now).unwrap_or_else(|e| panic!("{e}"));
    subscription::create(&deps, &sub)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let Some(period) = sub.current_period() else {
        panic!("a period")
    };
    let inv = invoice::issue_invoice(&deps, &sub, period, now)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .invoice;
    for target in [
        ShortTarget::Invoice(inv.id.clone()),
        ShortTarget::Subscription(sub.id.clone()),
    ] {
        short_links::ensure(&deps, &tenant, &target)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let items = match store.scan_all() {
        Ok(items) => items,
        Err(e) => panic!("scan: {e}"),
    };
    let seen = check_all("short links", &items);
    assert_eq!(seen.get("short link"), Some(&2), "{seen:?}");
    assert_eq!(seen.get("short link pointer"), Some(&2), "{seen:?}");
}
