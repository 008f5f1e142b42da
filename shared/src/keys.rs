//! Every store key and index partition, spelled once.
//!
//! The single table (infra/README.md, "The single table") is a storage
//! format: a key spelled differently finds nothing that was written under
//! the old spelling. So each spelling lives here, and the tests below pin
//! every one of them; the domain computes ids, shards and times and asks
//! this module for the strings.

use crate::kinds::{Mode, Provider};
use crate::store::Key;

/// A record found by its id alone: `<KIND>#<id>` / `<KIND>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Merchant,
    Project,
    CheckoutSession,
    Payment,
    Refund,
    PaymentLink,
    Invoice,
    Event,
    Sms,
}

impl Record {
    pub fn as_str(self) -> &'static str {
        match self {
            Record::Merchant => "MER",
            Record::Project => "PROJ",
            Record::CheckoutSession => "CS",
            Record::Payment => "PAY",
            Record::Refund => "REF",
            Record::PaymentLink => "LNK",
            Record::Invoice => "OINV",
            Record::Event => "EVT",
            Record::Sms => "SMS",
        }
    }
}

/// The key of the record `id` of `kind`.
pub fn record(kind: Record, id: &str) -> Key {
    Key::new(format!("{}#{id}", kind.as_str()), kind.as_str())
}

/// The id of the `kind` record whose key is (`pk`, `sk`), if it is one
/// (the stream's fan-out finds events by their keys).
pub fn record_id<'a>(kind: Record, pk: &'a str, sk: &str) -> Option<&'a str> {
    if sk != kind.as_str() {
        return None;
    }
    pk.strip_prefix(kind.as_str())?
        .strip_prefix('#')
        .filter(|id| !id.is_empty())
}

/// A project's own partition (`PROJ#<id>`): the project item, its
/// provider credentials, its Fonepay month caps.
pub fn project_partition(project_id: &str) -> String {
    format!("PROJ#{project_id}")
}

/// What a project lists or counts per mode: `PROJ#<p>#<mode>#<WHAT>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerMode {
    /// `gsi1`: checkout sessions, newest first.
    Sessions,
    /// `gsi1`: payments.
    Payments,
    /// `gsi1`: refunds.
    Refunds,
    /// `gsi1`: payment links.
    Links,
    /// `gsi1`: invoices.
    Invoices,
    /// `gsi1`: events.
    Events,
    /// `gsi1`: SMS reminders.
    Sms,
    /// The webhook endpoints (their own partition).
    WebhookEndpoints,
    /// The webhook endpoint counter.
    WebhookCount,
    /// The analytics counters.
    Stats,
    /// The event-stream slots (`domain::streams`).
    Streams,
    /// Billing customers (their own partition, by id).
    BillingCustomers,
    /// Billing plans (their own partition, by id).
    BillingPlans,
    /// `gsi2`: subscriptions by when something is next due
    /// (`billing::sweep`).
    SubscriptionsDue,
    /// `gsi1`: sandbox test clocks.
    TestClocks,
    /// `gsi2`: billing notices by when the next is due (`notices`).
    NoticesDue,
    /// Coupons (their own partition, by id).
    Coupons,
    /// Coupon code claims (by the upper-cased code: one coupon per code).
    CouponCodes,
    /// Promotion codes (their own partition, by id).
    PromotionCodes,
    /// Promotion code claims (by the upper-cased code).
    PromotionCodeNames,
    /// `gsi1`: exports (`domain::reports`), newest first.
    Reports,
    /// `gsi1`: bank credits the merchant recorded, by Nepal day
    /// (`reconciliation::settlements`).
    BankCredits,
    /// Bank reference claims (one credit per provider and reference).
    BankCreditRefs,
    /// `gsi1`: reconciliation runs (`domain::reconciliation::runs`),
    /// newest first.
    ReconRuns,
}

