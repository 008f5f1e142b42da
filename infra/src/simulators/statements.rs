//! Each simulator's statement of what it processed (reconciliation,
//! issue 41), and a control that puts discrepancies in it.
//!
//! - eSewa and Fonepay: `GET /{esewa|fonepay}/_sim/statement?date=YYYY-MM-DD
//!   &format=csv|xlsx[&merchant=CODE]`, the portal file a merchant would
//!   download (the layout `docs/reconciliation.md` assumes: title rows,
//!   `Merchant Code: …`, then the header row). Successful payments of that
//!   Nepal day (all days without `date`) of that merchant (default: the
//!   first configured one).
//! - Khalti: `GET /khalti/api/v2/merchant-transaction/` (with the secret
//!   key), the documented paginated list: `page`, `page_size` (default
//!   100, at most 500), `start_date`/`end_date` (Nepal days, inclusive).
//!   Completed, refunded and partially refunded payments.
//! - `POST /{provider}/_sim/statement-discrepancies` with
//!   `{"kind": "drop"|"amount"|"fee"|"foreign", "reference", "amount", "fee"}`:
//!   `drop` leaves a processed payment out (`missing_in_provider`),
//!   `amount`/`fee` state another amount or fee (paisa) for it, `foreign`
//!   adds a paid line that is no attempt of ours (`not_ours`; `amount`
//!   required, `reference` optional). `reference` names an attempt as the
//!   control API does. `DELETE` on the same path removes every injection.
//!   A payment "paid at the provider whose return never reached us"
//!   (`missing_in_dhukuti`) is `POST /{provider}/_control/attempts/{ref}/pay`
//!   with the returned callback left unfollowed.

use std::collections::{HashMap, HashSet};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use chrono::{DateTime, FixedOffset, NaiveDate, Offset as _};
use serde::Deserialize;
use serde_json::{Value, json};
use shared::kinds::Provider;

use super::{ALNUM, SimState, control_error, esewa, fee_of, fonepay, khalti, random_string};

/// The merchant `idx` the simulated Khalti list names.
const KHALTI_MERCHANT: &str = "SimKhaltiMerchant";

/// Injected discrepancies of one provider, keyed by the attempt's key.
#[derive(Default)]
pub(crate) struct Edits {
    dropped: HashSet<String>,
    amounts: HashMap<String, i64>,
    fees: HashMap<String, i64>,
    foreign: Vec<SimLine>,
}

/// Every provider's injections.
#[derive(Default)]
pub(crate) struct StatementBook {
    esewa: Edits,
    khalti: Edits,
    fonepay: Edits,
}

impl StatementBook {
    fn of(&mut self, provider: Provider) -> &mut Edits {
        match provider {
            Provider::Esewa => &mut self.esewa,
            Provider::Khalti => &mut self.khalti,
            Provider::Fonepay => &mut self.fonepay,
        }
    }
}

/// One statement line as the simulator states it.
#[derive(Clone, Debug)]
struct SimLine {
    key: String,
    reference: String,
    provider_ref: String,
    /// The provider's status word.
    status: String,
    refunded: bool,
    amount: i64,
    fee: Option<i64>,
    at: DateTime<FixedOffset>,
    merchant: String,
}

fn nepal() -> FixedOffset {
    FixedOffset::east_opt(5 * 3600 + 45 * 60).unwrap_or_else(|| chrono::Utc.fix())
}

fn when(rfc3339: &str) -> DateTime<FixedOffset> {
    DateTime::parse_from_rfc3339(rfc3339)
        .map(|d| d.with_timezone(&nepal()))
        .unwrap_or_else(|_| super::nepal_now())
}

