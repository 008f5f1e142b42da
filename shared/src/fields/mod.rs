//! The contract's field rules, each written once.
//!
//! A field a merchant sends and the same field we answer with have one
//! type, and the type carries the field's rule: its JSON type, its length,
//! its format. Request parsing enforces the rule when it deserializes the
//! type (so a 400 names the field, through the body's path); response
//! views serialize the same type; the schema a tool reads for either comes
//! from the type too ([`utoipa::PartialSchema`]). Changing a rule is one
//! edit here, and both sides move together.
//!
//! What a field *means* (trimming, an empty string clearing a pre-fill, a
//! URL's mode-dependent scheme, an amount's provider limits) stays with the
//! resource's rules in [`crate::domain`]; this module says only what shape a
//! value may have.
//!
//! Stored records keep plain strings: a value read back from the store
//! passed its rule when it was written, so a view wraps it with
//! [`Text::stored`] (or [`Email::stored`], [`Phone::stored`]) without
//! checking again, and a later, stricter rule never makes an old record
//! unreadable.

pub mod wire;

use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};

// ------------------------------------------------------------ named rules

/// A person's name (`customer.name`, a link's `customerName`).
pub type PersonName = Text<100>;
/// A checkout's or a link's `description`.
pub type Description = Text<500>;
/// One part of a postal address (`line1`, `city`, ...).
pub type AddressPart = Text<200>;
/// A payment link's `title`.
pub type LinkTitle = Text<100>;
/// What a deactivated link shows (`inactiveMessage`).
pub type InactiveMessage = Text<300>;
/// The merchant's own reference for a link (`referenceId`).
pub type ReferenceId = Text<100>;
/// An invoice's short texts: `buyer.name`, `customerId`,
/// `externalReference`.
pub type InvoiceText = Text<200>;
/// A buyer's phone as printed on an invoice (free text: `(01) 555-1234`).
pub type BuyerPhone = Text<32>;
/// A buyer's postal address on an invoice (may span lines).
pub type BuyerAddress = Text<500, true>;
/// An invoice line's `description` and a void's or credit note's `reason`.
pub type InvoiceLineText = Text<500, true>;
/// An invoice's `note` to the buyer.
pub type InvoiceNote = Text<2_000, true>;
/// A refund's `notes` (kept for the merchant's records).
pub type RefundNotes = Text<500, true>;

// ------------------------------------------------------------------- text

/// A string of at most `MAX` characters with no control characters;
/// `LINES` also lets line breaks (`\n`) through, for text that may span
/// lines on a document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Text<const MAX: usize, const LINES: bool = false>(String);

impl<const MAX: usize, const LINES: bool> Text<MAX, LINES> {
    /// The most characters (Unicode scalar values) the field holds.
    pub const MAX: usize = MAX;

    /// `value` if it keeps the rule; otherwise why not (without the
    /// field's name, which the caller knows).
    pub fn parse(value: String) -> Result<Self, String> {
        if value.chars().count() > MAX {
            return Err(format!("must be at most {MAX} characters"));
        }
        if value
            .chars()
            .any(|c| c.is_control() && !(LINES && c == '\n'))
        {
            return Err(if LINES {
                "must not contain control characters other than line breaks".to_owned()
            } else {
                "must not contain control characters".to_owned()
            });
        }
        Ok(Text(value))
    }
}

impl<const MAX: usize, const LINES: bool> utoipa::PartialSchema for Text<MAX, LINES> {
    fn schema() -> RefOr<Schema> {
        let pattern = if LINES {
            "^[^\\x00-\\x09\\x0B-\\x1F\\x7F-\\x9F]*$"
        } else {
            "^[^\\x00-\\x1F\\x7F-\\x9F]*$"
        };
        ObjectBuilder::new()
            .schema_type(Type::String)
            .max_length(Some(MAX))
            .pattern(Some(pattern))
            .into()
    }
}

/// Named by its rule (`Text100`, `Lines500`): each length is its own schema.
impl<const MAX: usize, const LINES: bool> utoipa::ToSchema for Text<MAX, LINES> {
    fn name() -> std::borrow::Cow<'static, str> {
        let kind = if LINES { "Lines" } else { "Text" };
        std::borrow::Cow::Owned(format!("{kind}{MAX}"))
    }
}

// ------------------------------------------------------------------ email

/// The most characters an email address holds (RFC 5321's path limit).
pub const MAX_EMAIL_LEN: usize = 254;

