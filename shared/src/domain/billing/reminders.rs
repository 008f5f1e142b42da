//! Billing reminders by SMS (issue 39, part 6): the pure rules the pipeline
//! applies to them, ahead of wiring them into the queue.
//!
//! - [`quiet_until`]: no SMS is sent between 21:00 and 07:00 Nepal time
//!   (UTC+05:45); a message due then waits until 07:00, never dropped;
//! - [`render`]: the hand-written English and Nepali templates, one per
//!   [`ReminderKind`]; a Nepali text stays within two UCS-2 segments
//!   (134 units) when the pay URL is at most [`MAX_PAY_URL_CHARS`] long;
//! - [`segments`]: the segment count the quota charges (GSM-7: 160, or 153
//!   per part; UCS-2: 70, or 67 per part).

use chrono::{Duration, FixedOffset, NaiveTime, Timelike};

use crate::domain::billing::calendar::{BsDate, bs_from_ad, miti_devanagari, miti_latin};
use crate::time::Timestamp;

/// The longest pay URL a reminder carries: a short path
/// (`https://<host>/r/<token>`), so a Nepali reminder fits two segments.
pub const MAX_PAY_URL_CHARS: usize = 40;

/// The merchant name is cut to this many characters (`..` marks it).
pub const MAX_MERCHANT_CHARS: usize = 20;

/// Nepal's fixed offset (no daylight saving time since 1986).
const NEPAL_OFFSET_SECONDS: i32 = 5 * 3600 + 45 * 60;

/// Which reminder of an invoice (or a trial) this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReminderKind {
    BeforeDue,
    DueToday,
    Overdue,
    TrialEnding,
    Dunning,
}

impl ReminderKind {
    pub const ALL: [ReminderKind; 5] = [
        ReminderKind::BeforeDue,
        ReminderKind::DueToday,
        ReminderKind::Overdue,
        ReminderKind::TrialEnding,
        ReminderKind::Dunning,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReminderKind::BeforeDue => "before_due",
            ReminderKind::DueToday => "due_today",
            ReminderKind::Overdue => "overdue",
            ReminderKind::TrialEnding => "trial_ending",
            ReminderKind::Dunning => "dunning",
        }
    }
}

/// The customer's language.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locale {
    En,
    Ne,
}

/// What a reminder says.
#[derive(Clone, Debug)]
pub struct ReminderText<'a> {
    pub kind: ReminderKind,
    pub locale: Locale,
    pub merchant: &'a str,
    pub amount_paisa: i64,
    pub due: chrono::NaiveDate,
    pub pay_url: &'a str,
    pub invoice_number: &'a str,
}

/// When `now` falls in the quiet hours (21:00 inclusive to 07:00 exclusive,
/// Nepal time), the next 07:00 Nepal time; otherwise `None` (send now).
pub fn quiet_until(now: Timestamp) -> Option<Timestamp> {
    let offset = FixedOffset::east_opt(NEPAL_OFFSET_SECONDS)?;
    let local = now.datetime().with_timezone(&offset);
    let hour = local.hour();
    if (7..21).contains(&hour) {
        return None;
    }
    let day = if hour >= 21 {
        local.date_naive().checked_add_signed(Duration::days(1))?
    } else {
        local.date_naive()
    };
    let seven = day
        .and_time(NaiveTime::from_hms_opt(7, 0, 0)?)
        .and_local_timezone(offset)
        .single()?;
    Some(Timestamp::from_datetime(seven.to_utc()))
}

/// `1,234,567.89` (paisa to rupees, Latin digits: readable in both
/// languages and short).
pub fn rupees(amount_paisa: i64) -> String {
    let sign = if amount_paisa < 0 { "-" } else { "" };
    let abs = amount_paisa.unsigned_abs();
    let whole = (abs / 100).to_string();
    let mut grouped = String::new();
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    format!("{sign}{grouped}.{:02}", abs % 100)
}