/// The provider's processed payments, as its statement would list them,
/// injections applied.
fn lines(st: &SimState, provider: Provider) -> Vec<SimLine> {
    let mut out = Vec::new();
    match provider {
        Provider::Esewa => {
            let book = st.esewa();
            for key in &book.order {
                let Some(a) = book.attempts.get(key) else {
                    continue;
                };
                let paid = [esewa::COMPLETE, esewa::FULL_REFUND, esewa::PARTIAL_REFUND]
                    .contains(&a.status.as_str());
                let Some(ref_id) = a.ref_id.clone().filter(|_| paid) else {
                    continue;
                };
                out.push(SimLine {
                    key: key.clone(),
                    reference: a.transaction_uuid.clone(),
                    provider_ref: ref_id,
                    status: "COMPLETE".into(),
                    refunded: a.refunded_paisa > 0,
                    amount: a.total_paisa,
                    fee: None,
                    at: when(&a.created_at),
                    merchant: a.product_code.clone(),
                });
            }
        }
        Provider::Khalti => {
            let book = st.khalti();
            for key in &book.order {
                let Some(a) = book.attempts.get(key) else {
                    continue;
                };
                let paid = [
                    khalti::COMPLETED,
                    khalti::REFUNDED,
                    khalti::PARTIALLY_REFUNDED,
                ]
                .contains(&a.status.as_str());
                let Some(txn) = a.transaction_id.clone().filter(|_| paid) else {
                    continue;
                };
                out.push(SimLine {
                    key: key.clone(),
                    reference: a.purchase_order_id.clone(),
                    provider_ref: txn,
                    status: a.status.clone(),
                    refunded: a.refunded_paisa > 0,
                    amount: a.amount,
                    fee: Some(fee_of(a.amount, st.config().khalti_fee_bps)),
                    at: when(&a.created_at),
                    merchant: KHALTI_MERCHANT.into(),
                });
            }
        }
        Provider::Fonepay => {
            let book = st.fonepay();
            for key in &book.order {
                let Some(a) = book.attempts.get(key) else {
                    continue;
                };
                if a.status != fonepay::SUCCESS {
                    continue;
                }
                out.push(SimLine {
                    key: key.clone(),
                    reference: a.prn.clone(),
                    provider_ref: a.trace_id.to_string(),
                    status: "Success".into(),
                    refunded: false,
                    amount: a.amount_paisa,
                    fee: (a.kind == "qr")
                        .then(|| fee_of(a.amount_paisa, st.config().fonepay_commission_bps)),
                    at: when(&a.created_at),
                    merchant: a.merchant_code.clone(),
                });
            }
        }
    }
    let mut book = st.statements();
    let edits = book.of(provider);
    out.retain(|l| !edits.dropped.contains(&l.key));
    for l in &mut out {
        if let Some(a) = edits.amounts.get(&l.key) {
            l.amount = *a;
        }
        if let Some(f) = edits.fees.get(&l.key) {
            l.fee = Some(*f);
        }
    }
    out.extend(edits.foreign.iter().cloned());
    out
}

fn rupees(paisa: i64) -> String {
    format!("{}.{:02}", paisa / 100, paisa % 100)
}

#[derive(Deserialize)]
struct FileQuery {
    date: Option<String>,
    format: Option<String>,
    merchant: Option<String>,
}

fn day(text: Option<&str>) -> Result<Option<NaiveDate>, Response> {
    match text.map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(t) => NaiveDate::parse_from_str(t, "%Y-%m-%d")
            .map(Some)
            .map_err(|_| control_error(StatusCode::BAD_REQUEST, "date must be YYYY-MM-DD")),
    }
}

async fn esewa_file(State(st): State<SimState>, Query(q): Query<FileQuery>) -> Response {
    let merchant = q.merchant.clone().unwrap_or_else(|| {
        st.config()
            .esewa_merchants
            .first()
            .map(|m| m.product_code.clone())
            .unwrap_or_default()
    });
    file(&st, Provider::Esewa, &q, &merchant)
}

async fn fonepay_file(State(st): State<SimState>, Query(q): Query<FileQuery>) -> Response {
    let merchant = q.merchant.clone().unwrap_or_else(|| {
        st.config()
            .fonepay_merchants
            .first()
            .map(|m| m.merchant_code.clone())
            .unwrap_or_default()
    });
    file(&st, Provider::Fonepay, &q, &merchant)
}

