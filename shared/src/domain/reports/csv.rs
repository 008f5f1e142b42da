//! The CSV of an export: the columns of each type (`docs/reports.md`),
//! one row per record, text cells a spreadsheet would run as a formula
//! neutralised, amounts plain numbers.

use chrono::{FixedOffset, NaiveDate};

use super::ReportType;
use crate::domain::billing::calendar::{bs_from_ad, nepal_day};
use crate::domain::billing::invoice::BillingInvoice;
use crate::domain::payments::{FeeSource, Payment};
use crate::domain::reconciliation::runs::{Run, StoredFinding};
use crate::domain::record::word;
use crate::domain::refunds::Refund;
use crate::money::Paisa;
use crate::time::Timestamp;

/// The columns of a payments export, in order.
pub const PAYMENT_COLUMNS: [&str; 25] = [
    "id",
    "status",
    "provider",
    "amount_paisa",
    "amount_npr",
    "amount_refunded_paisa",
    "amount_refunded_npr",
    "currency",
    "provider_ref",
    "checkout_session_id",
    "customer_name",
    "customer_email",
    "customer_phone",
    "failure_reason",
    "created_at_utc",
    "created_at_nepal",
    "created_date_ad",
    "created_date_bs",
    "updated_at_utc",
    "double_payment_of",
    "fee_paisa",
    "fee_npr",
    "net_paisa",
    "net_npr",
    "fee_source",
];

/// The columns of a refunds export, in order.
pub const REFUND_COLUMNS: [&str; 21] = [
    "id",
    "payment_id",
    "status",
    "provider",
    "amount_paisa",
    "amount_npr",
    "currency",
    "reason",
    "provider_refund_id",
    "failure_reason",
    "notes",
    "created_at_utc",
    "created_at_nepal",
    "created_date_ad",
    "created_date_bs",
    "updated_at_utc",
    "fee_paisa",
    "fee_npr",
    "net_paisa",
    "net_npr",
    "fee_source",
];

/// The columns of a billing invoices export, in order.
pub const INVOICE_COLUMNS: [&str; 40] = [
    "id",
    "number",
    "customer_id",
    "subscription_id",
    "status",
    "currency",
    "subtotal_paisa",
    "subtotal_npr",
    "discount_paisa",
    "discount_npr",
    "tax_paisa",
    "tax_npr",
    "total_paisa",
    "total_npr",
    "credit_applied_paisa",
    "credit_applied_npr",
    "amount_due_paisa",
    "amount_due_npr",
    "amount_paid_paisa",
    "amount_paid_npr",
    "period_start_ad",
    "period_start_bs",
    "period_end_ad",
    "period_end_bs",
    "due_date_ad",
    "due_date_bs",
    "issued_at_utc",
    "issued_at_nepal",
    "issued_date_ad",
    "issued_date_bs",
    "paid_at_utc",
    "paid_at_nepal",
    "paid_date_ad",
    "paid_date_bs",
    "created_at_utc",
    "created_at_nepal",
    "created_date_ad",
    "created_date_bs",
    "updated_at_utc",
    "voided_at_utc",
];

/// The columns of a reconciliation export, in order: one row per finding
/// of a completed run.
pub const RECONCILIATION_COLUMNS: [&str; 25] = [
    "run_id",
    "provider",
    "source",
    "date_ad",
    "date_bs",
    "finding",
    "classification",
    "kind",
    "line",
    "payment_id",
    "reference",
    "provider_ref",
    "ours_amount_paisa",
    "ours_amount_npr",
    "theirs_amount_paisa",
    "theirs_amount_npr",
    "ours_fee_paisa",
    "ours_fee_npr",
    "theirs_fee_paisa",
    "theirs_fee_npr",
    "at_utc",
    "at_nepal",
    "settled_at_utc",
    "run_completed_at_utc",
    "statement_digest",
];

/// The header row of `kind`.
pub fn columns(kind: ReportType) -> &'static [&'static str] {
    match kind {
        ReportType::Payments => &PAYMENT_COLUMNS,
        ReportType::Refunds => &REFUND_COLUMNS,
        ReportType::BillingInvoices => &INVOICE_COLUMNS,
        ReportType::Reconciliation => &RECONCILIATION_COLUMNS,
    }
}

/// A text cell as written: one a spreadsheet would read as a formula (its
/// first character `=`, `+`, `-`, `@`, a tab or a carriage return) gets a
/// leading `'`, so it shows as the text it is.
pub fn text(value: &str) -> String {
    match value.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{value}"),
        _ => value.to_owned(),
    }
}

fn opt_text(value: Option<&str>) -> String {
    value.map(text).unwrap_or_default()
}

/// An amount in rupees as a plain number: `1500.50` (never grouped, never
/// through a float).
pub fn rupees(amount: Paisa) -> String {
    rupees_of(amount.get())
}

/// [`rupees`] of a signed paisa amount (billing records keep `i64`s).
pub fn rupees_of(p: i64) -> String {
    let sign = if p < 0 { "-" } else { "" };
    let abs = p.unsigned_abs();
    format!("{sign}{}.{:02}", abs / 100, abs % 100)
}

