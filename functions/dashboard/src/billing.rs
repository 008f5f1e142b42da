//! Recurring billing in the dashboard (issue 39): customers and plans,
//! read through the same domain calls as `/v1/billing`. A merchant whose
//! plan has no billing sees what it would need, not an error.

use axum::extract::{RawQuery, State};
use edge::PathId;
use edge::html::html;
use http::StatusCode;
use maud::{Markup, html as markup};
use shared::AppState;
use shared::domain::billing::customers::{self as billing_customers, Customer, PageRequest};
use shared::domain::billing::plans::{self as billing_plans, Plan};
use shared::ids::{CustomerId, PlanId};

use crate::pages::{Nav, label, layout, rupees, status_badge, when};
use crate::{Page, Signed, Stop, fail, nav, query};

/// The tabs of the billing pages.
const TABS: [(&str, &str); 2] = [
    ("customers", "/dashboard/billing/customers"),
    ("plans", "/dashboard/billing/plans"),
];

fn tabs(current: &str) -> Markup {
    markup! {
        p.tabs {
            @for (name, href) in TABS {
                @if name == current { strong { (name) } } @else { a href=(href) { (name) } }
                " "
            }
        }
    }
}

/// The page of a list from its `page` query parameter; a bad one is the
/// first page (a browser's typo, not an API client's).
fn page_of(q: &std::collections::HashMap<String, String>) -> PageRequest {
    PageRequest::parse(q.get("page").map(String::as_str), Some("25")).unwrap_or(PageRequest {
        page: 1,
        limit: crate::PAGE,
    })
}

/// Older/newer links of a page-numbered billing list.
fn pager(path: &str, extra: &str, page: &PageRequest, shown: usize, total: u64) -> Markup {
    let more = (page.offset() + shown) < usize::try_from(total).unwrap_or(usize::MAX);
    markup! {
        p.pager {
            @if page.page > 1 { a href={ (path) "?page=" (page.page - 1) (extra) } { "← Newer" } " " }
            @if more { a href={ (path) "?page=" (page.page + 1) (extra) } { "Older →" } }
        }
    }
}

/// Whether the merchant's plan includes billing; else the page saying so.
async fn entitled(
    state: &AppState,
    nav: &Nav,
    signed: &Signed,
    title: &str,
) -> Result<Option<String>, Stop> {
    let yes = billing_customers::merchant_entitled(state, &signed.session.merchant_id)
        .await
        .map_err(fail)?;
    if yes {
        return Ok(None);
    }
    let body = markup! {
        div.panel {
            p { "Recurring billing (customers, plans, subscriptions and their invoices) comes with the Growth and Pro plans." }
        }
    };
    Ok(Some(layout(nav, title, body)))
}

pub async fn customers_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    let nav = nav(&state, &signed, "billing").await?;
    if let Some(page) = entitled(&state, &nav, &signed, "Customers").await? {
        return Ok(html(StatusCode::OK, page));
    }
    let q = query(&raw);
    let page = page_of(&q);
    let search = q
        .get("search")
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty());
    let (list, total) =
        match billing_customers::list(&state, &signed.tenant, page, search.as_deref()).await {
            Ok(found) => found,
            // Too long a search: said on the page, the list unfiltered.
            Err(billing_customers::BillingError::Invalid { message, .. }) => {
                return Ok(html(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    layout(
                        &nav,
                        "Customers",
                        markup! { (tabs("customers")) p.error role="alert" { (message) } },
                    ),
                ));
            }
            Err(e) => return Err(fail(e)),
        };
    let extra = search
        .as_deref()
        .map(|s| {
            let s: String = form_urlencoded::byte_serialize(s.as_bytes()).collect();
            format!("&search={s}")
        })
        .unwrap_or_default();
    let body = markup! {
        (tabs("customers"))
        form method="get" action="/dashboard/billing/customers" {
            label for="search" { "Search name, email, phone or your id " }
            input id="search" name="search" type="search" maxlength="100" value=(search.clone().unwrap_or_default());
            " " button type="submit" { "Search" }
        }
        p.muted { (total) " customers." }
        div.panel {
            @if list.is_empty() { p { "No customers." } } @else {
                table {
                    thead { tr {
                        th scope="col" { "Customer" } th scope="col" { "Email" } th scope="col" { "Phone" }
                        th scope="col" { "Open subscriptions" } th scope="col" { "Created" }
                    } }
                    tbody { @for c in &list { (customer_row(c)) } }
                }
            }
        }
        (pager("/dashboard/billing/customers", &extra, &page, list.len(), total))
    };
    Ok(html(StatusCode::OK, layout(&nav, "Customers", body)))
}

fn customer_row(c: &Customer) -> Markup {
    markup! {
        tr {
            td { a href={ "/dashboard/billing/customers/" (c.id) } { (c.name) } br; span.muted { (c.id) } }
            td { (c.email.as_deref().unwrap_or("")) }
            td { (c.phone.as_deref().unwrap_or("")) }
            td.num { (c.open_subscriptions) }
            td { (when(c.created_at)) }
        }
    }
}