/// A statement file: title, merchant and period rows, the header, lines.
fn file(st: &SimState, provider: Provider, q: &FileQuery, merchant: &str) -> Response {
    let date = match day(q.date.as_deref()) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let lines: Vec<SimLine> = lines(st, provider)
        .into_iter()
        .filter(|l| l.merchant == merchant)
        .filter(|l| date.is_none_or(|d| l.at.date_naive() == d))
        .collect();
    let (title, columns): (&str, [&str; 8]) = match provider {
        Provider::Fonepay => (
            "Fonepay Merchant Transaction Report",
            [
                "S.N.",
                "Transaction Date",
                "PRN",
                "Fonepay Trace Id",
                "Amount",
                "Commission",
                "Status",
                "Type",
            ],
        ),
        _ => (
            "eSewa Merchant Statement",
            [
                "S.N.",
                "Transaction Date",
                "Transaction UUID",
                "Reference Id",
                "Amount",
                "Service Charge",
                "Status",
                "Type",
            ],
        ),
    };
    let period = date.map_or_else(|| "All dates".to_owned(), |d| format!("Date: {d}"));
    let rows: Vec<[String; 8]> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            [
                (i + 1).to_string(),
                l.at.format("%Y-%m-%d %H:%M:%S").to_string(),
                l.reference.clone(),
                l.provider_ref.clone(),
                rupees(l.amount),
                l.fee.map(rupees).unwrap_or_default(),
                "Success".to_owned(),
                "Payment".to_owned(),
            ]
        })
        .collect();
    let name = format!(
        "{}-statement-{}",
        provider.as_str(),
        date.map_or_else(|| "all".to_owned(), |d| d.to_string())
    );
    if q.format.as_deref() == Some("xlsx") {
        match xlsx(title, merchant, &period, &columns, &rows) {
            Ok(bytes) => (
                [
                    (
                        header::CONTENT_TYPE,
                        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
                            .to_owned(),
                    ),
                    (
                        header::CONTENT_DISPOSITION,
                        format!("attachment; filename=\"{name}.xlsx\""),
                    ),
                ],
                bytes,
            )
                .into_response(),
            Err(e) => control_error(StatusCode::INTERNAL_SERVER_ERROR, &e),
        }
    } else {
        let mut csv = format!(
            "{title}\nMerchant Code: {merchant}\n{period}\n\n{}\n",
            columns.join(",")
        );
        for r in &rows {
            csv.push_str(&r.join(","));
            csv.push('\n');
        }
        (
            [
                (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
                (
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{name}.csv\""),
                ),
            ],
            csv,
        )
            .into_response()
    }
}

fn xlsx(
    title: &str,
    merchant: &str,
    period: &str,
    header: &[&str; 8],
    rows: &[[String; 8]],
) -> Result<Vec<u8>, String> {
    use rust_xlsxwriter::Workbook;
    let e = |e: rust_xlsxwriter::XlsxError| e.to_string();
    let mut book = Workbook::new();
    let sheet = book.add_worksheet();
    sheet.write_string(0, 0, title).map_err(e)?;
    sheet.write_string(1, 0, "Merchant Code").map_err(e)?;
    sheet.write_string(1, 1, merchant).map_err(e)?;
    sheet.write_string(2, 0, period).map_err(e)?;
    for (c, h) in (0u16..).zip(header.iter()) {
        sheet.write_string(4, c, *h).map_err(e)?;
    }
    for (r, row) in (5u32..).zip(rows.iter()) {
        for (c, v) in (0u16..).zip(row.iter()) {
            // Amounts as numbers, as a spreadsheet export has them.
            match (c, v.parse::<f64>()) {
                (0 | 4 | 5, Ok(n)) => sheet.write_number(r, c, n).map(|_| ()),
                _ => sheet.write_string(r, c, v).map(|_| ()),
            }
            .map_err(e)?;
        }
    }
    book.save_to_buffer().map_err(e)
}