const NEPAL: FixedOffset = match FixedOffset::east_opt(5 * 3600 + 45 * 60) {
    Some(offset) => offset,
    None => panic!("+05:45 is a valid offset"),
};

/// `at` in Nepal time, `2026-11-29T17:30:00.000+05:45`.
pub fn nepal_time(at: Timestamp) -> String {
    at.datetime()
        .with_timezone(&NEPAL)
        .format("%Y-%m-%dT%H:%M:%S%.3f+05:45")
        .to_string()
}

/// A day in AD (`2026-11-29`) and in Bikram Sambat (`2083-08-13`; empty
/// outside the years the table covers).
pub fn ad_bs(day: NaiveDate) -> (String, String) {
    let bs = bs_from_ad(day)
        .map(|bs| format!("{:04}-{:02}-{:02}", bs.year(), bs.month(), bs.day()))
        .unwrap_or_default();
    (day.format("%Y-%m-%d").to_string(), bs)
}

/// The Nepal calendar day of `at`, in AD (`2026-11-29`) and in Bikram
/// Sambat (`2083-08-14`; empty outside the years the table covers).
pub fn days(at: Timestamp) -> (String, String) {
    ad_bs(nepal_day(at))
}

/// `at` as four cells: UTC, Nepal time, its Nepal day in AD and BS (all
/// empty for `None`).
fn moment(at: Option<Timestamp>) -> [String; 4] {
    match at {
        Some(at) => {
            let (ad, bs) = days(at);
            [at.to_rfc3339(), nepal_time(at), ad, bs]
        }
        None => Default::default(),
    }
}

/// An amount as two cells, paisa and rupees (both empty for `None`).
fn amount_cells(amount: Option<Paisa>) -> [String; 2] {
    match amount {
        Some(a) => [a.get().to_string(), rupees(a)],
        None => Default::default(),
    }
}

/// An amount in paisa as stored on billing records (an `i64`), as two
/// cells.
fn paisa_cells(paisa: i64) -> [String; 2] {
    [paisa.to_string(), rupees_of(paisa)]
}

/// The fee cells: fee and net in paisa and rupees, and whose figure the
/// fee is (all empty without a fee).
fn fee_cells(fee: Option<Paisa>, net: Option<Paisa>, source: Option<FeeSource>) -> Vec<String> {
    let mut cells = Vec::with_capacity(5);
    cells.extend(amount_cells(fee));
    cells.extend(amount_cells(net));
    cells.push(source.map(|s| word(&s)).unwrap_or_default());
    cells
}

/// The cells of one payment, in [`PAYMENT_COLUMNS`]' order.
pub fn payment_row(p: &Payment) -> Vec<String> {
    let (ad, bs) = days(p.created_at);
    let mut row = vec![
        p.id.to_string(),
        word(&p.status),
        word(&p.provider),
        p.amount.get().to_string(),
        rupees(p.amount),
        p.amount_refunded.get().to_string(),
        rupees(p.amount_refunded),
        word(&p.currency),
        opt_text(p.provider_ref.as_deref()),
        text(&p.checkout_session_id),
        opt_text(p.customer_name.as_deref()),
        opt_text(p.customer_email.as_deref()),
        opt_text(p.customer_phone.as_deref()),
        opt_text(p.failure_reason.as_deref()),
        p.created_at.to_rfc3339(),
        nepal_time(p.created_at),
        ad,
        bs,
        p.updated_at.to_rfc3339(),
        p.double_payment_of
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default(),
    ];
    let fee = p.fee();
    row.extend(fee_cells(fee.map(|(f, _)| f), p.net(), fee.map(|(_, s)| s)));
    row
}

/// The cells of one refund, in [`REFUND_COLUMNS`]' order.
pub fn refund_row(r: &Refund) -> Vec<String> {
    let (ad, bs) = days(r.created_at);
    let mut row = vec![
        r.id.to_string(),
        r.payment_id.to_string(),
        word(&r.status),
        word(&r.provider),
        r.amount.get().to_string(),
        rupees(r.amount),
        word(&r.currency),
        text(&word(&r.reason)),
        opt_text(r.provider_refund_id.as_deref()),
        opt_text(r.failure_reason.as_deref()),
        opt_text(r.notes.as_deref()),
        r.created_at.to_rfc3339(),
        nepal_time(r.created_at),
        ad,
        bs,
        r.updated_at.to_rfc3339(),
    ];
    let net = r
        .fee
        .map(|f| r.amount.checked_sub(f).unwrap_or(Paisa::ZERO));
    row.extend(fee_cells(r.fee, net, r.fee.and(r.fee_source)));
    row
}

