//! The reminder request: the phone and URL rules, the checked request and the
//! text the customer receives.

use super::{
    MAX_AMOUNT_MINOR, MAX_TEXT_FIELD, MAX_URL, NotifyRequest, SmsError, ValidNotify, invalid,
};
use crate::ids::IdKind;
use crate::time::Timestamp;

/// A Nepali mobile number as 10 digits (`97…`/`98…`), from the forms
/// people write: optional `+977` (or `977`) prefix, spaces and dashes.
pub fn normalize_phone(raw: &str) -> Option<String> {
    let compact: String = raw
        .trim()
        .chars()
        .filter(|c| !matches!(c, ' ' | '-'))
        .collect();
    let rest = compact
        .strip_prefix("+977")
        .or_else(|| {
            (compact.len() == 13)
                .then(|| compact.strip_prefix("977"))
                .flatten()
        })
        .unwrap_or(&compact);
    let ok = rest.len() == 10
        && rest.bytes().all(|b| b.is_ascii_digit())
        && (rest.starts_with("97") || rest.starts_with("98"));
    ok.then(|| rest.to_owned())
}

/// `host[:port]` of an `http(s)` URL, lowercase; `None` for anything
/// else (no scheme, user info, an empty or odd host).
pub(super) fn url_host(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let ok = !authority.is_empty()
        && authority
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'));
    ok.then(|| authority.to_ascii_lowercase())
}

fn text_field(field: &'static str, value: &str) -> Result<String, SmsError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(invalid(field, format!("{field} must not be empty")));
    }
    if v.chars().count() > MAX_TEXT_FIELD {
        return Err(invalid(
            field,
            format!("{field} must be at most {MAX_TEXT_FIELD} characters"),
        ));
    }
    if v.chars().any(char::is_control) {
        return Err(invalid(
            field,
            format!("{field} must not hold control characters"),
        ));
    }
    Ok(v.to_owned())
}

/// Checks each field, naming the one at fault.
pub(super) fn validate(req: NotifyRequest) -> Result<ValidNotify, SmsError> {
    let phone = normalize_phone(&req.customer_phone).ok_or_else(|| {
        invalid(
            "customerPhone",
            "customerPhone must be a Nepali mobile number: 10 digits starting 97 or 98, optionally prefixed +977",
        )
    })?;
    let shop_name = text_field("shopName", &req.shop_name)?;
    let order_name = text_field("orderName", &req.order_name)?;
    if req.amount_minor <= 0 || req.amount_minor > MAX_AMOUNT_MINOR {
        return Err(invalid(
            "amountMinor",
            "amountMinor must be a positive amount in paisa",
        ));
    }
    if req.currency != "NPR" {
        return Err(invalid("currency", "currency must be NPR"));
    }
    let url = req.checkout_url.trim();
    if url.len() > MAX_URL {
        return Err(invalid(
            "checkoutUrl",
            format!("checkoutUrl must be at most {MAX_URL} characters"),
        ));
    }
    let checkout_host = url_host(url).ok_or_else(|| {
        invalid(
            "checkoutUrl",
            "checkoutUrl must be an http(s) URL of the hosted checkout",
        )
    })?;
    Ok(ValidNotify {
        phone,
        shop_name,
        order_name,
        amount_minor: req.amount_minor,
        checkout_url: url.to_owned(),
        checkout_host,
    })
}

/// The reminder's text.
pub(super) fn message_text(v: &ValidNotify) -> String {
    let amount = crate::money::Paisa::new(v.amount_minor)
        .map(|p| p.display_npr())
        .unwrap_or_default();
    format!(
        "{}: your payment of {} for {} is pending. Complete it here: {}",
        v.shop_name, amount, v.order_name, v.checkout_url
    )
}

/// The smallest `cs_` id minted at `at` (ids sort by time).
pub(super) fn first_id_at(kind: IdKind, at: Timestamp) -> String {
    let ms = u64::try_from(at.unix_millis()).unwrap_or(0);
    let ulid = ulid::Ulid::from_parts(ms, 0);
    format!("{}{}", kind.prefix(), ulid.to_string().to_ascii_lowercase())
}
