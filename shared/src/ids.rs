//! Prefixed, time-sortable ids (`pay_01j…`): a ULID (48-bit milliseconds then
//! 80 random bits) in lowercase Crockford base32, so "newest first" is the
//! reverse of the id's byte order.

use std::sync::{LazyLock, Mutex};

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
        }
    }
}

/// Length of the ULID part of an id.
pub const ULID_LEN: usize = 26;

// One generator per process keeps ids minted in the same millisecond in
// creation order (monotonic random part).
static GENERATOR: LazyLock<Mutex<ulid::Generator>> =
    LazyLock::new(|| Mutex::new(ulid::Generator::new()));

/// A fresh id of `kind`, later than every id this process minted before.
pub fn new_id(kind: IdKind) -> String {
    let ulid = match GENERATOR.lock() {
        Ok(mut generator) => generator.generate().unwrap_or_else(|_| ulid::Ulid::new()),
        Err(poisoned) => poisoned
            .into_inner()
            .generate()
            .unwrap_or_else(|_| ulid::Ulid::new()),
    };
    format!("{}{}", kind.prefix(), ulid.to_string().to_ascii_lowercase())
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