impl PerMode {
    fn as_str(self) -> &'static str {
        match self {
            PerMode::Sessions => "CS",
            PerMode::Payments => "PAY",
            PerMode::Refunds => "REF",
            PerMode::Links => "LNK",
            PerMode::Invoices => "OINV",
            PerMode::Events => "EVT",
            PerMode::Sms => "SMS",
            PerMode::WebhookEndpoints => "WE",
            PerMode::WebhookCount => "WECOUNT",
            PerMode::Stats => "STATS",
            PerMode::Streams => "STREAMS",
            PerMode::BillingCustomers => "BCUS",
            PerMode::BillingPlans => "BPLAN",
            PerMode::SubscriptionsDue => "SUBDUE",
            PerMode::TestClocks => "CLOCK",
            PerMode::NoticesDue => "NOTICEDUE",
            PerMode::Coupons => "COUPON",
            PerMode::CouponCodes => "COUPONCODE",
            PerMode::PromotionCodes => "PROMO",
            PerMode::PromotionCodeNames => "PROMOCODE",
            PerMode::Reports => "RPT",
            PerMode::BankCredits => "BCR",
            PerMode::BankCreditRefs => "BCREF",
            PerMode::ReconRuns => "RRUN",
        }
    }
}

/// `PROJ#<project>#<mode>#<WHAT>`.
pub fn per_mode(project_id: &str, mode: Mode, what: PerMode) -> String {
    format!("PROJ#{project_id}#{}#{}", mode.as_str(), what.as_str())
}

/// The webhook endpoint counter of a project and mode.
pub fn webhook_count(project_id: &str, mode: Mode) -> Key {
    Key::new(per_mode(project_id, mode, PerMode::WebhookCount), "COUNT")
}

/// Sort keys in [`PerMode::Stats`]: the all-time session counters
/// (`ALL#<shard>`, and `ALL#INIT` once they cover every session) and the
/// daily counters (`DAY#<yyyy-mm-dd>`, sharded `DAY#<day>#<shard>`).
/// The counters partition of a project in a mode.
pub fn stats_partition(project_id: &str, mode: Mode) -> String {
    per_mode(project_id, mode, PerMode::Stats)
}

/// The marker, written with the project, saying its all-time session
/// counters cover every session it has.
pub fn stats_totals_marker(project_id: &str, mode: Mode) -> Key {
    Key::new(stats_partition(project_id, mode), STATS_TOTALS_MARKER)
}

/// Counter items per day, and all-time session counter items.
pub const STATS_SHARDS: u32 = 8;

/// The counter shard (`0..STATS_SHARDS`) of the record `id`: FNV-1a over
/// its bytes, high half folded into the low (the low bits of FNV-1a alone
/// depend on the low bits of each byte only). Stable across processes and
/// builds: a storage format.
pub fn stats_shard(id: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let folded = (h ^ (h >> 32)) & 0xffff_ffff;
    // `folded` fits in u32 and STATS_SHARDS > 0: the remainder is below it.
    u32::try_from(folded % u64::from(STATS_SHARDS)).unwrap_or(0)
}

pub const STATS_TOTALS_PREFIX: &str = "ALL#";
pub const STATS_TOTALS_MARKER: &str = "ALL#INIT";

pub fn stats_totals(shard: u32) -> String {
    format!("{STATS_TOTALS_PREFIX}{shard:02}")
}

pub fn stats_day(day: &str) -> String {
    format!("DAY#{day}")
}

pub fn stats_day_shard(day: &str, shard: u32) -> String {
    format!("DAY#{day}#{shard:02}")
}

/// After every item of `day` (`~` sorts after the digits), before the next.
pub fn stats_day_end(day: &str) -> String {
    format!("DAY#{day}#~")
}

/// The invoice number sequence of a project and mode.
pub fn invoice_sequence(project_id: &str, mode: Mode) -> Key {
    Key::new(format!("PROJ#{project_id}#{}", mode.as_str()), "SEQ#PI")
}

/// A subscription's discount (`billing::discounts`): beside the
/// subscription, in its partition.
pub fn subscription_discount(subscription_id: &str) -> Key {
    Key::new(format!("SUB#{subscription_id}"), "DISCOUNT")
}