pub async fn customer_page(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<CustomerId>,
) -> Page {
    let nav = nav(&state, &signed, "billing").await?;
    if let Some(page) = entitled(&state, &nav, &signed, "Customer").await? {
        return Ok(html(StatusCode::OK, page));
    }
    let id = id.get_or(|_, raw| {
        fail(billing_customers::BillingError::NotFound {
            what: "customer",
            named: raw.to_owned(),
        })
    })?;
    let c = billing_customers::get(&state, &signed.tenant, &id)
        .await
        .map_err(fail)?;
    let body = markup! {
        (tabs("customers"))
        div.panel {
            dl.facts {
                dt { "Customer" } dd { (c.id) }
                dt { "Name" } dd { (c.name) }
                dt { "Email" } dd { (c.email.as_deref().unwrap_or("—")) }
                dt { "Phone" } dd { (c.phone.as_deref().unwrap_or("—")) }
                dt { "Your id" } dd { (c.external_customer_id.as_deref().unwrap_or("—")) }
                dt { "Reminders in" } dd { (label(&c.locale)) }
                dt { "Open subscriptions" } dd { (c.open_subscriptions) }
                dt { "Created" } dd { (when(c.created_at)) }
            }
        }
        p { a href="/dashboard/billing/customers" { "← Customers" } }
    };
    Ok(html(StatusCode::OK, layout(&nav, &c.name, body)))
}

pub async fn plans_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    let nav = nav(&state, &signed, "billing").await?;
    if let Some(page) = entitled(&state, &nav, &signed, "Plans").await? {
        return Ok(html(StatusCode::OK, page));
    }
    let q = query(&raw);
    let page = page_of(&q);
    let active = match q.get("active").map(String::as_str) {
        Some("true") => Some(true),
        Some("false") => Some(false),
        _ => None,
    };
    let (list, total) = billing_plans::list(&state, &signed.tenant, page, active)
        .await
        .map_err(fail)?;
    let extra = active.map(|a| format!("&active={a}")).unwrap_or_default();
    let body = markup! {
        (tabs("plans"))
        p {
            @match active {
                None => { strong { "All" } " · " a href="?active=true" { "Active" } " · " a href="?active=false" { "Archived" } }
                Some(true) => { a href="?" { "All" } " · " strong { "Active" } " · " a href="?active=false" { "Archived" } }
                Some(false) => { a href="?" { "All" } " · " a href="?active=true" { "Active" } " · " strong { "Archived" } }
            }
        }
        p.muted { (total) " plans." }
        div.panel {
            @if list.is_empty() { p { "No plans." } } @else {
                table {
                    thead { tr {
                        th scope="col" { "Plan" } th.num scope="col" { "Price" } th scope="col" { "Every" }
                        th scope="col" { "Calendar" } th scope="col" { "State" }
                    } }
                    tbody { @for p in &list { (plan_row(p)) } }
                }
            }
        }
        (pager("/dashboard/billing/plans", &extra, &page, list.len(), total))
    };
    Ok(html(StatusCode::OK, layout(&nav, "Plans", body)))
}

fn every(p: &Plan) -> String {
    let unit = label(&p.interval_unit);
    if p.interval_count == 1 {
        unit
    } else {
        format!("{} × {unit}", p.interval_count)
    }
}

fn plan_row(p: &Plan) -> Markup {
    markup! {
        tr {
            td { a href={ "/dashboard/billing/plans/" (p.id) } { (p.name) } br; span.muted { (p.id) } }
            td.num { (rupees(p.amount)) }
            td { (every(p)) }
            td { (label(&p.calendar)) }
            td { (status_badge(if p.active { "active" } else { "archived" })) }
        }
    }
}

pub async fn plan_page(State(state): State<AppState>, signed: Signed, id: PathId<PlanId>) -> Page {
    let nav = nav(&state, &signed, "billing").await?;
    if let Some(page) = entitled(&state, &nav, &signed, "Plan").await? {
        return Ok(html(StatusCode::OK, page));
    }
    let id = id.get_or(|_, raw| {
        fail(billing_customers::BillingError::NotFound {
            what: "plan",
            named: raw.to_owned(),
        })
    })?;
    let p = billing_plans::get(&state, &signed.tenant, &id)
        .await
        .map_err(fail)?;
    let body = markup! {
        (tabs("plans"))
        div.panel {
            dl.facts {
                dt { "Plan" } dd { (p.id) }
                dt { "Name" } dd { (p.name) }
                dt { "Price" } dd { (rupees(p.amount)) " every " (every(&p)) }
                dt { "Calendar" } dd { (label(&p.calendar)) }
                dt { "Trial" } dd { (p.trial_days) " days" }
                dt { "Grace period" } dd { (p.grace_period_days) " days" }
                dt { "Reminder before due" } dd { (p.reminder_days_before_due) " days" }
                dt { "Overdue reminders every" } dd { (p.overdue_reminder_interval_days) " days" }
                dt { "When overdue" } dd { (label(&p.overdue_action)) }
                dt { "Provider" } dd { (p.default_provider.map(|x| x.as_str()).unwrap_or("customer's choice")) }
                dt { "State" } dd { (status_badge(if p.active { "active" } else { "archived" })) }
                dt { "Created" } dd { (when(p.created_at)) }
            }
        }
        p { a href="/dashboard/billing/plans" { "← Plans" } }
    };
    Ok(html(StatusCode::OK, layout(&nav, &p.name, body)))
}
