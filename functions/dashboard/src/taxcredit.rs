//! The tax settings page and a customer's credit (issue 40 parts 2, 3):
//! read and changed through `billing::tax` and `billing::credit`, as
//! `/v1/billing/settings/tax` and `/v1/billing/customers/{id}/credit`
//! do. The forms take `Action::ChangeRecords` and the form's CSRF token;
//! the audit entry of the intent is written first.

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use edge::PathId;
use edge::html::html;
use http::StatusCode;
use maud::{Markup, html as markup};
use shared::AppState;
use shared::domain::billing::credit::{self, AddCredit, CreditActor};
use shared::domain::billing::customers::{self as billing_customers, BillingError, Customer};
use shared::domain::billing::tax::{
    self, OverpaymentHandling, TaxSettings, UpdateTaxSettings, percent,
};
use shared::domain::dashboard::Action;
use shared::ids::CustomerId;

use crate::billing::{entitled, entitled_to_change, tabs};
use crate::pages::{Nav, label, layout, rupees, when};
use crate::{Page, Signed, Stop, audit, fail, nav, query, see_other};

const TAX_PATH: &str = "/dashboard/billing/settings/tax";

/// Paisa with its sign: `-NPR 15.00`.
fn signed_rupees(paisa: i64) -> String {
    if paisa < 0 {
        format!("-{}", rupees(paisa.saturating_neg()))
    } else {
        rupees(paisa)
    }
}

/// Rupees as typed (`500`, `-12.50`) in paisa; `None` when not a number
/// with at most two decimals.
pub(crate) fn paisa_of(raw: &str) -> Option<i64> {
    let t = raw.trim().replace(',', "");
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest.to_owned()),
        None => (false, t),
    };
    let (whole, frac) = t.split_once('.').unwrap_or((&t, ""));
    if whole.is_empty() && frac.is_empty()
        || frac.len() > 2
        || !whole
            .bytes()
            .chain(frac.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let frac: i64 = format!("{frac:0<2}").parse().ok()?;
    let paisa = whole.checked_mul(100)?.checked_add(frac)?;
    Some(if neg { -paisa } else { paisa })
}

fn tax_form(nav: &Nav, s: &TaxSettings, act: bool) -> Markup {
    markup! {
        div.panel {
            dl.facts {
                dt { "Tax on invoices" } dd id="tax-state" { @if s.tax_enabled { "on" } @else { "off" } }
                dt { "Rate" } dd id="tax-rate" { (s.tax_label) " (" (percent(s.tax_rate_bps)) ")" }
                dt { "Your PAN/VAT number" } dd id="tax-pan" { (s.tax_registration_number.as_deref().unwrap_or("—")) }
                dt { "Overpayments" } dd id="overpayments" { (label(&s.overpayment_handling)) }
            }
        }
        @if act {
            form.panel method="post" action=(TAX_PATH) {
                input type="hidden" name="csrf" value=(nav.csrf);
                p { label { input type="checkbox" name="enabled" value="true" checked[s.tax_enabled]; " Add tax to billing invoices (they become tax invoices)" } }
                p { label for="rate_bps" { "Rate in basis points (1300 is 13.00%) " }
                    input id="rate_bps" name="rate_bps" type="number" min="0" max="10000" value=(s.tax_rate_bps); }
                p { label for="registration_number" { "PAN/VAT number (9 digits) " }
                    input id="registration_number" name="registration_number" maxlength="20" value=(s.tax_registration_number.clone().unwrap_or_default()); }
                p { label for="tax_label" { "Label " }
                    input id="tax_label" name="label" maxlength="30" value=(s.tax_label); }
                p { label for="overpayment_handling" { "A payment for an invoice already paid is " }
                    select id="overpayment_handling" name="overpayment_handling" {
                        option value="refund" selected[s.overpayment_handling == OverpaymentHandling::Refund] { "refunded" }
                        option value="credit" selected[s.overpayment_handling == OverpaymentHandling::Credit] { "kept as the customer's credit" }
                    }
                }
                button type="submit" { "Save" }
            }
        }
    }
}

async fn tax_view(
    state: &AppState,
    signed: &Signed,
    notice: Option<&str>,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let nav = nav(state, signed, "billing").await?;
    if let Some(page) = entitled(state, &nav, signed, "Tax").await? {
        return Ok(html(StatusCode::OK, page));
    }
    let s = tax::get(state, &signed.tenant).await.map_err(fail)?;
    let act = signed.allows(Action::ChangeRecords);
    let body = markup! {
        (tabs("tax"))
        @if let Some(n) = notice { p.notice role="status" { (n) } }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        p.muted { "Plan prices exclude tax. The tax is on the amount after any discount; each invoice keeps the rate and number it was issued with." }
        (tax_form(&nav, &s, act))
    };
    Ok(html(status, layout(&nav, "Tax", body)))
}

pub async fn tax_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    let q = query(&raw);
    let notice = q
        .get("done")
        .is_some_and(|d| d == "saved")
        .then_some("The tax settings are saved.");
    tax_view(&state, &signed, notice, None, StatusCode::OK).await
}

