//! A subscription's plan change and seats in the dashboard (issue 40
//! part 8), through the same domain calls as `/v1/billing`
//! (`billing::changes`): the subscription page offers a plan (now with a
//! proration, or from the next period) and, on a per-unit plan, a
//! quantity. A plan change is a preview page first (GET, nothing written:
//! the credit, debit, VAT and what the invoice will ask), then its confirm
//! form (POST with the CSRF token) makes the change. The audit entry of
//! the intent is written before the change, as the other subscription
//! forms do.

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use edge::PathId;
use edge::html::html;
use http::StatusCode;
use maud::{Markup, html as markup};
use shared::AppState;
use shared::domain::billing::changes::{self, ChangePlan, ProrationBehavior, UpdateQuantity};
use shared::domain::billing::customers::PageRequest;
use shared::domain::billing::lifecycle;
use shared::domain::billing::plans::{self as billing_plans, Plan};
use shared::domain::billing::subscription::{Subscription, SubscriptionStatus};
use shared::domain::billing::terms::PricingModel;
use shared::domain::dashboard::Action;
use shared::ids::SubscriptionId;

use crate::billing::{entitled, entitled_to_change, tabs};
use crate::pages::{layout, rupees};
use crate::{Page, Signed, Stop, audit, fail, nav, query, see_other};

fn no_subscription(_: &'static str, raw: &str) -> Stop {
    fail(shared::domain::billing::customers::BillingError::NotFound {
        what: "subscription",
        named: raw.to_owned(),
    })
}

/// Whether the subscription's plan or seats may change now.
fn changeable(s: &Subscription) -> bool {
    matches!(
        s.status,
        SubscriptionStatus::Active | SubscriptionStatus::Trialing | SubscriptionStatus::PastDue
    )
}

/// The tenant's active plans `s` could move to: the same interval and
/// calendar, not its own (at most a page).
pub(crate) async fn targets(state: &AppState, s: &Subscription) -> Result<Vec<Plan>, Stop> {
    let page = PageRequest {
        page: 1,
        limit: 100,
    };
    let tenant = s.tenant();
    let (plans, _) = billing_plans::list(state, &tenant, page, Some(true))
        .await
        .map_err(fail)?;
    let t = &s.terms;
    Ok(plans
        .into_iter()
        .filter(|p| {
            p.id != s.plan_id
                && (p.interval_unit, p.interval_count, p.calendar)
                    == (t.interval_unit, t.interval_count, t.calendar)
        })
        .collect())
}

/// The subscription page's forms: change plan (to its preview) and, on a
/// per-unit plan, the quantity. Nothing when its status takes no change.
pub(crate) fn forms(s: &Subscription, plans: &[Plan], csrf: &str) -> Markup {
    if !changeable(s) {
        return markup! {};
    }
    let path = format!("/dashboard/billing/subscriptions/{}", s.id);
    markup! {
        div.panel.actions {
            @if plans.is_empty() {
                p.muted { "No other active plan with this interval to change to." }
            } @else {
                form method="get" action={ (path) "/change-plan" } {
                    label for="new_plan" { "Change plan to " }
                    select id="new_plan" name="plan" {
                        @for p in plans {
                            option value=(p.id) { (p.name) " (" (rupees(p.amount)) ")" }
                        }
                    }
                    " "
                    label for="behavior" { "from " }
                    select id="behavior" name="behavior" {
                        option value="create_prorations" { "now, with a proration invoice" }
                        option value="none" { "the next period" }
                    }
                    " " button type="submit" { "Preview" }
                }
            }
            @if s.terms.pricing_model == PricingModel::PerUnit {
                form method="post" action={ (path) "/quantity" } {
                    input type="hidden" name="csrf" value=(csrf);
                    label for="quantity" { "Seats " }
                    input id="quantity" name="quantity" type="number" min="1" max="10000" value=(s.quantity);
                    " " button type="submit" { "Change seats (prorated now)" }
                }
            }
        }
    }
}

/// The subscription's pending plan change, for its facts.
pub(crate) fn pending(s: &Subscription) -> Markup {
    markup! {
        @if let Some(p) = &s.pending_change {
            dt { "Plan change" } dd {
                (p.terms.description) " (" (rupees(p.terms.amount)) ") from " (p.effective_on)
            }
        }
    }
}

fn behavior_of(raw: Option<&str>) -> Result<ProrationBehavior, Stop> {
    match raw {
        Some("none") => Ok(ProrationBehavior::None),
        Some("create_prorations") | None => Ok(ProrationBehavior::CreateProrations),
        Some(_) => Err(fail(shared::refusal::Refusal::invalid(
            "behavior",
            "behavior must be create_prorations or none",
        ))),
    }
}

