//! Prefixed, time-sortable ids (`pay_01j…`): a ULID (48-bit milliseconds then
//! 80 random bits) in lowercase Crockford base32, so "newest first" is the
//! reverse of the id's byte order.

use std::sync::Mutex;

/// Every kind of id the service mints, with its wire prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKind {
    Merchant,
    Project,
    ApiKey,
    CheckoutSession,
    Payment,
    Refund,
    PaymentLink,
    Invoice,
    WebhookEndpoint,
    WebhookDelivery,
    Event,
    Sms,
    DashboardUser,
    AuditEntry,
    BillingCustomer,
    BillingPlan,
    Subscription,
    BillingInvoice,
    DunningPolicy,
    TestClock,
    Mail,
    Coupon,
    PromotionCode,
    CreditEntry,
    InvoiceItem,
    UsageRecord,
    Report,
    ReconRun,
    StatementUpload,
    BankCredit,
}

impl IdKind {
    pub fn prefix(self) -> &'static str {
        match self {
            IdKind::Merchant => "mer_",
            IdKind::Project => "proj_",
            IdKind::ApiKey => "ak_",
            IdKind::CheckoutSession => "cs_",
            IdKind::Payment => "pay_",
            IdKind::Refund => "ref_",
            IdKind::PaymentLink => "lnk_",
            IdKind::Invoice => "oinv_",
            IdKind::WebhookEndpoint => "we_",
            IdKind::WebhookDelivery => "whd_",
            IdKind::Event => "evt_",
            IdKind::Sms => "sms_",
            IdKind::DashboardUser => "usr_",
            IdKind::AuditEntry => "aud_",
            IdKind::BillingCustomer => "cus_",
            IdKind::BillingPlan => "bp_",
            IdKind::Subscription => "sub_",
            IdKind::BillingInvoice => "inv_",
            IdKind::DunningPolicy => "dpol_",
            IdKind::TestClock => "clock_",
            IdKind::Mail => "mail_",
            IdKind::Coupon => "cpn_",
            IdKind::PromotionCode => "promo_",
            IdKind::CreditEntry => "cbt_",
            IdKind::InvoiceItem => "ii_",
            IdKind::UsageRecord => "ur_",
            IdKind::Report => "rpt_",
            IdKind::ReconRun => "rrun_",
            IdKind::StatementUpload => "stu_",
            IdKind::BankCredit => "bcr_",
        }
    }
}

/// Length of the ULID part of an id.
pub const ULID_LEN: usize = 26;

/// The random part of a ULID: 80 bits.
const RANDOM_BITS: u32 = 80;

/// The last id this process minted: the next one sorts after it.
static LAST: Mutex<ulid::Ulid> = Mutex::new(ulid::Ulid(0));

/// A fresh id of `kind`, later than every id this process minted before.
///
/// Every id carries 80 fresh random bits (from the thread's CSPRNG), so no
/// id predicts another: a checkout id is the bearer of its hosted page.
/// (A monotonic ULID generator would make the next id the last one plus
/// one.) To keep "newest first" a key order within one millisecond, an id
/// whose random part would sort before the last one is dated one
/// millisecond after it instead: the time part runs at most a little
/// ahead of the clock during a burst, never behind.
pub fn new_id(kind: IdKind) -> String {
    let ulid = next_after(&LAST, now_ms(), rand::random::<u128>());
    format!("{}{}", kind.prefix(), ulid.to_string().to_ascii_lowercase())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The id after `last` minted at `ms` with `random` bits (the low 80 are
/// used), recorded as the new last.
fn next_after(last: &Mutex<ulid::Ulid>, ms: u64, random: u128) -> ulid::Ulid {
    let random = random & ((1u128 << RANDOM_BITS) - 1);
    let mut last = match last.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    let mut id = ulid::Ulid::from_parts(ms, random);
    if id <= *last {
        id = ulid::Ulid::from_parts(last.timestamp_ms().saturating_add(1), random);
    }
    *last = id;
    id
}

/// When an id of any kind was minted (unix milliseconds): the time part
/// of the ULID after its prefix; `None` for anything else.
pub fn minted_at_ms(id: &str) -> Option<i64> {
    let rest = &id[id.rfind('_')? + 1..];
    if rest.len() != ULID_LEN {
        return None;
    }
    let ulid = ulid::Ulid::from_string(&rest.to_ascii_uppercase()).ok()?;
    i64::try_from(ulid.timestamp_ms()).ok()
}

/// Whether `id` has the shape of an id of `kind`: its prefix, then 26
/// lowercase Crockford base32 characters. Used to answer 404 early without
/// touching the store for ids that cannot exist.
pub fn is_valid(id: &str, kind: IdKind) -> bool {
    let Some(rest) = id.strip_prefix(kind.prefix()) else {
        return false;
    };
    rest.len() == ULID_LEN
        && rest
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'h' | b'j' | b'k' | b'm' | b'n' | b'p'..=b't' | b'v'..=b'z'))
        // The first character carries the top bits of the timestamp: 0..=7.
        && rest.as_bytes()[0] <= b'7'
}

