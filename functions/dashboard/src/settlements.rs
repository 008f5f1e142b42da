//! Settlements in the dashboard (issue 41, part 5): per provider and Nepal
//! day, what the provider should pay (`expected`), the bank credits the
//! merchant recorded and the variance, highlighted when not zero; a form
//! to record a bank credit and a button to delete one recorded by
//! mistake (`Action::ChangeRecords`, audited `settlement_credit.record` /
//! `settlement_credit.delete` in the write's own transaction). The rules
//! are `domain::reconciliation::settlements`, as the API's.

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use edge::PathId;
use edge::html::html;
use http::StatusCode;
use maud::html as markup;
use shared::AppState;
use shared::domain::Provider;
use shared::domain::dashboard::Action;
use shared::domain::reconciliation::settlements::{
    self, CreditRequest, SettlementError, SettlementQuery, Settlements,
};
use shared::ids::BankCreditId;
use shared::money::parse_rupees;

use crate::pages::{layout, rupees};
use crate::{Page, Signed, Stop, fail, id_param, nav, query, see_other};

const PATH: &str = "/dashboard/reconciliation/settlements";

/// The range and provider the page shows, as asked.
#[derive(Default)]
struct Asked {
    provider: Option<String>,
    from: Option<String>,
    to: Option<String>,
}

impl Asked {
    fn of(q: &std::collections::HashMap<String, String>) -> Asked {
        let get = |k: &str| {
            q.get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        Asked {
            provider: get("provider"),
            from: get("from"),
            to: get("to"),
        }
    }

    fn query(&self) -> SettlementQuery<'_> {
        SettlementQuery {
            provider: self.provider.as_deref(),
            from: self.from.as_deref(),
            to: self.to.as_deref(),
        }
    }
}

fn signed_paisa(paisa: i64) -> String {
    if paisa < 0 {
        format!("−{}", rupees(paisa.saturating_neg()))
    } else {
        rupees(paisa)
    }
}

async fn show(
    state: &AppState,
    signed: &Signed,
    asked: &Asked,
    notice: Option<&str>,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let (days, refused) = match settlements::settlements(state, &signed.tenant, asked.query()).await
    {
        Ok(s) => (s, None),
        Err(e @ SettlementError::Invalid { .. }) => {
            let fallback =
                settlements::settlements(state, &signed.tenant, SettlementQuery::default())
                    .await
                    .map_err(fail)?;
            (fallback, Some(e.to_string()))
        }
        Err(e) => return Err(fail(e)),
    };
    let Settlements { from, to, data } = days;
    let nav = nav(state, signed, "reconciliation").await?;
    let may_change = signed.allows(Action::ChangeRecords);
    let chosen = asked.provider.as_deref().unwrap_or("");
    let body = markup! {
        @if let Some(n) = notice { p.notice role="status" { (n) } }
        @if let Some(e) = error.or(refused.as_deref()) { p.error role="alert" { (e) } }
        p.muted { "Per provider and Nepal day: the net of the day's successful payments (amount less the provider's fee, or your configured rate) less its refunds, beside what your bank received. Provider settlement windows are not public: a payment counts on the day it was created." }
        form.stack method="get" action=(PATH) {
            label for="provider" { "Provider" }
            select id="provider" name="provider" {
                option value="" selected[chosen.is_empty()] { "All providers" }
                @for p in Provider::ALL {
                    option value=(p.as_str()) selected[chosen == p.as_str()] { (p.display_name()) }
                }
            }
            label for="from" { "From (Nepal day)" }
            input id="from" name="from" type="date" value=(from);
            label for="to" { "To" }
            input id="to" name="to" type="date" value=(to);
            button type="submit" { "Show" }
        }
        div.panel {
            @if data.is_empty() {
                p { "No payments, refunds or bank credits from " (from) " to " (to) "." }
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "Day" } th scope="col" { "Provider" }
                        th scope="col" { "Payments" } th scope="col" { "Refunds" }
                        th scope="col" { "Expected" } th scope="col" { "Credited" }
                        th scope="col" { "Variance" } th scope="col" { "Bank credits" }
                    } }
                    tbody { @for d in &data {
                        tr.variance[d.variance != 0] {
                            td { (d.date) }
                            td { (d.provider.display_name()) }
                            td { (d.expected_payments)
                                @if d.payments_without_fee > 0 { " (" (d.payments_without_fee) " without a fee)" } }
                            td { (d.expected_refunds) }
                            td { (signed_paisa(d.expected)) }
                            td { (signed_paisa(d.credited)) }
                            td {
                                @if d.variance == 0 { "none" }
                                @else { strong.variance { (signed_paisa(d.variance)) } }
                            }
                            td { @for c in &d.credits {
                                div {
                                    (rupees(c.amount.get())) " · " (c.reference)
                                    @if may_change {
                                        form method="post" action={ (PATH) "/credits/" (c.id) "/delete" } {
                                            input type="hidden" name="csrf" value=(nav.csrf);
                                            button.link type="submit" { "Delete " (c.reference) }
                                        }
                                    }
                                }
                            } }
                        }
                    } }
                }
            }
        }
        @if may_change {
            section.panel aria-labelledby="credit-title" {
                h2 id="credit-title" { "Record a bank credit" }
                form.stack method="post" action={ (PATH) "/credits" } autocomplete="off" {
                    input type="hidden" name="csrf" value=(nav.csrf);
                    label for="credit-provider" { "Provider" }
                    select id="credit-provider" name="provider" required {
                        @for p in Provider::ALL { option value=(p.as_str()) { (p.display_name()) } }
                    }
                    label for="credit-date" { "Settlement day (Nepal)" }
                    input id="credit-date" name="date" type="date" required value=(to);
                    label for="credit-amount" { "Amount (NPR)" }
                    input id="credit-amount" name="amount" inputmode="decimal" required maxlength="16";
                    label for="credit-reference" { "Bank reference" }
                    input id="credit-reference" name="reference" required maxlength="100";
                    button.primary type="submit" { "Record credit" }
                }
            }
        }
    };
    Ok(html(status, layout(&nav, "Settlements", body)))
}