/// `GET …/{id}/change-plan?plan=&behavior=`: what the change would do,
/// and the form that makes it.
pub async fn change_plan_preview(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<SubscriptionId>,
    RawQuery(raw): RawQuery,
) -> Page {
    let nav = nav(&state, &signed, "billing").await?;
    if let Some(page) = entitled(&state, &nav, &signed, "Change plan").await? {
        return Ok(html(StatusCode::OK, page));
    }
    signed.require(Action::ChangeRecords)?;
    let id = id.get_or(no_subscription)?;
    let q = query(&raw);
    let plan = q.get("plan").map(String::as_str);
    let behavior = behavior_of(q.get("behavior").map(String::as_str))?;
    let preview = changes::preview(&state, &signed.tenant, &id, plan)
        .await
        .map_err(fail)?;
    let path = format!("/dashboard/billing/subscriptions/{id}");
    let now = behavior == ProrationBehavior::CreateProrations;
    let body = markup! {
        (tabs("subscriptions"))
        h2 { "Change " (id) " to " (preview.new_plan.name) }
        div.panel {
            dl.facts {
                dt { "From" } dd { (preview.current_plan.name) " (" (rupees(preview.current_plan.amount)) ")" }
                dt { "To" } dd { (preview.new_plan.name) " (" (rupees(preview.new_plan.amount)) ")" }
                dt { "Seats" } dd { (preview.quantity) " → " (preview.new_quantity) }
                @if now {
                    @match (preview.period_start, preview.period_end) {
                        (Some(a), Some(b)) => {
                            dt { "Period" } dd { (a) " to " (b) " (exclusive); from " (preview.proration_date) ", " (preview.remaining_days) " of " (preview.total_days) " days remain" }
                        }
                        _ => { dt { "Period" } dd { "Nothing is billed yet: nothing is prorated." } }
                    }
                    dt { "Credit (unused time)" } dd { (rupees(preview.credit_amount)) }
                    dt { "Debit (remaining time)" } dd { (rupees(preview.debit_amount)) }
                    dt { "Net" } dd { (rupees(preview.net_amount)) }
                    @if preview.tax_amount > 0 { dt { "VAT" } dd { (rupees(preview.tax_amount)) } }
                    dt { "Result" } dd {
                        @if preview.net_amount > 0 {
                            "A proration invoice of " (rupees(preview.amount_due)) ", due today."
                        } @else if preview.net_amount < 0 {
                            (rupees(-preview.net_amount)) " kept as the customer's credit; no invoice."
                        } @else { "Nothing to bill." }
                    }
                } @else {
                    dt { "When" } dd { "From the next period; this period stays on the current plan and nothing is billed now." }
                }
            }
        }
        form method="post" action={ (path) "/change-plan" } {
            input type="hidden" name="csrf" value=(nav.csrf);
            input type="hidden" name="plan" value=(preview.new_plan.id);
            input type="hidden" name="behavior" value=(if now { "create_prorations" } else { "none" });
            button type="submit" { "Confirm the change" }
        }
        p { a href=(path) { "← Back to the subscription" } }
    };
    Ok(html(StatusCode::OK, layout(&nav, "Change plan", body)))
}

/// `POST …/{id}/change-plan`: the confirmed change.
pub async fn change_plan(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<SubscriptionId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let id = id.get_or(no_subscription)?;
    lifecycle::get(&state, &signed.tenant, &id)
        .await
        .map_err(fail)?;
    let plan = f.get("plan").cloned().unwrap_or_default();
    let behavior = behavior_of(f.get("behavior").map(String::as_str))?;
    let detail = format!(
        "to {plan} ({})",
        if behavior == ProrationBehavior::None {
            "next period"
        } else {
            "now, prorated"
        }
    );
    audit(&state, &signed, "subscription.change_plan", &id, &detail).await?;
    let body = ChangePlan {
        new_plan_id: plan,
        effective_at: None,
        proration_behavior: Some(behavior),
    };
    changes::change_plan(&state, &signed.tenant, &id, body)
        .await
        .map_err(fail)?;
    Ok(see_other(&format!(
        "/dashboard/billing/subscriptions/{id}?done=change-plan"
    )))
}

/// `POST …/{id}/quantity`: the seats, prorated now.
pub async fn update_quantity(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<SubscriptionId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let id = id.get_or(no_subscription)?;
    lifecycle::get(&state, &signed.tenant, &id)
        .await
        .map_err(fail)?;
    let raw = f.get("quantity").map(|q| q.trim()).unwrap_or_default();
    let quantity: i64 = raw.parse().map_err(|_| {
        fail(shared::refusal::Refusal::invalid(
            "quantity",
            "quantity must be a whole number of seats",
        ))
    })?;
    audit(
        &state,
        &signed,
        "subscription.quantity",
        &id,
        &format!("to {quantity}"),
    )
    .await?;
    changes::update_quantity(&state, &signed.tenant, &id, UpdateQuantity { quantity })
        .await
        .map_err(fail)?;
    Ok(see_other(&format!(
        "/dashboard/billing/subscriptions/{id}?done=quantity"
    )))
}