/// An email address, checked for plausibility (one `@`, a non-empty local
/// part, a dotted domain, no spaces or control characters); not a full
/// RFC 5322 parser. An empty string is not an address: leave the field out
/// when there is none.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Email(String);

impl Email {
    pub fn parse(value: String) -> Result<Self, String> {
        if is_plausible_email(&value) {
            Ok(Email(value))
        } else {
            Err("must be an email address (leave it out when there is none)".to_owned())
        }
    }
}

/// Whether `email` looks like an address (see [`Email`]).
pub fn is_plausible_email(email: &str) -> bool {
    if email.len() > MAX_EMAIL_LEN || email.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return false;
    }
    let Some((local, domain)) = email.split_once('@') else {
        return false;
    };
    !local.is_empty()
        && !domain.contains('@')
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !domain.contains("..")
}

impl utoipa::PartialSchema for Email {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Email)))
            .min_length(Some(3))
            .max_length(Some(MAX_EMAIL_LEN))
            .into()
    }
}

impl utoipa::ToSchema for Email {}

// ------------------------------------------------------------------ phone

/// The most characters a customer's phone number holds.
pub const MAX_PHONE_LEN: usize = 20;

/// A customer's phone number as a checkout takes it: digits, with `+`,
/// `-` and spaces, at least one digit, at most [`MAX_PHONE_LEN`]
/// characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Phone(String);

impl Phone {
    pub fn parse(value: String) -> Result<Self, String> {
        if value.chars().count() > MAX_PHONE_LEN {
            return Err(format!("must be at most {MAX_PHONE_LEN} characters"));
        }
        if !is_phone(&value) {
            return Err("may hold only digits, '+', '-' and spaces".to_owned());
        }
        Ok(Phone(value))
    }
}

/// Whether `phone` has the shape of [`Phone`] (its length aside).
pub fn is_phone(phone: &str) -> bool {
    phone.chars().any(|c| c.is_ascii_digit())
        && phone
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '+' | '-' | ' '))
}

impl utoipa::PartialSchema for Phone {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(MAX_PHONE_LEN))
            .pattern(Some("^[0-9+ -]*[0-9][0-9+ -]*$"))
            .into()
    }
}

impl utoipa::ToSchema for Phone {}

// ------------------------------------------------------------------- urls

/// The most bytes a URL holds.
pub const MAX_URL_LEN: usize = 2048;

/// An absolute `http` or `https` URL: at most [`MAX_URL_LEN`] bytes, no
/// spaces or control characters, no user credentials, a host. Which
/// scheme a field takes in which mode (`https` in live; `http` only to the
/// merchant's own machine in sandbox) is the resource's rule
/// ([`crate::domain::checkout::check_url`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct HttpUrl(String);

impl HttpUrl {
    pub fn parse(value: String) -> Result<Self, String> {
        if value.is_empty() || value.len() > MAX_URL_LEN {
            return Err(format!("must be a URL of 1 to {MAX_URL_LEN} characters"));
        }
        if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("must not contain spaces or control characters".to_owned());
        }
        let lower = value.to_ascii_lowercase();
        let Some(rest) = lower
            .strip_prefix("https://")
            .or_else(|| lower.strip_prefix("http://"))
        else {
            return Err("must be an absolute http(s) URL".to_owned());
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return Err("must not carry user credentials".to_owned());
        }
        let host = host_of(authority);
        let host_ok = !host.is_empty()
            && (host.starts_with('[')
                || host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')));
        if !host_ok {
            return Err("has no valid host".to_owned());
        }
        Ok(HttpUrl(value))
    }

    pub fn is_https(&self) -> bool {
        self.0.to_ascii_lowercase().starts_with("https://")
    }

    /// The host, lowercase (an IPv6 literal keeps its brackets).
    pub fn host(&self) -> String {
        let lower = self.0.to_ascii_lowercase();
        let rest = lower.split_once("://").map(|(_, r)| r).unwrap_or_default();
        host_of(rest.split(['/', '?', '#']).next().unwrap_or_default())
    }
}

fn host_of(authority: &str) -> String {
    if authority.starts_with('[') {
        authority
            .split_once(']')
            .map(|(h, _)| format!("{h}]"))
            .unwrap_or_default()
    } else {
        authority.split(':').next().unwrap_or_default().to_owned()
    }
}

impl utoipa::PartialSchema for HttpUrl {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::Custom("uri".to_owned())))
            .min_length(Some(8))
            .max_length(Some(MAX_URL_LEN))
            .pattern(Some("^[Hh][Tt][Tt][Pp][Ss]?://[^\\s@/?#]+([/?#]\\S*)?$"))
            .into()
    }
}