/// The API key record, found by the hash of its secret.
pub fn api_key(hash_hex: &str) -> Key {
    Key::new(format!("AKEY#{hash_hex}"), "AKEY")
}

/// `gsi1`: a project's API keys.
pub fn project_keys(project_id: &str) -> String {
    format!("PROJ#{project_id}#AKEYS")
}

/// A key's spend counter for one calendar month (UTC).
pub fn spend_counter(api_key_id: &str, year: i32, month: u32) -> Key {
    Key::new(
        format!("AKEY#{api_key_id}"),
        format!("SPEND#{year:04}-{month:02}"),
    )
}

/// The sort-key prefix of a project's provider credentials.
pub const CREDENTIALS_PREFIX: &str = "CRED#";

/// A project's sealed credentials at `provider` in `mode`.
pub fn credentials(project_id: &str, mode: Mode, provider: Provider) -> Key {
    Key::new(
        project_partition(project_id),
        format!(
            "{CREDENTIALS_PREFIX}{}#{}",
            mode.as_str(),
            provider.as_str()
        ),
    )
}

/// A project's configured fee rate at `provider` in `mode` (beside its
/// credentials there: `domain::fees`).
pub fn fee_rate(project_id: &str, mode: Mode, provider: Provider) -> Key {
    Key::new(
        project_partition(project_id),
        format!("FEE#{}#{}", mode.as_str(), provider.as_str()),
    )
}

/// A project's sandbox Fonepay volume in `month` (`YYYY-MM`).
pub fn fonepay_cap(project_id: &str, month: &str) -> Key {
    Key::new(project_partition(project_id), format!("FPCAP#{month}"))
}

/// The sweep's list of projects with open work, in shard `shard`.
pub fn active_partition(shard: u32) -> String {
    format!("ACTIVE#{shard}")
}

/// The billing sweep's list of projects with subscriptions, shard
/// `shard` (`BILLDUE#<shard>`).
pub fn billing_due_partition(shard: u32) -> String {
    format!("BILLDUE#{shard}")
}

/// Overpayments whose refund is still to be asked, by due time (`gsi2`;
/// rare: one partition). See `billing::invoice::refund_due`.
pub const OVERPAYMENT_REFUNDS_DUE: &str = "OVERPAYDUE";

/// The refund-due item of an overpayment `payment_id`.
pub fn overpayment_refund_due(payment_id: &str) -> Key {
    Key::new(format!("OVERPAY#{payment_id}"), "OVERPAY")
}

/// A test clock's subscriptions by next due time (`gsi2`): advanced by
/// the clock, never by the sweep.
pub fn test_clock_due_partition(clock_id: &str) -> String {
    format!("CLOCK#{clock_id}#SUBDUE")
}

/// Sandbox test clocks while they advance (`gsi2`, by id): what the
/// scheduler finishes (`domain::clocks`).
pub fn advancing_test_clocks() -> String {
    "CLOCKS#ADVANCING".to_owned()
}

/// A test clock's billing notices by next due time (`gsi2`): sent by
/// the clock's run, never by the notices pass.
pub fn test_clock_notice_partition(clock_id: &str) -> String {
    format!("CLOCK#{clock_id}#NOTICEDUE")
}

/// A sandbox test clock (`billing::test_clock`).
pub fn test_clock(clock_id: &str) -> Key {
    Key::new(format!("CLOCK#{clock_id}"), "CLOCK")
}

/// An export (`domain::reports`).
pub fn report(report_id: &str) -> Key {
    Key::new(format!("RPT#{report_id}"), "RPT")
}

/// A bank credit the merchant recorded (`reconciliation::settlements`).
pub fn bank_credit(credit_id: &str) -> Key {
    Key::new(format!("BCR#{credit_id}"), "BCR")
}

/// One tenant's exports in flight: how many are unfinished and which one
/// runs (`domain::reports::ReportQuota`).
pub fn report_quota(project_id: &str, mode: Mode) -> Key {
    Key::new(format!("RPTQ#{project_id}#{}", mode.as_str()), "RPTQ")
}