/// The cells of one billing invoice, in [`INVOICE_COLUMNS`]' order.
pub fn invoice_row(i: &BillingInvoice) -> Vec<String> {
    let mut row = vec![
        i.id.to_string(),
        text(&i.number),
        i.customer_id.to_string(),
        i.subscription_id.to_string(),
        word(&i.status),
        word(&i.currency),
    ];
    for paisa in [
        i.subtotal,
        i.discount_total,
        i.tax_total,
        i.total,
        i.credit_applied,
        i.amount_due,
        i.amount_paid,
    ] {
        row.extend(paisa_cells(paisa));
    }
    for day in [i.period_start, i.period_end, i.due_date] {
        let (ad, bs) = ad_bs(day);
        row.push(ad);
        row.push(bs);
    }
    row.extend(moment(Some(i.issued_at)));
    row.extend(moment(i.paid_at));
    row.extend(moment(Some(i.created_at)));
    row.push(i.updated_at.to_rfc3339());
    row.push(i.voided_at.map(|t| t.to_rfc3339()).unwrap_or_default());
    row
}

/// The cells of finding `f` of `run`, in [`RECONCILIATION_COLUMNS`]'
/// order. The references come from the provider's file: text, neutralised.
pub fn finding_row(run: &Run, f: &StoredFinding) -> Vec<String> {
    let x = &f.finding;
    let (ad, bs) = match NaiveDate::parse_from_str(&run.day, "%Y-%m-%d") {
        Ok(day) => ad_bs(day),
        Err(_) => (text(&run.day), String::new()),
    };
    let mut row = vec![
        run.id.to_string(),
        word(&run.provider),
        word(&run.source),
        ad,
        bs,
        f.n.to_string(),
        word(&x.classification),
        word(&x.kind),
        x.line.map(|l| l.to_string()).unwrap_or_default(),
        x.payment_id
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default(),
        opt_text(x.reference.as_deref()),
        opt_text(x.provider_ref.as_deref()),
    ];
    for amount in [x.ours_amount, x.theirs_amount, x.ours_fee, x.theirs_fee] {
        row.extend(amount_cells(amount));
    }
    match x.at {
        Some(at) => row.extend([at.to_rfc3339(), nepal_time(at)]),
        None => row.extend([String::new(), String::new()]),
    }
    row.push(f.settled_at.map(|t| t.to_rfc3339()).unwrap_or_default());
    row.push(run.completed_at.map(|t| t.to_rfc3339()).unwrap_or_default());
    row.push(text(&run.digest));
    row
}

/// CSV lines of `rows` (RFC 4180: a cell with a comma, quote or line
/// break is quoted).
pub fn lines(rows: &[Vec<String>]) -> Result<Vec<u8>, String> {
    let mut out = csv::WriterBuilder::new()
        .terminator(csv::Terminator::CRLF)
        .from_writer(Vec::new());
    for row in rows {
        out.write_record(row).map_err(|e| e.to_string())?;
    }
    out.into_inner().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_are_neutralised_and_plain_text_is_not() {
        for (raw, shown) in [
            ("=HYPERLINK(\"x\")", "'=HYPERLINK(\"x\")"),
            ("+977", "'+977"),
            ("-2+3", "'-2+3"),
            ("@SUM(A1)", "'@SUM(A1)"),
            ("\tcmd", "'\tcmd"),
            ("\rcmd", "'\rcmd"),
            ("Ram Bahadur", "Ram Bahadur"),
            ("a=b", "a=b"),
            ("", ""),
        ] {
            assert_eq!(text(raw), shown, "{raw:?}");
        }
    }

    #[test]
    fn rupees_are_plain_numbers_with_two_places() {
        for (p, r) in [
            (150050, "1500.50"),
            (5, "0.05"),
            (100, "1.00"),
            (0, "0.00"),
            (123456789, "1234567.89"),
        ] {
            assert_eq!(rupees(Paisa::new(p).unwrap()), r);
        }
    }

    #[test]
    fn times_in_nepal_and_days_in_both_calendars() {
        // 18:20 UTC is 00:05 the next day in Nepal.
        let at = Timestamp::parse("2026-11-28T18:20:00Z").unwrap();
        assert_eq!(nepal_time(at), "2026-11-29T00:05:00.000+05:45");
        let (ad, bs) = days(at);
        assert_eq!(ad, "2026-11-29");
        assert_eq!(bs, "2083-08-13");
    }

    #[test]
    fn cells_are_quoted_only_when_they_must_be() {
        let rows = vec![
            vec!["a".to_owned(), "1500.50".to_owned()],
            vec!["x, \"y\"".to_owned(), "line\nbreak".to_owned()],
        ];
        let out = String::from_utf8(lines(&rows).unwrap()).unwrap();
        assert_eq!(out, "a,1500.50\r\n\"x, \"\"y\"\"\",\"line\nbreak\"\r\n");
    }

    #[test]
    fn every_row_has_its_columns() {
        assert_eq!(columns(ReportType::Payments).len(), PAYMENT_COLUMNS.len());
        assert_eq!(columns(ReportType::Refunds).len(), REFUND_COLUMNS.len());
        assert_eq!(
            columns(ReportType::BillingInvoices).len(),
            INVOICE_COLUMNS.len()
        );
        assert_eq!(
            columns(ReportType::Reconciliation).len(),
            RECONCILIATION_COLUMNS.len()
        );
    }
}