pub async fn save_tax(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let text = |name: &str| {
        f.get(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let rate = match text("rate_bps").map(|r| r.parse::<i64>()) {
        None => None,
        Some(Ok(r)) => Some(r),
        Some(Err(_)) => {
            let e = "Rate: a whole number of basis points, 0 to 10000";
            return tax_view(&state, &signed, None, Some(e), StatusCode::BAD_REQUEST).await;
        }
    };
    let handling = match f.get("overpayment_handling").map(String::as_str) {
        Some("credit") => Some(OverpaymentHandling::Credit),
        Some("refund") => Some(OverpaymentHandling::Refund),
        _ => None,
    };
    let update = UpdateTaxSettings {
        enabled: Some(f.get("enabled").is_some_and(|v| v == "true")),
        rate_bps: rate,
        registration_number: Some(text("registration_number")),
        label: Some(text("label")),
        overpayment_handling: handling,
    };
    let current = tax::get(&state, &signed.tenant).await.map_err(fail)?;
    // Checked before the audit entry: a refused form records nothing.
    if let Err(BillingError::Invalid { message, .. }) =
        tax::apply(&current, update.clone(), state.clock.now())
    {
        return tax_view(
            &state,
            &signed,
            None,
            Some(&message),
            StatusCode::BAD_REQUEST,
        )
        .await;
    }
    let detail = format!(
        "enabled {}, rate {:?}, number {:?}, overpayments {:?}",
        update.enabled.unwrap_or_default(),
        update.rate_bps,
        update.registration_number.clone().flatten(),
        update.overpayment_handling
    );
    audit(&state, &signed, "billing.tax_settings", "tax", &detail).await?;
    tax::update(&state, &signed.tenant, update)
        .await
        .map_err(fail)?;
    Ok(see_other(&format!("{TAX_PATH}?done=saved")))
}

/// The customer page's credit: the balance, the newest ledger entries and
/// the add/deduct form.
pub(crate) async fn credit_section(
    state: &AppState,
    signed: &Signed,
    nav: &Nav,
    c: &Customer,
) -> Result<Markup, Stop> {
    let entries = credit::ledger(state, &signed.tenant, &c.id, 50)
        .await
        .map_err(fail)?;
    let act = signed.allows(Action::ChangeRecords);
    Ok(markup! {
        h2 { "Credit" }
        div.panel {
            p { "Balance: " strong id="credit-balance" { (rupees(c.credit_balance)) } span.muted { " applied to the next invoices before payment" } }
            @if entries.is_empty() { p { "No credit yet." } } @else {
                table id="credit-ledger" {
                    thead { tr {
                        th scope="col" { "When" } th.num scope="col" { "Amount" } th.num scope="col" { "Balance after" }
                        th scope="col" { "Reason" } th scope="col" { "Note" } th scope="col" { "By" }
                    } }
                    tbody { @for e in &entries { tr {
                        td { (when(e.created_at)) }
                        td.num { (signed_rupees(e.amount)) }
                        td.num { (rupees(e.balance_after)) }
                        td { (label(&e.reason))
                             @if let Some(i) = &e.invoice_id { " " a href={ "/dashboard/billing/invoices/" (i) } { (i) } } }
                        td { (e.note.as_deref().unwrap_or("")) }
                        td { (e.actor.id().unwrap_or_else(|| "billing".into())) }
                    } } }
                }
            }
        }
        @if act {
            form.panel method="post" action={ "/dashboard/billing/customers/" (c.id) "/credit" } {
                input type="hidden" name="csrf" value=(nav.csrf);
                label for="credit_amount" { "Amount in NPR (negative deducts) " }
                input id="credit_amount" name="amount" required inputmode="decimal" maxlength="20";
                " " label for="credit_note" { "Note " }
                input id="credit_note" name="note" maxlength="500";
                " " button type="submit" { "Add credit" }
            }
        }
    })
}

fn no_customer(_: &'static str, raw: &str) -> Stop {
    fail(BillingError::NotFound {
        what: "customer",
        named: raw.to_owned(),
    })
}

pub async fn add_credit(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<CustomerId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let id = id.get_or(no_customer)?;
    let c = billing_customers::get(&state, &signed.tenant, &id)
        .await
        .map_err(fail)?;
    let back = format!("/dashboard/billing/customers/{id}");
    let refuse = |message: String| {
        let to = format!(
            "{back}?credit_error={}",
            form_urlencoded::byte_serialize(message.as_bytes()).collect::<String>()
        );
        Ok(see_other(&to))
    };
    let Some(amount) = f.get("amount").and_then(|a| paisa_of(a)) else {
        return refuse("Amount: rupees, at most two decimals (negative deducts)".into());
    };
    let note = f.get("note").cloned();
    // Checked before the audit entry: a refused form records nothing.
    if let Err(e) =
        credit::next_balance(c.credit_balance, amount).and(credit::note(note.as_deref()))
    {
        return refuse(e.to_string());
    }
    audit(
        &state,
        &signed,
        "billing_customer.credit",
        &id,
        &signed_rupees(amount),
    )
    .await?;
    let actor = CreditActor::DashboardUser {
        user_id: signed.user.id.clone(),
    };
    match credit::add(
        &state,
        &signed.tenant,
        &id,
        AddCredit { amount, note },
        actor,
        None,
    )
    .await
    {
        Ok(_) => Ok(see_other(&format!("{back}?done=credit"))),
        // Moved meanwhile (another deduction): said on the page.
        Err(BillingError::Invalid { message, .. }) => refuse(message),
        Err(e) => Err(fail(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::paisa_of;

    #[test]
    fn rupees_as_typed() {
        for (raw, paisa) in [
            ("500", Some(50_000)),
            ("-12.5", Some(-1_250)),
            ("1,000.05", Some(100_005)),
            (".5", Some(50)),
            ("1.234", None),
            ("abc", None),
            ("", None),
            ("-", None),
            ("99999999999999999999", None),
        ] {
            assert_eq!(paisa_of(raw), paisa, "{raw}");
        }
    }
}