/// A reconciliation run (`domain::reconciliation::runs`); its findings
/// live in the same partition ([`recon_finding`]).
pub fn recon_run(run_id: &str) -> Key {
    Key::new(format!("RRUN#{run_id}"), "RRUN")
}

/// The sort-key prefix of a run's findings.
pub const RECON_FINDING_PREFIX: &str = "F#";

/// Finding `n` of run `run_id` (`n` zero-padded: they sort in order).
pub fn recon_finding(run_id: &str, n: u32) -> Key {
    Key::new(format!("RRUN#{run_id}"), format!("F#{n:06}"))
}

/// The `gsi1` partition of run `run_id`'s findings classified
/// `classification`, sorted by their rank in it.
pub fn recon_findings_by(run_id: &str, classification: &str) -> String {
    format!("RRUN#{run_id}#C#{classification}")
}

/// The claim of a statement already run for a tenant, provider and day
/// (by the digest of its bytes): the same file twice is one run.
pub fn recon_digest(
    project_id: &str,
    mode: Mode,
    provider: Provider,
    day: &str,
    digest: &str,
) -> Key {
    Key::new(
        format!("PROJ#{project_id}#{}#RDIG", mode.as_str()),
        format!("{}#{day}#{digest}", provider.as_str()),
    )
}

/// The tenants whose statement at `provider` is pulled daily
/// (`PULL#<provider>`, by `<project>#<mode>`): those with their own
/// credentials there (`domain::credentials::PulledTenant`).
pub fn pulled_partition(provider: Provider) -> String {
    format!("PULL#{}", provider.as_str())
}

/// A tenant's entry in [`pulled_partition`].
pub fn pulled_tenant(provider: Provider, project_id: &str, mode: Mode) -> Key {
    Key::new(
        pulled_partition(provider),
        format!("{project_id}#{}", mode.as_str()),
    )
}

/// The claim of a tenant's daily pull of `provider` for Nepal day `day`
/// (`domain::reconciliation::daily`).
pub fn pull_claim(project_id: &str, mode: Mode, provider: Provider, day: &str) -> Key {
    Key::new(
        format!(
            "PULLDAY#{project_id}#{}#{}",
            mode.as_str(),
            provider.as_str()
        ),
        day.to_owned(),
    )
}

/// Where the daily pull of `provider` has got to in its list of tenants.
pub fn pull_cursor(provider: Provider) -> Key {
    Key::new(format!("PULLCUR#{}", provider.as_str()), "CURSOR")
}

/// An uploaded statement file's record (`domain::reconciliation::runs`).
pub fn statement_upload(upload_id: &str) -> Key {
    Key::new(format!("STU#{upload_id}"), "STU")
}

/// Exports not yet finished (`gsi2`, by id): what the scheduler runs
/// (`domain::reports`).
pub fn unfinished_reports() -> String {
    "RPTS#UNFINISHED".to_owned()
}

/// One project and mode in the billing sweep's list.
pub fn billing_due(shard: u32, project_id: &str, mode: Mode) -> Key {
    Key::new(
        billing_due_partition(shard),
        format!("{project_id}#{}", mode.as_str()),
    )
}

/// One project and mode in the sweep's list.
pub fn active(shard: u32, project_id: &str, mode: Mode) -> Key {
    Key::new(
        active_partition(shard),
        format!("{project_id}#{}", mode.as_str()),
    )
}

/// Sweep partitions (`gsi2`) of open records: per project and mode
/// ([`open_per_project`]: sessions, payments, re-checks), or sharded by id
/// ([`open`]; sessions and payments written before the per-project
/// partitions are still read from their shards).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Open {
    /// Open checkout sessions, by `expires_at`.
    Sessions,
    /// Payments a provider has not answered yet, by next check.
    Payments,
    /// Failed or cancelled payments re-checked for a day.
    Recheck,
    /// Refunds still processing.
    Refunds,
    /// SMS reminders not yet sent.
    Sms,
    /// Webhook deliveries not yet done.
    Deliveries,
    /// Outbox events not yet fanned out.
    Outbox,
}