fn merchant_name(name: &str) -> String {
    let name = name.trim();
    if name.chars().count() <= MAX_MERCHANT_CHARS {
        return name.to_owned();
    }
    // ".." rather than an ellipsis: an ellipsis is not GSM-7 and would make
    // an English text UCS-2 (70 a segment instead of 160).
    let cut: String = name.chars().take(MAX_MERCHANT_CHARS - 2).collect();
    format!("{}..", cut.trim_end())
}

/// The text of a reminder, or `None` when its due date is outside the
/// Bikram Sambat years covered.
pub fn render(text: &ReminderText<'_>) -> Option<String> {
    let bs = bs_from_ad(text.due)?;
    Some(match text.locale {
        Locale::En => render_en(text, bs),
        Locale::Ne => render_ne(text, bs),
    })
}

fn render_en(t: &ReminderText<'_>, bs: BsDate) -> String {
    let m = merchant_name(t.merchant);
    let amt = rupees(t.amount_paisa);
    let due = format!("{} ({})", t.due.format("%Y-%m-%d"), miti_latin(bs));
    let (inv, url) = (t.invoice_number, t.pay_url);
    match t.kind {
        ReminderKind::BeforeDue => {
            format!("{m}: invoice {inv} of Rs {amt} is due {due}. Pay: {url}")
        }
        ReminderKind::DueToday => {
            format!("{m}: invoice {inv} of Rs {amt} is due today {due}. Pay: {url}")
        }
        ReminderKind::Overdue => {
            format!("{m}: invoice {inv} of Rs {amt} was due {due} and is unpaid. Pay: {url}")
        }
        ReminderKind::TrialEnding => {
            format!("{m}: your trial ends {due}; then Rs {amt} is charged. Details: {url}")
        }
        ReminderKind::Dunning => {
            format!("{m}: payment of Rs {amt} for invoice {inv} failed. Please pay: {url}")
        }
    }
}

fn render_ne(t: &ReminderText<'_>, bs: BsDate) -> String {
    let m = merchant_name(t.merchant);
    let amt = rupees(t.amount_paisa);
    let miti = miti_devanagari(bs);
    let url = t.pay_url;
    match t.kind {
        ReminderKind::BeforeDue => format!("{m}: रु. {amt} को बिल {miti} सम्म तिर्नुहोस्। {url}"),
        ReminderKind::DueToday => format!("{m}: रु. {amt} को बिल आज {miti} तिर्नुहोस्। {url}"),
        ReminderKind::Overdue => {
            format!("{m}: रु. {amt} को बिल {miti} मा तिर्नुपर्ने थियो। {url}")
        }
        ReminderKind::TrialEnding => {
            format!("{m}: परीक्षण {miti} मा सकिन्छ, त्यसपछि रु. {amt}। {url}")
        }
        ReminderKind::Dunning => format!("{m}: रु. {amt} भुक्तानी असफल भयो। तिर्नुहोस्: {url}"),
    }
}

/// The GSM 03.38 basic set (and its extension table, which costs two).
const GSM_BASIC: &str = "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà";
const GSM_EXTENDED: &str = "^{}\\[~]|€\x0c";