/// An id of one kind: a string with its kind's prefix, typed so that a
/// payment id cannot be passed where a refund id belongs.
///
/// Two ways in, and no others:
/// - [`TypedId::parse`] at the edge (a path, a body, a query): strict, the
///   shape [`is_valid`] checks, so an id that cannot exist never reaches
///   the domain (the caller answers it as not found, as it always did);
/// - serde, for our own stored records and queue messages: taken as
///   written (tests store short ids such as `proj_1`), never re-validated.
///
/// [`TypedId::mint`] makes a fresh one. Each id derefs to its `&str`, for
/// keys, logs and views.
pub trait TypedId: Sized + Clone + std::fmt::Display + std::ops::Deref<Target = str> {
    /// The kind of record it names.
    const KIND: IdKind;
    /// What a "not found" answer calls it (`No such payment: 'pay_…'`).
    const NOUN: &'static str;

    /// `raw` if it has the shape of an id of this kind; else `None`.
    fn parse(raw: &str) -> Option<Self>;

    /// A fresh id of this kind (see [`new_id`]).
    fn mint() -> Self;

    fn as_str(&self) -> &str;
}

macro_rules! typed_ids {
    ($($(#[$doc:meta])* $name:ident => $kind:ident, $noun:literal;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl TypedId for $name {
            const KIND: IdKind = IdKind::$kind;
            const NOUN: &'static str = $noun;

            fn parse(raw: &str) -> Option<Self> {
                is_valid(raw, IdKind::$kind).then(|| $name(raw.to_owned()))
            }

            fn mint() -> Self {
                $name(new_id(IdKind::$kind))
            }

            fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl $name {
            /// A fresh id (see [`new_id`]).
            pub fn new() -> Self {
                <Self as TypedId>::mint()
            }

            /// `raw` if it has this kind's shape (see [`TypedId::parse`]).
            pub fn parse(raw: &str) -> Option<Self> {
                <Self as TypedId>::parse(raw)
            }

            /// An id our own storage holds in a key or attribute not read
            /// through serde (an index's sort key): taken as written.
            pub fn stored(raw: impl Into<String>) -> Self {
                $name(raw.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl Default for $name {
            /// The empty id: only for records built field by field before
            /// their id is known (never stored as such).
            fn default() -> Self {
                $name(String::new())
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        /// Tests write ids as literals (`"pay_1".into()`); production code
        /// has no way from a bare string but [`TypedId::parse`] and serde.
        #[cfg(any(test, feature = "testkit"))]
        impl From<&str> for $name {
            fn from(raw: &str) -> Self {
                $name(raw.to_owned())
            }
        }
    )*};
}

typed_ids! {
    /// `mer_…`: a merchant (the account that owns projects).
    MerchantId => Merchant, "merchant";
    /// `proj_…`: a project, the tenant every record belongs to.
    ProjectId => Project, "project";
    /// `ak_…`: an API key's public id.
    ApiKeyId => ApiKey, "key";
    /// `cs_…`: a checkout session (also the mobile app's session).
    SessionId => CheckoutSession, "checkout session";
    /// `pay_…`: a payment (one attempt at one provider).
    PaymentId => Payment, "payment";
    /// `ref_…`: a refund.
    RefundId => Refund, "refund";
    /// `lnk_…`: a payment link.
    LinkId => PaymentLink, "payment link";
    /// `oinv_…`: a one-time invoice.
    InvoiceId => Invoice, "invoice";
    /// `we_…`: a webhook endpoint.
    EndpointId => WebhookEndpoint, "webhook endpoint";
    /// `whd_…`: one delivery of an event to an endpoint.
    DeliveryId => WebhookDelivery, "webhook delivery";
    /// `evt_…`: an event.
    EventId => Event, "event";
    /// `sms_…`: an SMS message.
    SmsId => Sms, "sms";
    /// `usr_…`: a dashboard user.
    UserId => DashboardUser, "user";
    /// `aud_…`: an audit log entry.
    AuditId => AuditEntry, "audit entry";
    /// `cus_…`: a billing customer (one-time invoices keep their opaque
    /// `customerId` reference instead).
    CustomerId => BillingCustomer, "customer";
    /// `bp_…`: a billing plan (the prefix the SDK's guide shows).
    PlanId => BillingPlan, "plan";
    /// `sub_…`: a subscription.
    SubscriptionId => Subscription, "subscription";
    /// `inv_…`: a billing (subscription) invoice; one-time ones are `oinv_`.
    BillingInvoiceId => BillingInvoice, "billing invoice";
    /// `dpol_…`: a dunning policy.
    DunningPolicyId => DunningPolicy, "dunning policy";
    /// `clock_…`: a sandbox test clock.
    TestClockId => TestClock, "test clock";
    /// `mail_…`: an email message.
    MailId => Mail, "mail";
    /// `cpn_…`: a coupon.
    CouponId => Coupon, "coupon";
    /// `promo_…`: a promotion code.
    PromotionCodeId => PromotionCode, "promotion code";
    /// `cbt_…`: an entry of a billing customer's credit ledger.
    CreditEntryId => CreditEntry, "credit entry";
    /// `ii_…`: a pending one-off charge of a subscription.
    InvoiceItemId => InvoiceItem, "invoice item";
    /// `ur_…`: one metered usage event of a subscription.
    UsageRecordId => UsageRecord, "usage record";
    /// `rpt_…`: an export (`domain::reports`).
    ReportId => Report, "report";
    /// `rrun_…`: a reconciliation run (`domain::reconciliation`).
    ReconRunId => ReconRun, "reconciliation run";
    /// `stu_…`: an uploaded provider statement file.
    StatementUploadId => StatementUpload, "statement upload";
    /// `bcr_…`: a bank credit the merchant recorded (settlements).
    BankCreditId => BankCredit, "bank credit";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_their_prefix_and_validate() {
        let id = new_id(IdKind::Payment);
        assert!(id.starts_with("pay_"));
        assert_eq!(id.len(), 4 + ULID_LEN);
        assert!(is_valid(&id, IdKind::Payment));
        assert!(!is_valid(&id, IdKind::Refund));
    }

    #[test]
    fn ids_sort_in_creation_order() {
        let ids: Vec<String> = (0..2000).map(|_| new_id(IdKind::Payment)).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted, "ids minted later must sort later");
        sorted.dedup();
        assert_eq!(sorted.len(), 2000, "ids never repeat");
    }

    #[test]
    fn ids_carry_fresh_randomness_not_a_counter() {
        // Minted back to back (mostly within one millisecond): with a
        // monotonic generator the random parts would be consecutive
        // numbers, so the next checkout id would follow from the last.
        let ids: Vec<ulid::Ulid> = (0..2000)
            .map(|_| {
                let id = new_id(IdKind::CheckoutSession);
                ulid::Ulid::from_string(&id[3..].to_ascii_uppercase()).unwrap()
            })
            .collect();
        let mask = (1u128 << RANDOM_BITS) - 1;
        let mut close = 0;
        for pair in ids.windows(2) {
            let (a, b) = (pair[0].0 & mask, pair[1].0 & mask);
            if a.abs_diff(b) < 1 << 40 {
                close += 1;
            }
        }
        // Two fresh 80-bit values are within 2^40 of each other with
        // probability about 2^-39: any such pair means a counter.
        assert_eq!(close, 0, "consecutive ids share their random part");
        // Each of the 80 bits varies across the ids.
        for bit in 0..RANDOM_BITS {
            let ones = ids.iter().filter(|u| (u.0 >> bit) & 1 == 1).count();
            assert!(
                (800..1200).contains(&ones),
                "bit {bit} set in {ones} of 2000"
            );
        }
    }

    #[test]
    fn an_id_never_sorts_before_the_last_one() {
        let last = Mutex::new(ulid::Ulid(0));
        let a = next_after(&last, 1_000, 500);
        // Same millisecond, smaller random part: dated a millisecond on.
        let b = next_after(&last, 1_000, 7);
        assert!(b > a);
        assert_eq!(b.timestamp_ms(), 1_001);
        assert_eq!(b.random(), 7, "the random part stays fresh");
        // A clock that went back never makes an earlier id either.
        let c = next_after(&last, 900, 3);
        assert!(c > b);
        // The clock ahead again: its own time.
        let d = next_after(&last, 5_000, 1);
        assert_eq!(d.timestamp_ms(), 5_000);
        // Only the low 80 bits are used.
        let e = next_after(&last, 6_000, u128::MAX);
        assert_eq!(e.random(), (1u128 << RANDOM_BITS) - 1);
    }

    #[test]
    fn typed_ids_parse_strictly_and_decode_as_written() {
        let minted = PaymentId::new();
        assert!(minted.starts_with("pay_"));
        assert_eq!(PaymentId::parse(&minted), Some(minted.clone()));
        // Another kind's id, or a malformed one, does not parse.
        assert_eq!(PaymentId::parse(&RefundId::new()), None);
        assert_eq!(PaymentId::parse("pay_1"), None);
        // Serde is the stored form: a plain string, read back as written.
        let json = serde_json::to_string(&minted).unwrap();
        assert_eq!(json, format!("\"{minted}\""));
        let back: PaymentId = serde_json::from_str("\"pay_1\"").unwrap();
        assert_eq!(back, "pay_1");
        assert_eq!(PaymentId::NOUN, "payment");
    }

    #[test]
    fn malformed_ids_are_rejected() {
        for bad in [
            "",
            "pay_",
            "pay_123",
            "pay_01J00000000000000000000000",   // uppercase
            "pay_01j0000000000000000000000u",   // 'u' is not Crockford
            "pay_91j00000000000000000000000",   // timestamp overflow
            "pay_01j000000000000000000000000",  // too long
            "pay_01j00000000000000000000/../x", // path tricks
        ] {
            assert!(!is_valid(bad, IdKind::Payment), "{bad:?} accepted");
        }
        assert!(is_valid("pay_01j00000000000000000000000", IdKind::Payment));
    }
}