impl utoipa::ToSchema for HttpUrl {}

// --------------------------------------------------------- nepali mobile

/// A Nepali mobile number as Khalti refunds take it: ten digits, with an
/// optional `+977` or `+977-` in front and spaces around; stored trimmed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct NepaliMobile(String);

impl NepaliMobile {
    pub fn parse(value: String) -> Result<Self, String> {
        let v = value.trim();
        let digits = v.trim_start_matches("+977").trim_start_matches('-');
        if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err("must be a 10-digit Nepali mobile number (e.g. 9800000001)".to_owned());
        }
        Ok(NepaliMobile(v.to_owned()))
    }
}

impl utoipa::PartialSchema for NepaliMobile {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^\\s*(\\+977-?)?[0-9]{10}\\s*$"))
            .examples(["9800000001"])
            .into()
    }
}

impl utoipa::ToSchema for NepaliMobile {}

// --------------------------------------------------------------- or empty

/// A field where an empty string (or only spaces) means "none", as the
/// pre-fills of a payment link take it: `""` clears what is there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrEmpty<T>(pub Option<T>);

impl<T> OrEmpty<T> {
    pub fn into_option(self) -> Option<T> {
        self.0
    }
}

impl<'de, T: Rule> Deserialize<'de> for OrEmpty<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.trim().is_empty() {
            return Ok(OrEmpty(None));
        }
        T::parse(s)
            .map(|v| OrEmpty(Some(v)))
            .map_err(serde::de::Error::custom)
    }
}

/// Generic, so its schema comes through utoipa's `ComposeSchema` (which
/// gives it `PartialSchema`): it does not depend on how the field is used.
impl<T: utoipa::PartialSchema> utoipa::__dev::ComposeSchema for OrEmpty<T> {
    fn compose(_: Vec<RefOr<Schema>>) -> RefOr<Schema> {
        let blank = ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^\\s*$"))
            .description(Some("Empty (or only spaces): none"));
        utoipa::openapi::schema::AnyOfBuilder::new()
            .item(T::schema())
            .item(blank)
            .into()
    }
}

impl<T: utoipa::PartialSchema> utoipa::ToSchema for OrEmpty<T> {}

// ----------------------------------------------------------- shared impls

/// A field kind with a rule: [`Text`], [`Email`], [`Phone`].
pub trait Rule: Sized {
    /// `value` if it keeps the rule; otherwise why not (without the
    /// field's name, which the error's path gives).
    fn parse(value: String) -> Result<Self, String>;
}