/// How many SMS segments `text` takes, as the quota charges them: GSM-7
/// when every character is in the GSM set (160 in one, 153 per part),
/// UCS-2 otherwise (70 in one, 67 per part; characters outside the BMP
/// take two units).
pub fn segments(text: &str) -> u32 {
    let gsm = text
        .chars()
        .map(|c| {
            if GSM_BASIC.contains(c) {
                Some(1usize)
            } else if GSM_EXTENDED.contains(c) {
                Some(2)
            } else {
                None
            }
        })
        .sum::<Option<usize>>();
    let (units, single, part) = match gsm {
        Some(units) => (units, 160, 153),
        None => (text.encode_utf16().count(), 70, 67),
    };
    let count = if units <= single {
        1
    } else {
        units.div_ceil(part)
    };
    u32::try_from(count).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        Timestamp::parse(s).unwrap()
    }

    // Nepal 21:00 is 15:15 UTC; Nepal 07:00 is 01:15 UTC.
    #[test]
    fn quiet_hours_edges() {
        assert_eq!(quiet_until(at("2024-07-30T15:14:59Z")), None, "20:59:59");
        assert_eq!(
            quiet_until(at("2024-07-30T15:15:00Z")),
            Some(at("2024-07-31T01:15:00Z")),
            "21:00 waits for the next 07:00"
        );
        assert_eq!(
            quiet_until(at("2024-07-31T01:14:59Z")),
            Some(at("2024-07-31T01:15:00Z")),
            "06:59:59 waits one second"
        );
        assert_eq!(quiet_until(at("2024-07-31T01:15:00Z")), None, "07:00");
        assert_eq!(
            quiet_until(at("2024-07-30T16:15:00Z")),
            Some(at("2024-07-31T01:15:00Z")),
            "22:00 waits until 07:00"
        );
        assert_eq!(
            quiet_until(at("2024-07-30T19:00:00Z")),
            Some(at("2024-07-31T01:15:00Z")),
            "00:45 after midnight waits until the same day's 07:00"
        );
    }

    #[test]
    fn rupees_are_grouped() {
        assert_eq!(rupees(123_400), "1,234.00");
        assert_eq!(rupees(5), "0.05");
        assert_eq!(rupees(99_999_999_999), "999,999,999.99");
    }

    #[test]
    fn segments_count_like_the_provider() {
        assert_eq!(segments(&"a".repeat(160)), 1);
        assert_eq!(segments(&"a".repeat(161)), 2);
        assert_eq!(segments(&"a".repeat(306)), 2);
        assert_eq!(segments(&"क".repeat(70)), 1);
        assert_eq!(segments(&"क".repeat(71)), 2);
        assert_eq!(segments(&"क".repeat(134)), 2);
        assert_eq!(segments(&"क".repeat(135)), 3);
        assert_eq!(segments(&"[".repeat(80)), 1);
        assert_eq!(segments(&"[".repeat(81)), 2);
    }

    fn worst(kind: ReminderKind, locale: Locale) -> String {
        let url = format!("https://pay.dhukuti.np/r/{}", "X".repeat(15));
        assert_eq!(url.chars().count(), MAX_PAY_URL_CHARS);
        let text = ReminderText {
            kind,
            locale,
            merchant: "श्री महालक्ष्मी हार्डवेयर एण्ड इलेक्ट्रिकल्स प्रा. लि.",
            amount_paisa: 99_999_999_999,
            due: chrono::NaiveDate::from_ymd_opt(2024, 9, 17).unwrap(),
            pay_url: &url,
            invoice_number: "INV-2024-000123",
        };
        render(&text).unwrap()
    }

    #[test]
    fn nepali_reminders_fit_two_segments_at_worst() {
        for kind in ReminderKind::ALL {
            let sms = worst(kind, Locale::Ne);
            assert!(
                segments(&sms) <= 2,
                "{kind:?}: {sms} ({} units)",
                sms.encode_utf16().count()
            );
            assert!(sms.contains("https://pay.dhukuti.np/r/"), "{sms}");
            assert!(sms.contains("999,999,999.99"), "{sms}");
            if kind != ReminderKind::Dunning {
                assert!(sms.contains("२०८१"), "{sms}");
            }
        }
    }

    #[test]
    fn english_reminders_fit_the_charged_segments() {
        for kind in ReminderKind::ALL {
            // A Devanagari merchant name makes even English UCS-2.
            let sms = worst(kind, Locale::En);
            assert!(segments(&sms) <= 3, "{kind:?}: {sms}");
        }
        let text = ReminderText {
            kind: ReminderKind::BeforeDue,
            locale: Locale::En,
            merchant: "Himalayan Java Coffee and Bakery Pvt Ltd",
            amount_paisa: 123_400,
            due: chrono::NaiveDate::from_ymd_opt(2024, 7, 30).unwrap(),
            pay_url: "https://pay.dhukuti.np/r/abcdefghijklmno",
            invoice_number: "INV-0042",
        };
        let sms = render(&text).unwrap();
        assert_eq!(
            sms,
            "Himalayan Java Cof..: invoice INV-0042 of Rs 1,234.00 is due 2024-07-30 (2081 Shrawan 15). Pay: https://pay.dhukuti.np/r/abcdefghijklmno"
        );
        assert_eq!(segments(&sms), 1, "{sms}");
    }
}