impl Open {
    pub const fn prefix(self) -> &'static str {
        match self {
            Open::Sessions => "OPEN#CS",
            Open::Payments => "OPEN#PAY",
            Open::Recheck => "RECHECK#PAY",
            Open::Refunds => "OPENREF",
            Open::Sms => "OPEN#SMS",
            Open::Deliveries => "OPEN#WHD",
            Open::Outbox => "OUTBOX",
        }
    }
}

/// The open-records partition `shard` of `what`.
pub fn open(what: Open, shard: u32) -> String {
    format!("{}#{shard}", what.prefix())
}

/// The open records of `what` of a project and mode.
pub fn open_per_project(what: Open, project_id: &str, mode: Mode) -> String {
    format!("{}#{project_id}#{}", what.prefix(), mode.as_str())
}

/// The shard of `id` among `shards` (the sum of its bytes).
pub fn shard_of(id: &str, shards: u32) -> u32 {
    let sum: u32 = id.bytes().map(u32::from).sum();
    sum % shards.max(1)
}

/// Payments held for a person's review (`gsi2`, one partition).
pub const HELD_PAYMENTS: &str = "REVIEW#PAY";

/// The refunds of a payment (`gsi2`).
pub fn payment_refunds(payment_id: &str) -> String {
    format!("PAY#{payment_id}#REF")
}

/// The events about a payment (its own partition, by event id: oldest
/// first), written with each event: the payment's timeline.
pub fn payment_events(payment_id: &str) -> String {
    format!("PAY#{payment_id}#EVT")
}

/// The billing events about a subscription (its own partition, by event
/// id), written with each `subscription.*` and `billing_invoice.*` event:
/// the subscription's timeline.
pub fn subscription_events(subscription_id: &str) -> String {
    format!("SUB#{subscription_id}#EVT")
}

/// The billing events about a billing customer (as
/// [`subscription_events`]): the customer's timeline.
pub fn customer_events(customer_id: &str) -> String {
    format!("CUS#{customer_id}#EVT")
}

/// One delivery of an event to an endpoint.
pub fn delivery(event_id: &str, endpoint_id: &str) -> Key {
    Key::new(format!("EVT#{event_id}"), format!("WHD#{endpoint_id}"))
}

/// An endpoint's delivery log (`gsi1`).
pub fn endpoint_deliveries(endpoint_id: &str) -> String {
    format!("WE#{endpoint_id}#WHD")
}

/// The times of a merchant's reminders to one phone in the last 24 h.
pub fn sms_recipient(merchant_id: &str, mode: Mode, phone: &str) -> Key {
    Key::new(
        format!("SMSRCPT#{merchant_id}#{}#TO#{phone}", mode.as_str()),
        "R",
    )
}

/// A merchant's reminders in one UTC hour (`hour` since the epoch).
pub fn sms_hour(merchant_id: &str, mode: Mode, hour: i64) -> Key {
    Key::new(
        format!("SMSCNT#{merchant_id}#{}", mode.as_str()),
        format!("H#{hour}"),
    )
}

/// A merchant's live SMS quota used in `month` (`YYYY-MM`, UTC).
pub fn sms_quota(merchant_id: &str, month: &str) -> Key {
    Key::new(format!("SMSQUOTA#{merchant_id}"), format!("M#{month}"))
}

/// The idempotency record of a key (`digest`: the hex SHA-256 of it).
pub fn idempotency(project_id: &str, mode: &str, digest: &str) -> Key {
    Key::new(format!("IDEM#{project_id}#{mode}#{digest}"), "IDEM")
}

/// The fence of one request (`print`) under the idempotency record
/// `record`.
pub fn idempotency_fence(record: &Key, print: &str) -> Key {
    Key::new(
        format!("{}#{print}", record.pk.replacen("IDEM#", "IDEMFENCE#", 1)),
        "FENCE",
    )
}

