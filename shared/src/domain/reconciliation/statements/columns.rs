//! Which column of a portal export means what: ONE table per provider,
//! one row per accepted header spelling, so a changed export is a
//! one-line fix here.
//!
//! The real eSewa and Fonepay merchant-portal layouts are not public
//! (UNCONFIRMED): these spellings are our assumption, documented in
//! `docs/reconciliation.md` ("Statement files"). Headers are compared
//! after [`normalize`]: lower case, every run of characters other than
//! letters and digits as one space (`"Ref. ID"` reads as `"ref id"`).

use crate::kinds::Provider;

/// What a column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Field {
    /// Our reference as sent to the provider.
    Reference,
    /// The provider's own id.
    ProviderRef,
    /// Rupees, as text or a spreadsheet number.
    Amount,
    /// The provider's fee (rupees); optional.
    Fee,
    /// When (Nepal time unless the value carries an offset).
    At,
    /// The provider's status word; optional (absent: every line is a
    /// success, as a portal's "successful transactions" export).
    Status,
    /// Payment or refund; optional (absent: every line is a payment).
    Kind,
}

impl Field {
    pub(super) fn label(self) -> &'static str {
        match self {
            Field::Reference => "reference",
            Field::ProviderRef => "provider reference",
            Field::Amount => "amount",
            Field::Fee => "fee",
            Field::At => "date",
            Field::Status => "status",
            Field::Kind => "type",
        }
    }
}

/// eSewa merchant-portal statement (assumed layout).
const ESEWA: &[(&str, Field)] = &[
    ("transaction uuid", Field::Reference),
    ("product id", Field::Reference),
    ("pid", Field::Reference),
    ("merchant reference", Field::Reference),
    ("reference id", Field::ProviderRef),
    ("ref id", Field::ProviderRef),
    ("refid", Field::ProviderRef),
    ("reference code", Field::ProviderRef),
    ("transaction code", Field::ProviderRef),
    ("amount", Field::Amount),
    ("total amount", Field::Amount),
    ("transaction amount", Field::Amount),
    ("amount npr", Field::Amount),
    ("service charge", Field::Fee),
    ("commission", Field::Fee),
    ("fee", Field::Fee),
    ("transaction date", Field::At),
    ("transaction date time", Field::At),
    ("date", Field::At),
    ("date time", Field::At),
    ("status", Field::Status),
    ("transaction status", Field::Status),
    ("type", Field::Kind),
    ("transaction type", Field::Kind),
];

/// Fonepay merchant-portal statement (assumed layout).
const FONEPAY: &[(&str, Field)] = &[
    ("prn", Field::Reference),
    ("merchant prn", Field::Reference),
    ("product number", Field::Reference),
    ("merchant reference", Field::Reference),
    ("trace id", Field::ProviderRef),
    ("fonepay trace id", Field::ProviderRef),
    ("trace no", Field::ProviderRef),
    ("fonepay trace no", Field::ProviderRef),
    ("amount", Field::Amount),
    ("transaction amount", Field::Amount),
    ("txn amount", Field::Amount),
    ("total amount", Field::Amount),
    ("commission", Field::Fee),
    ("commission amount", Field::Fee),
    ("fee", Field::Fee),
    ("transaction date", Field::At),
    ("txn date", Field::At),
    ("transaction date time", Field::At),
    ("date", Field::At),
    ("date time", Field::At),
    ("status", Field::Status),
    ("payment status", Field::Status),
    ("transaction status", Field::Status),
    ("txn status", Field::Status),
    ("type", Field::Kind),
    ("transaction type", Field::Kind),
    ("txn type", Field::Kind),
];

/// Labels of the preamble line naming the merchant account
/// (`Merchant Code: EPAYTEST`, or the label and the value in two cells).
pub(super) const ACCOUNT_LABELS: &[&str] = &[
    "merchant code",
    "merchant id",
    "merchant account",
    "product code",
];

/// The table of `provider`; `None` for a provider whose statement is not
/// a file (Khalti's is pulled from its API).
pub(super) fn table(provider: Provider) -> Option<&'static [(&'static str, Field)]> {
    match provider {
        Provider::Esewa => Some(ESEWA),
        Provider::Fonepay => Some(FONEPAY),
        Provider::Khalti => None,
    }
}

/// The field a header cell names, if any.
pub(super) fn field_of(table: &[(&str, Field)], header: &str) -> Option<Field> {
    let h = normalize(header);
    table
        .iter()
        .find(|(name, _)| *name == h)
        .map(|(_, field)| *field)
}

/// The spellings accepted for `field`, for error messages.
pub(super) fn spellings(table: &[(&str, Field)], field: Field) -> String {
    table
        .iter()
        .filter(|(_, f)| *f == field)
        .map(|(name, _)| format!("'{name}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Lower case, every run of non-alphanumerics as one space, trimmed.
pub(super) fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut gap = false;
    for c in text.chars() {
        if c.is_alphanumeric() {
            if gap && !out.is_empty() {
                out.push(' ');
            }
            gap = false;
            out.extend(c.to_lowercase());
        } else {
            gap = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_matched_whatever_their_case_and_punctuation() {
        let t = ESEWA;
        assert_eq!(field_of(t, " Ref. ID "), Some(Field::ProviderRef));
        assert_eq!(field_of(t, "TRANSACTION_UUID"), Some(Field::Reference));
        assert_eq!(field_of(t, "Amount (NPR)"), Some(Field::Amount));
        assert_eq!(field_of(t, "Remarks"), None);
        assert_eq!(field_of(FONEPAY, "PRN"), Some(Field::Reference));
    }

    #[test]
    fn every_spelling_is_already_normalized_and_unique() {
        for t in [ESEWA, FONEPAY] {
            for (i, (name, _)) in t.iter().enumerate() {
                assert_eq!(normalize(name), *name);
                assert!(t.iter().skip(i + 1).all(|(other, _)| other != name));
            }
        }
        for label in ACCOUNT_LABELS {
            assert_eq!(normalize(label), *label);
        }
    }
}