#[derive(Deserialize)]
struct ListQuery {
    page: Option<u32>,
    page_size: Option<u32>,
    start_date: Option<String>,
    end_date: Option<String>,
}

/// `GET /khalti/api/v2/merchant-transaction/`: the documented page shape.
async fn khalti_list(
    State(st): State<SimState>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    if let Err(r) = khalti::authenticate(&st, &headers) {
        return r;
    }
    let (from, to) = match (day(q.start_date.as_deref()), day(q.end_date.as_deref())) {
        (Ok(f), Ok(t)) => (f, t),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    let size = q.page_size.unwrap_or(100).clamp(1, 500) as usize;
    let page = q.page.unwrap_or(1).max(1) as usize;
    let all: Vec<SimLine> = lines(&st, Provider::Khalti)
        .into_iter()
        .filter(|l| from.is_none_or(|f| l.at.date_naive() >= f))
        .filter(|l| to.is_none_or(|t| l.at.date_naive() <= t))
        .collect();
    let total = all.len();
    let pages = total.div_ceil(size).max(1);
    if page > pages {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"detail": "Invalid page."})),
        )
            .into_response();
    }
    let start = (page - 1) * size;
    let records: Vec<Value> = all
        .iter()
        .skip(start)
        .take(size)
        .map(|l| {
            json!({
                "idx": l.provider_ref,
                "type": {"idx": "e476BL6jt9kgagEmsakyTL", "name": "Wallet payment"},
                "state": {"idx": "DhvMj9hdRufLqkP8ZY4d8g", "name": l.status, "template": "is complete"},
                "amount": l.amount,
                "fee_amount": l.fee.unwrap_or(0),
                "refunded": l.refunded,
                "created_on": l.at.format("%Y-%m-%dT%H:%M:%S%.6f%:z").to_string(),
                "ebanker": null,
                "user": {"idx": "cCaPkRPQGn5D8StkiqqMJg", "name": "Test User", "mobile": "98XXXXXXX1"},
                "merchant": {"idx": l.merchant, "name": "Simulated Merchant", "mobile": "merchant@example.com"},
            })
        })
        .collect();
    let link = |p: usize| {
        format!(
            "{}/khalti/api/v2/merchant-transaction/?page={p}&page_size={size}",
            st.base()
        )
    };
    axum::Json(json!({
        "total_pages": pages,
        "total_records": total,
        "next": (page < pages).then(|| link(page + 1)),
        "previous": (page > 1).then(|| link(page - 1)),
        "record_range": [if total == 0 { 0 } else { start + 1 }, start + records.len()],
        "current_page": page,
        "records": records,
    }))
    .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Injection {
    kind: String,
    #[serde(default)]
    reference: Option<String>,
    #[serde(default)]
    amount: Option<i64>,
    #[serde(default)]
    fee: Option<i64>,
}

fn inject(st: &SimState, provider: Provider, body: &[u8]) -> Response {
    let i: Injection = match serde_json::from_slice(body) {
        Ok(i) => i,
        Err(e) => return control_error(StatusCode::BAD_REQUEST, &format!("bad body: {e}")),
    };
    let key = i.reference.as_deref().and_then(|r| match provider {
        Provider::Esewa => st.esewa().resolve(r),
        Provider::Khalti => st.khalti().resolve(r),
        Provider::Fonepay => st.fonepay().resolve(r),
    });
    match apply(st, provider, &i, key) {
        Ok(v) => axum::Json(v).into_response(),
        Err(r) => r,
    }
}