/// A key's request counter in the second starting at `start`.
pub fn rate_window(key_id: &str, start: i64) -> Key {
    Key::new(format!("RATE#{key_id}#{start}"), "RATE")
}

/// Whether `key` is a per-key rate counter ([`rate_window`]).
pub fn is_rate_window(key: &Key) -> bool {
    key.sk == "RATE" && key.pk.starts_with("RATE#")
}

/// A public route's budget `bucket` in the window starting at `start`.
pub fn throttle(bucket: &str, start: i64) -> Key {
    Key::new(format!("THROTTLE#{bucket}#{start}"), "THROTTLE")
}

/// A merchant's projects (`gsi1`), oldest first.
pub fn merchant_projects(merchant_id: &str) -> String {
    format!("MER#{merchant_id}#PROJ")
}

/// A dashboard user.
pub fn dashboard_user(user_id: &str) -> Key {
    Key::new(format!("DUSER#{user_id}"), "DUSER")
}

/// The claim of a dashboard sign-in email (lowercased): one user each.
pub fn dashboard_email(email: &str) -> Key {
    Key::new(format!("DEMAIL#{email}"), "DEMAIL")
}

/// A merchant's dashboard users (`gsi1`).
pub fn merchant_users(merchant_id: &str) -> String {
    format!("MER#{merchant_id}#DUSER")
}

/// A dashboard invitation, by the SHA-256 of its link's token.
pub fn dashboard_invitation(token_hash: &str) -> Key {
    Key::new(format!("DINVITE#{token_hash}"), "DINVITE")
}

/// A merchant's dashboard invitations (`gsi1`).
pub fn merchant_invitations(merchant_id: &str) -> String {
    format!("MER#{merchant_id}#DINVITE")
}

/// A dashboard session, by the SHA-256 of its cookie.
pub fn dashboard_session(token_hash: &str) -> Key {
    Key::new(format!("DSESS#{token_hash}"), "DSESS")
}

/// The fence of one dashboard form (its one-time token): a double submit
/// finds what the first made.
pub fn dashboard_form(merchant_id: &str, nonce: &str) -> Key {
    Key::new(format!("DFORM#{merchant_id}#{nonce}"), "FENCE")
}