pub async fn page(State(state): State<AppState>, signed: Signed, RawQuery(raw): RawQuery) -> Page {
    signed.require(Action::ReadRecords)?;
    let q = query(&raw);
    let notice = if id_param(&q, "recorded", "bcr_").is_some() {
        Some("Bank credit recorded.")
    } else if id_param(&q, "deleted", "bcr_").is_some() {
        Some("Bank credit deleted.")
    } else {
        None
    };
    show(
        &state,
        &signed,
        &Asked::of(&q),
        notice,
        None,
        StatusCode::OK,
    )
    .await
}

/// Records a bank credit from the form (amount in rupees).
pub async fn record(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    let field = |k: &str| f.get(k).map(|v| v.trim().to_owned()).unwrap_or_default();
    let (provider, date, reference) = (field("provider"), field("date"), field("reference"));
    let back = Asked {
        provider: None,
        from: None,
        to: Some(date.clone()).filter(|d| settlements::parse_day("date", d).is_ok()),
    };
    let amount = match parse_rupees(&field("amount")) {
        Ok(paisa) => paisa,
        Err(why) => {
            let why = format!("Not recorded: amount: {why}");
            return refuse(
                &state,
                &signed,
                &back,
                &why,
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await;
        }
    };
    let req = CreditRequest {
        provider: &provider,
        date: &date,
        amount,
        reference: &reference,
    };
    let detail = format!("{provider} {date} {amount} paisa {reference}");
    let audit = signed.audit_op(&state, "settlement_credit.record", &provider, &detail)?;
    match settlements::record_credit(&state, &signed.tenant, req, None, audit).await {
        Ok(c) => Ok(see_other(&format!(
            "{PATH}?to={}&recorded={}",
            c.date, c.id
        ))),
        Err(e @ SettlementError::DuplicateReference { .. }) => {
            let why = format!("Not recorded: {e}");
            refuse(&state, &signed, &back, &why, StatusCode::CONFLICT).await
        }
        Err(e @ SettlementError::Invalid { .. }) => {
            let why = format!("Not recorded: {e}");
            refuse(
                &state,
                &signed,
                &back,
                &why,
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await
        }
        Err(e) => Err(fail(e)),
    }
}

async fn refuse(
    state: &AppState,
    signed: &Signed,
    asked: &Asked,
    why: &str,
    status: StatusCode,
) -> Page {
    show(state, signed, asked, None, Some(why), status).await
}

fn no_credit(_: &'static str, raw: &str) -> Stop {
    fail(SettlementError::NotFound(raw.to_owned()))
}

/// Deletes a bank credit recorded by mistake.
pub async fn delete(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<BankCreditId>,
    body: Bytes,
) -> Page {
    signed.action_form(Action::ChangeRecords, &body)?;
    let id = id.get_or(no_credit)?;
    let credit = settlements::get_credit(&state, &signed.tenant, &id)
        .await
        .map_err(fail)?;
    let detail = format!(
        "{} {} {} paisa {}",
        credit.provider.as_str(),
        credit.date,
        credit.amount.get(),
        credit.reference
    );
    let audit = signed.audit_op(&state, "settlement_credit.delete", &id, &detail)?;
    settlements::delete_credit(&state, &signed.tenant, &id, audit)
        .await
        .map_err(fail)?;
    Ok(see_other(&format!(
        "{PATH}?to={}&deleted={id}",
        credit.date
    )))
}