fn apply(
    st: &SimState,
    provider: Provider,
    i: &Injection,
    key: Option<String>,
) -> Result<Value, Response> {
    let needs_key = || {
        key.clone()
            .ok_or_else(|| control_error(StatusCode::NOT_FOUND, "no attempt with that reference"))
    };
    let paisa = |v: Option<i64>, what: &str| {
        v.filter(|v| *v >= 0).ok_or_else(|| {
            control_error(
                StatusCode::BAD_REQUEST,
                &format!("{what} must be a non-negative integer of paisa"),
            )
        })
    };
    match i.kind.as_str() {
        "drop" => {
            let k = needs_key()?;
            st.statements().of(provider).dropped.insert(k.clone());
            Ok(json!({"kind": "drop", "key": k}))
        }
        "amount" => {
            let k = needs_key()?;
            let a = paisa(i.amount, "amount")?;
            st.statements().of(provider).amounts.insert(k.clone(), a);
            Ok(json!({"kind": "amount", "key": k, "amount": a}))
        }
        "fee" => {
            let k = needs_key()?;
            let f = paisa(i.fee, "fee")?;
            st.statements().of(provider).fees.insert(k.clone(), f);
            Ok(json!({"kind": "fee", "key": k, "fee": f}))
        }
        "foreign" => {
            let a = paisa(i.amount, "amount")?;
            let reference = i
                .reference
                .clone()
                .unwrap_or_else(|| format!("POS-{}", random_string(ALNUM, 12)));
            let provider_ref = match provider {
                Provider::Fonepay => random_string(b"0123456789", 9),
                _ => random_string(ALNUM, 22),
            };
            let merchant = match provider {
                Provider::Esewa => st
                    .config()
                    .esewa_merchants
                    .first()
                    .map(|m| m.product_code.clone()),
                Provider::Fonepay => st
                    .config()
                    .fonepay_merchants
                    .first()
                    .map(|m| m.merchant_code.clone()),
                Provider::Khalti => Some(KHALTI_MERCHANT.to_owned()),
            }
            .unwrap_or_default();
            let line = SimLine {
                key: format!("foreign:{provider_ref}"),
                reference: reference.clone(),
                provider_ref: provider_ref.clone(),
                status: match provider {
                    Provider::Khalti => khalti::COMPLETED.to_owned(),
                    _ => "Success".to_owned(),
                },
                refunded: false,
                amount: a,
                fee: i.fee.filter(|f| *f >= 0),
                at: super::nepal_now(),
                merchant,
            };
            st.statements().of(provider).foreign.push(line);
            Ok(
                json!({"kind": "foreign", "reference": reference, "provider_ref": provider_ref, "amount": a}),
            )
        }
        _ => Err(control_error(
            StatusCode::BAD_REQUEST,
            "kind must be drop, amount, fee or foreign",
        )),
    }
}

fn clear(st: &SimState, provider: Provider) -> Response {
    *st.statements().of(provider) = Edits::default();
    axum::Json(json!({"cleared": true})).into_response()
}

async fn esewa_inject(State(st): State<SimState>, body: Bytes) -> Response {
    inject(&st, Provider::Esewa, &body)
}
async fn khalti_inject(State(st): State<SimState>, body: Bytes) -> Response {
    inject(&st, Provider::Khalti, &body)
}
async fn fonepay_inject(State(st): State<SimState>, body: Bytes) -> Response {
    inject(&st, Provider::Fonepay, &body)
}
async fn esewa_clear(State(st): State<SimState>) -> Response {
    clear(&st, Provider::Esewa)
}
async fn khalti_clear(State(st): State<SimState>) -> Response {
    clear(&st, Provider::Khalti)
}
async fn fonepay_clear(State(st): State<SimState>) -> Response {
    clear(&st, Provider::Fonepay)
}

const INJECT: &str = "/_sim/statement-discrepancies";

pub(crate) fn esewa_routes() -> Router<SimState> {
    Router::new()
        .route("/_sim/statement", get(esewa_file))
        .route(INJECT, post(esewa_inject).delete(esewa_clear))
}

pub(crate) fn khalti_routes() -> Router<SimState> {
    Router::new()
        .route("/api/v2/merchant-transaction/", get(khalti_list))
        .route("/api/v2/merchant-transaction", get(khalti_list))
        .route(INJECT, post(khalti_inject).delete(khalti_clear))
}

pub(crate) fn fonepay_routes() -> Router<SimState> {
    Router::new()
        .route("/_sim/statement", get(fonepay_file))
        .route(INJECT, post(fonepay_inject).delete(fonepay_clear))
}