/// A merchant's audit log (sort key: time and entry id).
pub fn audit_partition(merchant_id: &str) -> String {
    format!("MER#{merchant_id}#AUDIT")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(key: Key) -> (String, String) {
        (key.pk, key.sk)
    }

    fn kk(pk: &str, sk: &str) -> (String, String) {
        (pk.to_owned(), sk.to_owned())
    }

    /// The spellings are a storage format: changing one orphans every item
    /// written under it. Each is pinned here, as infra/README.md lists it.
    #[test]
    fn every_spelling_is_pinned() {
        let cases = [
            (Record::Merchant, "MER"),
            (Record::Project, "PROJ"),
            (Record::CheckoutSession, "CS"),
            (Record::Payment, "PAY"),
            (Record::Refund, "REF"),
            (Record::PaymentLink, "LNK"),
            (Record::Invoice, "OINV"),
            (Record::Event, "EVT"),
            (Record::Sms, "SMS"),
        ];
        for (kind, s) in cases {
            assert_eq!(k(record(kind, "x_1")), kk(&format!("{s}#x_1"), s));
        }
        assert_eq!(record_id(Record::Event, "EVT#evt_1", "EVT"), Some("evt_1"));
        assert_eq!(record_id(Record::Event, "EVT#evt_1", "WHD#we_1"), None);
        assert_eq!(record_id(Record::Event, "EVT#", "EVT"), None);
        assert_eq!(record_id(Record::Event, "PAY#pay_1", "EVT"), None);
        let sb = Mode::Sandbox;
        for (what, s) in [
            (PerMode::Sessions, "CS"),
            (PerMode::Payments, "PAY"),
            (PerMode::Refunds, "REF"),
            (PerMode::Links, "LNK"),
            (PerMode::Invoices, "OINV"),
            (PerMode::Events, "EVT"),
            (PerMode::Sms, "SMS"),
            (PerMode::WebhookEndpoints, "WE"),
            (PerMode::WebhookCount, "WECOUNT"),
            (PerMode::Stats, "STATS"),
        ] {
            assert_eq!(per_mode("p", sb, what), format!("PROJ#p#sandbox#{s}"));
        }
        assert_eq!(
            per_mode("p", Mode::Live, PerMode::Payments),
            "PROJ#p#live#PAY"
        );
        assert_eq!(k(invoice_sequence("p", sb)), kk("PROJ#p#sandbox", "SEQ#PI"));
        assert_eq!(
            k(webhook_count("p", sb)),
            kk("PROJ#p#sandbox#WECOUNT", "COUNT")
        );
        assert_eq!(stats_totals(3), "ALL#03");
        assert_eq!(STATS_TOTALS_MARKER, "ALL#INIT");
        assert_eq!(stats_day("2026-11-25"), "DAY#2026-11-25");
        assert_eq!(stats_day_shard("2026-11-25", 7), "DAY#2026-11-25#07");
        assert_eq!(stats_day_end("2026-11-25"), "DAY#2026-11-25#~");
        assert_eq!(k(api_key("ab")), kk("AKEY#ab", "AKEY"));
        assert_eq!(project_keys("p"), "PROJ#p#AKEYS");
        assert_eq!(
            k(spend_counter("ak", 2026, 3)),
            kk("AKEY#ak", "SPEND#2026-03")
        );
        assert_eq!(
            k(credentials("p", Mode::Live, Provider::Khalti)),
            kk("PROJ#p", "CRED#live#khalti")
        );
        assert_eq!(
            k(fee_rate("p", Mode::Live, Provider::Fonepay)),
            kk("PROJ#p", "FEE#live#fonepay")
        );
        assert_eq!(
            k(fonepay_cap("p", "2026-11")),
            kk("PROJ#p", "FPCAP#2026-11")
        );
        assert_eq!(k(active(3, "p", sb)), kk("ACTIVE#3", "p#sandbox"));
        assert_eq!(k(billing_due(3, "p", sb)), kk("BILLDUE#3", "p#sandbox"));
        assert_eq!(billing_due_partition(1), "BILLDUE#1");
        assert_eq!(test_clock_due_partition("clock_1"), "CLOCK#clock_1#SUBDUE");
        assert_eq!(k(test_clock("clock_1")), kk("CLOCK#clock_1", "CLOCK"));
        assert_eq!(k(report("rpt_1")), kk("RPT#rpt_1", "RPT"));
        assert_eq!(unfinished_reports(), "RPTS#UNFINISHED");
        assert_eq!(k(report_quota("p", sb)), kk("RPTQ#p#sandbox", "RPTQ"));
        assert_eq!(k(recon_run("rrun_1")), kk("RRUN#rrun_1", "RRUN"));
        assert_eq!(k(recon_finding("rrun_1", 7)), kk("RRUN#rrun_1", "F#000007"));
        assert_eq!(
            k(recon_digest("p", sb, Provider::Esewa, "2026-11-20", "ab")),
            kk("PROJ#p#sandbox#RDIG", "esewa#2026-11-20#ab")
        );
        assert_eq!(k(statement_upload("stu_1")), kk("STU#stu_1", "STU"));
        assert_eq!(per_mode("p", sb, PerMode::ReconRuns), "PROJ#p#sandbox#RRUN");
        assert_eq!(per_mode("p", sb, PerMode::Reports), "PROJ#p#sandbox#RPT");
        assert_eq!(k(bank_credit("bcr_1")), kk("BCR#bcr_1", "BCR"));
        assert_eq!(
            per_mode("p", sb, PerMode::BankCredits),
            "PROJ#p#sandbox#BCR"
        );
        assert_eq!(
            per_mode("p", sb, PerMode::BankCreditRefs),
            "PROJ#p#sandbox#BCREF"
        );
        assert_eq!(
            per_mode("p", sb, PerMode::TestClocks),
            "PROJ#p#sandbox#CLOCK"
        );
        assert_eq!(
            per_mode("p", sb, PerMode::SubscriptionsDue),
            "PROJ#p#sandbox#SUBDUE"
        );
        for (what, s) in [
            (PerMode::Coupons, "COUPON"),
            (PerMode::CouponCodes, "COUPONCODE"),
            (PerMode::PromotionCodes, "PROMO"),
            (PerMode::PromotionCodeNames, "PROMOCODE"),
        ] {
            assert_eq!(per_mode("p", sb, what), format!("PROJ#p#sandbox#{s}"));
        }
        assert_eq!(
            k(subscription_discount("sub_1")),
            kk("SUB#sub_1", "DISCOUNT")
        );
        for (what, s) in [
            (Open::Payments, "OPEN#PAY#2"),
            (Open::Recheck, "RECHECK#PAY#2"),
            (Open::Refunds, "OPENREF#2"),
            (Open::Sms, "OPEN#SMS#2"),
            (Open::Deliveries, "OPEN#WHD#2"),
            (Open::Outbox, "OUTBOX#2"),
            (Open::Sessions, "OPEN#CS#2"),
        ] {
            assert_eq!(open(what, 2), s);
        }
        assert_eq!(
            open_per_project(Open::Sessions, "p", sb),
            "OPEN#CS#p#sandbox"
        );
        assert_eq!(
            open_per_project(Open::Payments, "p", sb),
            "OPEN#PAY#p#sandbox"
        );
        assert_eq!(
            open_per_project(Open::Recheck, "p", sb),
            "RECHECK#PAY#p#sandbox"
        );
        assert_eq!(HELD_PAYMENTS, "REVIEW#PAY");
        assert_eq!(shard_of("ab", 4), (97 + 98) % 4);
        assert_eq!(payment_refunds("pay_1"), "PAY#pay_1#REF");
        assert_eq!(payment_events("pay_1"), "PAY#pay_1#EVT");
        assert_eq!(k(delivery("evt_1", "we_1")), kk("EVT#evt_1", "WHD#we_1"));
        assert_eq!(endpoint_deliveries("we_1"), "WE#we_1#WHD");
        assert_eq!(
            k(sms_recipient("mer", sb, "9800000001")),
            kk("SMSRCPT#mer#sandbox#TO#9800000001", "R")
        );
        assert_eq!(k(sms_hour("mer", sb, 7)), kk("SMSCNT#mer#sandbox", "H#7"));
        assert_eq!(
            k(sms_quota("mer", "2026-11")),
            kk("SMSQUOTA#mer", "M#2026-11")
        );
        let idem = idempotency("p", "sandbox", "d1");
        assert_eq!(k(idem.clone()), kk("IDEM#p#sandbox#d1", "IDEM"));
        assert_eq!(
            k(idempotency_fence(&idem, "f1")),
            kk("IDEMFENCE#p#sandbox#d1#f1", "FENCE")
        );
        assert_eq!(k(rate_window("ak", 100)), kk("RATE#ak#100", "RATE"));
        assert_eq!(merchant_projects("mer"), "MER#mer#PROJ");
        assert_eq!(k(dashboard_user("usr_1")), kk("DUSER#usr_1", "DUSER"));
        assert_eq!(k(dashboard_email("a@b.np")), kk("DEMAIL#a@b.np", "DEMAIL"));
        assert_eq!(merchant_users("mer"), "MER#mer#DUSER");
        assert_eq!(k(dashboard_session("ab")), kk("DSESS#ab", "DSESS"));
        assert_eq!(audit_partition("mer"), "MER#mer#AUDIT");
        assert_eq!(k(dashboard_form("mer", "n1")), kk("DFORM#mer#n1", "FENCE"));
        assert_eq!(
            k(throttle("A#1.2.3.4", 60)),
            kk("THROTTLE#A#1.2.3.4#60", "THROTTLE")
        );
    }
}