macro_rules! string_like {
    ($($ty:ty => [$($gen:tt)*]),* $(,)?) => {$(
        impl<$($gen)*> $ty {
            /// A value read back from the store (it kept the rule when
            /// written): not checked again.
            pub fn stored(value: String) -> Self {
                Self(value)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        /// Parsing enforces the rule ([`Rule::parse`]); the error's path
        /// names the field.
        impl<'de, $($gen)*> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                <$ty>::parse(String::deserialize(d)?).map_err(serde::de::Error::custom)
            }
        }

        impl<$($gen)*> Deref for $ty {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl<$($gen)*> fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl<$($gen)*> Rule for $ty {
            fn parse(value: String) -> Result<Self, String> {
                <$ty>::parse(value)
            }
        }

        impl<$($gen)*> From<$ty> for String {
            fn from(v: $ty) -> String {
                v.0
            }
        }
    )*};
}

string_like! {
    Text<MAX, LINES> => [const MAX: usize, const LINES: bool],
    Email => [],
    Phone => [],
    HttpUrl => [],
    NepaliMobile => [],
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse<T: for<'de> Deserialize<'de>>(v: serde_json::Value) -> Result<T, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn text_is_bounded_in_characters_not_bytes() {
        assert!(parse::<Text<3>>(json!("नेपा")).is_err(), "4 characters");
        assert_eq!(parse::<Text<3>>(json!("नेप")).unwrap().as_str(), "नेप");
        assert_eq!(parse::<Text<3>>(json!("")).unwrap().as_str(), "");
        let err = parse::<Text<3>>(json!("abcd")).unwrap_err();
        assert!(err.contains("at most 3 characters"), "{err}");
    }

    #[test]
    fn text_refuses_control_characters_and_lines_only_where_allowed() {
        assert!(parse::<Text<50>>(json!("a\u{0}b")).is_err());
        assert!(parse::<Text<50>>(json!("a\nb")).is_err());
        assert!(parse::<Text<50>>(json!("a\u{85}b")).is_err(), "C1 control");
        assert!(parse::<Text<50, true>>(json!("a\nb")).is_ok());
        assert!(parse::<Text<50, true>>(json!("a\rb")).is_err());
        assert!(parse::<Text<50, true>>(json!("a\tb")).is_err());
    }

    #[test]
    fn text_refuses_other_json_types() {
        for v in [json!(1), json!(true), json!(["a"]), json!({"a": 1})] {
            assert!(parse::<Text<50>>(v.clone()).is_err(), "{v}");
        }
    }

    #[test]
    fn emails_are_checked_for_plausibility() {
        for good in ["a@b.np", "ramesh@himal.example", "a.b+c@x.com.np"] {
            assert!(parse::<Email>(json!(good)).is_ok(), "{good}");
        }
        for bad in [
            "",
            "ramesh",
            "ramesh@",
            "ramesh@himal",
            "@b.np",
            "r@.x.np",
            "r@x.np.",
            "a@@b.np",
            "a@b@c.np",
            "r@x..np",
            " a@b.np",
            "ram esh@x.np",
        ] {
            assert!(parse::<Email>(json!(bad)).is_err(), "{bad:?}");
        }
        let long = format!("{}@x.np", "a".repeat(MAX_EMAIL_LEN));
        assert!(parse::<Email>(json!(long)).is_err());
    }

    #[test]
    fn phones_hold_digits_and_separators() {
        for good in ["9800000001", "+977 980-0000001", "01 5550000"] {
            assert!(parse::<Phone>(json!(good)).is_ok(), "{good}");
        }
        for bad in [
            "",
            "---",
            "98000x",
            "(01) 555",
            "9".repeat(MAX_PHONE_LEN + 1).as_str(),
        ] {
            assert!(parse::<Phone>(json!(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn or_empty_takes_blank_for_none_and_holds_the_rest_to_the_rule() {
        assert_eq!(parse::<OrEmpty<Email>>(json!("")).unwrap(), OrEmpty(None));
        assert_eq!(parse::<OrEmpty<Email>>(json!("  ")).unwrap(), OrEmpty(None));
        assert!(parse::<OrEmpty<Email>>(json!("nope")).is_err());
        assert!(parse::<OrEmpty<Email>>(json!(3)).is_err());
        let ok = parse::<OrEmpty<Phone>>(json!("9800000001")).unwrap();
        assert_eq!(
            ok.into_option().map(String::from).as_deref(),
            Some("9800000001")
        );
    }

    #[test]
    fn nepali_mobiles_are_ten_digits_stored_trimmed() {
        for good in ["9800000001", " +9779800000001 ", "+977-9800000001"] {
            let m = parse::<NepaliMobile>(json!(good)).unwrap();
            assert_eq!(m.as_str(), good.trim());
        }
        for bad in [
            "",
            "980000000",
            "98000000011",
            "+977 9800000001",
            "98000000o1",
        ] {
            assert!(parse::<NepaliMobile>(json!(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn values_serialize_as_plain_strings() {
        let t: Text<10> = Text::stored("x".into());
        assert_eq!(serde_json::to_value(&t).unwrap(), json!("x"));
        assert_eq!(
            serde_json::to_value(Email::stored("a@b.np".into())).unwrap(),
            json!("a@b.np")
        );
    }

    /// The schema a tool reads states the same rule the parser enforces.
    #[test]
    fn schemas_state_the_rule_the_parser_enforces() {
        use utoipa::PartialSchema;
        let text = serde_json::to_value(Description::schema()).unwrap();
        assert_eq!(text["type"], "string");
        assert_eq!(text["maxLength"], Description::MAX);
        assert_eq!(text["pattern"], "^[^\\x00-\\x1F\\x7F-\\x9F]*$");
        let note = serde_json::to_value(InvoiceNote::schema()).unwrap();
        assert_eq!(note["pattern"], "^[^\\x00-\\x09\\x0B-\\x1F\\x7F-\\x9F]*$");
        let email = serde_json::to_value(Email::schema()).unwrap();
        assert_eq!(email["format"], "email");
        assert_eq!(email["maxLength"], MAX_EMAIL_LEN);
        let phone = serde_json::to_value(Phone::schema()).unwrap();
        assert_eq!(phone["maxLength"], MAX_PHONE_LEN);
    }
}
