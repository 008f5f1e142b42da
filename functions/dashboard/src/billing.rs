//! Recurring billing in the dashboard (issue 39): customers, plans,
//! subscriptions and their invoices, read and changed through the same
//! domain calls as `/v1/billing`. A merchant whose plan has no billing
//! sees what it would need, not an error.
//!
//! Changing a subscription (pause, resume, cancel) or an invoice (void,
//! a payment received outside) takes `Action::ChangeRecords` and the
//! form's CSRF token; the domain calls take no extra writes, so the
//! audit entry of the intent is written first.

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use chrono::NaiveDate;
use edge::PathId;
use edge::html::html;
use http::StatusCode;
use maud::{Markup, html as markup};
use shared::AppState;
use shared::domain::billing::calendar;
use shared::domain::billing::customers::{self as billing_customers, Customer, PageRequest};
use shared::domain::billing::invoice::view::{self as invoice_view, InvoiceView};
use shared::domain::billing::invoice::{
    self as billing_invoice, BillingInvoice, InvoiceStatus, OutOfBand, OutOfBandMethod, PayOutcome,
};
use shared::domain::billing::lifecycle::{
    self, CancelSubscription, PauseSubscription, SubscriptionView,
};
use shared::domain::billing::plans::{self as billing_plans, Plan};
use shared::domain::billing::subscription::{
    self as billing_subscription, Subscription, SubscriptionEvent, SubscriptionStatus,
};
use shared::domain::dashboard::{Action, BillingRow, billing_timeline};
use shared::domain::outbox::BillingTimeline;
use shared::ids::{BillingInvoiceId, CustomerId, PlanId, SubscriptionId};
use shared::time::Timestamp;

use crate::pages::{Nav, label, layout, rupees, status_badge, when};
use crate::{Page, Signed, Stop, audit, fail, nav, query, see_other};

/// The rows a billing timeline shows at most (newest first).
pub(crate) const TIMELINE: usize = 50;

/// A link to billing invoice `raw` (a stored id), or the text alone when
/// it is not one.
fn invoice_link(raw: &str) -> Markup {
    match BillingInvoiceId::parse(raw) {
        Some(id) => markup! { a href={ "/dashboard/billing/invoices/" (id) } { (id) } },
        None => markup! { (raw) },
    }
}

/// A billing timeline (webhook events, and each channel of each notice
/// with its outcome), newest first; rows after `since` marked new.
pub(crate) fn timeline_panel(rows: &[BillingRow], since: Option<Timestamp>) -> Markup {
    markup! {
        div.panel.timeline {
            @if rows.is_empty() { p.muted { "Nothing yet." } } @else {
                table {
                    thead { tr {
                        th scope="col" { "When" } th scope="col" { "What" } th scope="col" { "Details" }
                        @if since.is_some() { th scope="col" { "" } }
                    } }
                    tbody {
                        @for r in rows {
                            tr {
                                td { (when(r.at())) }
                                @match r {
                                    BillingRow::Event(e) => {
                                        td { code { (e.event_type.as_str()) } }
                                        td { @if let Some(inv) = &e.about { "invoice " (invoice_link(inv)) } }
                                    }
                                    BillingRow::Notice { invoice, entry } => {
                                        td { "reminder " (label(&entry.kind)) }
                                        td {
                                            (label(&entry.channel)) " " (status_badge(&label(&entry.outcome)))
                                            @if let Some(inv) = invoice { " invoice " (invoice_link(inv.as_str())) }
                                        }
                                    }
                                }
                                @if let Some(t) = since { td { @if r.at() > t { strong { "new" } } } }
                            }
                        }
                    }
                }
                @if rows.len() >= TIMELINE { p.muted { "The latest " (TIMELINE) " are shown." } }
            }
        }
    }
}

/// The tabs of the billing pages.
const TABS: [(&str, &str); 8] = [
    ("customers", "/dashboard/billing/customers"),
    ("plans", "/dashboard/billing/plans"),
    ("subscriptions", "/dashboard/billing/subscriptions"),
    ("invoices", "/dashboard/billing/invoices"),
    ("coupons", "/dashboard/billing/coupons"),
    ("promotion codes", "/dashboard/billing/promotion-codes"),
    ("test clocks", "/dashboard/billing/test-clocks"),
    ("tax", "/dashboard/billing/settings/tax"),
];

pub(crate) fn tabs(current: &str) -> Markup {
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

/// [`page_of`] for the counted lists (customers, subscriptions, billing
/// invoices): any page number reaches its records unfiltered (and an
/// invoices status filter); another filter or a search past the window is
/// refused by the list.
fn deep_page_of(q: &std::collections::HashMap<String, String>) -> PageRequest {
    PageRequest::parse_deep(q.get("page").map(String::as_str), Some("25")).unwrap_or(PageRequest {
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
pub(crate) async fn entitled(
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
    let page = deep_page_of(&q);
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
    RawQuery(raw): RawQuery,
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
    let credit = crate::taxcredit::credit_section(&state, &signed, &nav, &c).await?;
    let q = query(&raw);
    let filters = invoice_view::Filters {
        customer_id: Some(id.clone()),
        ..invoice_view::Filters::default()
    };
    let first = PageRequest {
        page: 1,
        limit: crate::PAGE,
    };
    let (invoices, _) = invoice_view::list(&state, &signed.tenant, first, &filters)
        .await
        .map_err(fail)?;
    let ids: Vec<BillingInvoiceId> = invoices.iter().map(|i| i.id.clone()).collect();
    let rows = billing_timeline(&state, BillingTimeline::Customer(&id), &ids, &[], TIMELINE)
        .await
        .map_err(fail)?;
    let body = markup! {
        (tabs("customers"))
        @if q.get("done").is_some_and(|d| d == "credit") { p.notice role="status" { "The credit is recorded." } }
        @if let Some(e) = q.get("credit_error") { p.error role="alert" { (e) } }
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
        (credit)
        h2 #timeline { "Timeline" }
        p.muted { "Its subscriptions' and invoices' events, and the reminders of its latest " (crate::PAGE) " invoices, newest first." }
        (timeline_panel(&rows, None))
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

/// A query parameter's trimmed value, absent when empty (a form's blank
/// select).
fn param<'a>(q: &'a std::collections::HashMap<String, String>, name: &str) -> Option<&'a str> {
    q.get(name).map(|s| s.trim()).filter(|s| !s.is_empty())
}

/// `&name=value` for a pager link.
fn keep(name: &str, value: Option<&str>) -> String {
    value
        .map(|v| {
            let v: String = form_urlencoded::byte_serialize(v.as_bytes()).collect();
            format!("&{name}={v}")
        })
        .unwrap_or_default()
}

/// Refuses a billing form (403, nothing done) when the merchant's plan
/// no longer includes billing.
pub(crate) async fn entitled_to_change(state: &AppState, signed: &Signed) -> Result<(), Stop> {
    let yes = billing_customers::merchant_entitled(state, &signed.session.merchant_id)
        .await
        .map_err(fail)?;
    if yes {
        Ok(())
    } else {
        Err(fail(shared::refusal::Refusal::forbidden(
            "permission_denied",
            "Recurring billing comes with the Growth and Pro plans",
        )))
    }
}

// ---------------------------------------------------------------------------
// Subscriptions.

pub async fn subscriptions_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    let nav = nav(&state, &signed, "billing").await?;
    if let Some(page) = entitled(&state, &nav, &signed, "Subscriptions").await? {
        return Ok(html(StatusCode::OK, page));
    }
    let q = query(&raw);
    let page = deep_page_of(&q);
    let status = param(&q, "status");
    let customer = param(&q, "customer");
    let filter = lifecycle::ListFilter::parse(status, customer, None).map_err(fail)?;
    let (list, total) = lifecycle::list(&state, &signed.tenant, page, &filter)
        .await
        .map_err(fail)?;
    let extra = format!("{}{}", keep("status", status), keep("customer", customer));
    let body = markup! {
        (tabs("subscriptions"))
        form method="get" action="/dashboard/billing/subscriptions" {
            label for="status" { "Status " }
            select id="status" name="status" {
                option value="" { "any" }
                @for s in SubscriptionStatus::ALL {
                    option value=(s.as_str()) selected[status == Some(s.as_str())] { (s.as_str()) }
                }
            }
            " " label for="customer" { "Customer id " }
            input id="customer" name="customer" type="search" maxlength="64" placeholder="cus_…" value=(customer.unwrap_or_default());
            " " button type="submit" { "Filter" }
        }
        p.muted { (total) " subscriptions." }
        div.panel {
            @if list.is_empty() { p { "No subscriptions." } } @else {
                table {
                    thead { tr {
                        th scope="col" { "Subscription" } th scope="col" { "Customer" } th scope="col" { "Plan" }
                        th.num scope="col" { "Price" } th scope="col" { "Status" } th scope="col" { "Period ends" }
                    } }
                    tbody { @for s in &list { (subscription_row(s)) } }
                }
            }
        }
        (pager("/dashboard/billing/subscriptions", &extra, &page, list.len(), total))
    };
    Ok(html(StatusCode::OK, layout(&nav, "Subscriptions", body)))
}

fn subscription_row(s: &Subscription) -> Markup {
    let v = SubscriptionView::of(s);
    markup! {
        tr {
            td { a href={ "/dashboard/billing/subscriptions/" (v.id) } { (v.id) } }
            td { a href={ "/dashboard/billing/customers/" (v.customer_id) } { (v.customer_id) } }
            td { (v.plan.name) }
            td.num { (rupees(v.plan.amount)) }
            td { (status_badge(v.status.as_str())) }
            td { (v.current_period_end.map(|d| d.to_string()).unwrap_or_default()) }
        }
    }
}

/// Whether `event` may happen to a subscription that is `status` (the
/// state machine's table): the buttons a page offers.
fn may(status: SubscriptionStatus, event: SubscriptionEvent) -> bool {
    billing_subscription::next(status, event).is_ok()
}

fn no_subscription(_: &'static str, raw: &str) -> Stop {
    fail(billing_customers::BillingError::NotFound {
        what: "subscription",
        named: raw.to_owned(),
    })
}

pub async fn subscription_page(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<SubscriptionId>,
    RawQuery(raw): RawQuery,
) -> Page {
    let nav = nav(&state, &signed, "billing").await?;
    if let Some(page) = entitled(&state, &nav, &signed, "Subscription").await? {
        return Ok(html(StatusCode::OK, page));
    }
    let id = id.get_or(no_subscription)?;
    let s = lifecycle::get(&state, &signed.tenant, &id)
        .await
        .map_err(fail)?;
    let filters = invoice_view::Filters {
        subscription_id: Some(id.clone()),
        ..invoice_view::Filters::default()
    };
    let first = PageRequest {
        page: 1,
        limit: crate::PAGE,
    };
    let (invoices, total) = invoice_view::list(&state, &signed.tenant, first, &filters)
        .await
        .map_err(fail)?;
    let ids: Vec<BillingInvoiceId> = invoices.iter().map(|i| i.id.clone()).collect();
    let rows = billing_timeline(
        &state,
        BillingTimeline::Subscription(&id),
        &ids,
        std::slice::from_ref(&id),
        TIMELINE,
    )
    .await
    .map_err(fail)?;
    let q = query(&raw);
    let notice = match q.get("done").map(String::as_str) {
        Some("pause") => Some("The subscription is paused."),
        Some("resume") => Some("The subscription is resumed."),
        Some("cancel") => Some("The subscription is cancelled."),
        Some("change-plan") => Some("The plan change is made."),
        Some("quantity") => Some("The seats are changed."),
        _ => None,
    };
    let discount = shared::domain::billing::discounts::active(&state, &id)
        .await
        .map_err(fail)?;
    let act = signed.allows(Action::ChangeRecords);
    let targets = if act {
        crate::billing_changes::targets(&state, &s).await?
    } else {
        Vec::new()
    };
    let usage_panels = crate::usage::panels(&state, &s).await.map_err(fail)?;
    let v = SubscriptionView::of(&s);
    let path = format!("/dashboard/billing/subscriptions/{}", v.id);
    let body = markup! {
        (tabs("subscriptions"))
        @if let Some(n) = notice { p.notice role="status" { (n) } }
        div.panel {
            dl.facts {
                dt { "Subscription" } dd { (v.id) }
                dt { "Status" } dd { (status_badge(v.status.as_str())) }
                dt { "Customer" } dd { a href={ "/dashboard/billing/customers/" (v.customer_id) } { (v.customer_id) } }
                dt { "Plan" } dd { a href={ "/dashboard/billing/plans/" (v.plan_id) } { (v.plan.name) } }
                dt { "Terms" } dd {
                    (rupees(v.plan.amount)) " every "
                    @if v.plan.interval_count != 1 { (v.plan.interval_count) " × " }
                    (label(&v.plan.interval_unit)) " (" (label(&v.plan.calendar)) " calendar)"
                }
                dt { "Started" } dd { (v.start_date) }
                dt { "Trial ends" } dd { (v.trial_ends_at.map(when).unwrap_or_else(|| "—".into())) }
                dt { "Current period" } dd {
                    @match (v.current_period_start, v.current_period_end) {
                        (Some(a), Some(b)) => { (a) " to " (b) " (exclusive)" }
                        _ => { "—" }
                    }
                }
                @if v.cancel_at_period_end { dt { "Cancels" } dd { "at the end of the period" } }
                @if let Some(r) = &v.cancel_reason { dt { "Cancel reason" } dd { (r) } }
                @if let Some(t) = v.cancelled_at { dt { "Cancelled" } dd { (when(t)) } }
                @if let Some(r) = &v.pause_reason { dt { "Pause reason" } dd { (r) } }
                @if let Some(t) = v.resume_at { dt { "Resumes" } dd { (when(t)) } }
                dt { "Discount" } dd {
                    @match &discount {
                        Some(d) => {
                            (d.coupon_code) " (" (d.name) "): "
                            @match (d.terms.percent_off, d.terms.amount_off) {
                                (Some(p), _) => { (p) "% off" }
                                (_, Some(a)) => { (rupees(a)) " off" }
                                _ => { "—" }
                            }
                            @match d.cycles_left {
                                Some(n) => { ", " (n) " more invoice" @if n != 1 { "s" } }
                                None => { ", every invoice" }
                            }
                            @if let Some(code) = &d.promotion_code { ", code " (code) }
                        }
                        None => { "none" }
                    }
                }
                dt { "Seats" } dd { (v.quantity) }
                (crate::billing_changes::pending(&s))
                dt { "Created" } dd { (when(v.created_at)) }
            }
        }
        @if act {
            div.panel.actions {
                @if may(s.status, SubscriptionEvent::Pause) {
                    form method="post" action={ (path) "/pause" } {
                        input type="hidden" name="csrf" value=(nav.csrf);
                        label for="pause_reason" { "Reason (optional) " }
                        input id="pause_reason" name="reason" maxlength="500";
                        " " button type="submit" { "Pause" }
                    }
                }
                @if may(s.status, SubscriptionEvent::Resume) {
                    form method="post" action={ (path) "/resume" } {
                        input type="hidden" name="csrf" value=(nav.csrf);
                        button type="submit" { "Resume" }
                    }
                }
                @if may(s.status, SubscriptionEvent::CancelNow) {
                    form method="post" action={ (path) "/cancel" } {
                        input type="hidden" name="csrf" value=(nav.csrf);
                        label for="cancel_reason" { "Reason (optional) " }
                        input id="cancel_reason" name="reason" maxlength="500";
                        " " label { input type="checkbox" name="at_period_end" value="true"; " at the end of the period" }
                        " " button type="submit" { "Cancel subscription" }
                    }
                }
            }
        }
        @if act { (crate::billing_changes::forms(&s, &targets, &nav.csrf)) }
        (usage_panels)
        h2 { "Invoices" }
        p.muted { (total) " invoices, newest first." }
        div.panel {
            @if invoices.is_empty() { p { "No invoices yet." } } @else {
                table { (invoice_head()) tbody { @for i in &invoices { (invoice_row(i)) } } }
            }
        }
        h2 #timeline { "Timeline" }
        p.muted { "Its events (webhooks) and its invoices' reminders and dunning, each channel with its outcome, newest first." }
        (timeline_panel(&rows, None))
        p { a href="/dashboard/billing/subscriptions" { "← Subscriptions" } }
    };
    Ok(html(StatusCode::OK, layout(&nav, &v.id, body)))
}

/// What a subscription's form does.
#[derive(Clone, Copy)]
enum Change {
    Pause,
    Resume,
    Cancel,
}

impl Change {
    fn name(self) -> &'static str {
        match self {
            Change::Pause => "pause",
            Change::Resume => "resume",
            Change::Cancel => "cancel",
        }
    }
}

async fn change_subscription(
    state: AppState,
    signed: Signed,
    id: PathId<SubscriptionId>,
    body: Bytes,
    change: Change,
) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let id = id.get_or(no_subscription)?;
    // Its tenant's: another merchant's id is a 404 before any audit entry.
    lifecycle::get(&state, &signed.tenant, &id)
        .await
        .map_err(fail)?;
    let reason = f
        .get("reason")
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty());
    let at_period_end = f.get("at_period_end").is_some_and(|v| v == "true");
    let detail = match change {
        Change::Cancel if at_period_end => format!(
            "at period end{}",
            reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
        _ => reason.clone().unwrap_or_default(),
    };
    audit(
        &state,
        &signed,
        &format!("subscription.{}", change.name()),
        &id,
        &detail,
    )
    .await?;
    let done = match change {
        Change::Pause => {
            let body = PauseSubscription {
                pause_reason: reason,
                resume_at: None,
            };
            lifecycle::pause(&state, &signed.tenant, &id, body).await
        }
        Change::Resume => lifecycle::resume(&state, &signed.tenant, &id).await,
        Change::Cancel => {
            let body = CancelSubscription {
                cancel_reason: reason,
                at_period_end: Some(at_period_end),
            };
            lifecycle::cancel(&state, &signed.tenant, &id, body).await
        }
    };
    done.map_err(fail)?;
    Ok(see_other(&format!(
        "/dashboard/billing/subscriptions/{id}?done={}",
        change.name()
    )))
}

pub async fn pause_subscription(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<SubscriptionId>,
    body: Bytes,
) -> Page {
    change_subscription(state, signed, id, body, Change::Pause).await
}

pub async fn resume_subscription(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<SubscriptionId>,
    body: Bytes,
) -> Page {
    change_subscription(state, signed, id, body, Change::Resume).await
}

pub async fn cancel_subscription(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<SubscriptionId>,
    body: Bytes,
) -> Page {
    change_subscription(state, signed, id, body, Change::Cancel).await
}

// ---------------------------------------------------------------------------
// Billing invoices.

fn invoice_head() -> Markup {
    markup! {
        thead { tr {
            th scope="col" { "Invoice" } th scope="col" { "Customer" } th.num scope="col" { "Amount due" }
            th scope="col" { "Status" } th scope="col" { "Due" } th scope="col" { "Period" }
        } }
    }
}

fn invoice_row(i: &BillingInvoice) -> Markup {
    markup! {
        tr {
            td { a href={ "/dashboard/billing/invoices/" (i.id) } { (i.number) } br; span.muted { (i.id) } }
            td { a href={ "/dashboard/billing/customers/" (i.customer_id) } { (i.customer_id) } }
            td.num { (rupees(i.amount_due)) }
            td { (status_badge(i.status.as_str())) }
            td { (i.due_date) }
            td { (i.period_start) " to " (i.period_end) }
        }
    }
}

pub async fn invoices_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    let nav = nav(&state, &signed, "billing").await?;
    if let Some(page) = entitled(&state, &nav, &signed, "Billing invoices").await? {
        return Ok(html(StatusCode::OK, page));
    }
    let q = query(&raw);
    let page = deep_page_of(&q);
    let status = param(&q, "status");
    let filters = invoice_view::Filters::parse(status, None, None, None).map_err(fail)?;
    let (list, total) = invoice_view::list(&state, &signed.tenant, page, &filters)
        .await
        .map_err(fail)?;
    let body = markup! {
        (tabs("invoices"))
        form method="get" action="/dashboard/billing/invoices" {
            label for="status" { "Status " }
            select id="status" name="status" {
                option value="" { "any" }
                @for s in InvoiceStatus::ALL {
                    option value=(s.as_str()) selected[status == Some(s.as_str())] { (s.as_str()) }
                }
            }
            " " button type="submit" { "Filter" }
        }
        p.muted { (total) " invoices." }
        div.panel {
            @if list.is_empty() { p { "No invoices." } } @else {
                table { (invoice_head()) tbody { @for i in &list { (invoice_row(i)) } } }
            }
        }
        (pager("/dashboard/billing/invoices", &keep("status", status), &page, list.len(), total))
    };
    Ok(html(StatusCode::OK, layout(&nav, "Billing invoices", body)))
}

fn no_invoice(_: &'static str, raw: &str) -> Stop {
    fail(billing_customers::BillingError::NotFound {
        what: "billing invoice",
        named: raw.to_owned(),
    })
}

/// A day with its Miti (`2082-08-13 (2082 Mangsir 27)`).
fn day(d: &invoice_view::Day) -> String {
    match &d.bs {
        Some(bs) => format!("{} (Miti {bs})", d.ad),
        None => d.ad.clone(),
    }
}

fn payment_line(p: &invoice_view::PaymentView) -> Markup {
    markup! {
        (rupees(p.amount)) " · " (p.method)
        @if let Some(id) = &p.payment_id { " · " a href={ "/dashboard/payments/" (id) } { (id) } }
        @if let Some(on) = &p.received_on { " · received " (on) }
        @if let Some(r) = &p.reference { " · ref. " (r) }
        " · recorded " (when(p.at))
    }
}

/// Whether an invoice can still be voided or paid (open or overdue).
fn collectible(status: InvoiceStatus) -> bool {
    matches!(status, InvoiceStatus::Open | InvoiceStatus::Overdue)
}

async fn invoice_view_page(
    state: &AppState,
    signed: &Signed,
    id: &BillingInvoiceId,
    notice: Option<&str>,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let nav = nav(state, signed, "billing").await?;
    if let Some(page) = entitled(state, &nav, signed, "Billing invoice").await? {
        return Ok(html(StatusCode::OK, page));
    }
    let inv = billing_invoice::get_invoice(state, &signed.tenant, id)
        .await
        .map_err(fail)?;
    let v = InvoiceView::of(&inv, &state.config.public_base_url);
    // Its reminders (SMS and email, each with its outcome) and dunning.
    let dunning = shared::domain::billing::dunning_api::invoice_dunning(state, &signed.tenant, id)
        .await
        .map_err(fail)?;
    let act = signed.allows(Action::ChangeRecords) && collectible(inv.status);
    let today = calendar::nepal_day(state.clock.now());
    let path = format!("/dashboard/billing/invoices/{}", v.id);
    let body = markup! {
        (tabs("invoices"))
        @if let Some(n) = notice { p.notice role="status" { (n) } }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        div.panel {
            dl.facts {
                dt { "Invoice" } dd { (v.number) " " span.muted { (v.id) } }
                dt { "Status" } dd { (status_badge(v.status.as_str())) }
                dt { "Customer" } dd { a href={ "/dashboard/billing/customers/" (v.customer_id) } { (v.customer_id) } }
                dt { "Subscription" } dd { a href={ "/dashboard/billing/subscriptions/" (v.subscription_id) } { (v.subscription_id) } }
                dt { "Period" } dd { (v.period_start) " to " (v.period_end) " (exclusive)" }
                dt { "Due" } dd { (day(&v.due)) }
                dt { "Overdue from" } dd { (v.overdue_on) }
                dt { "Amount" } dd { (rupees(v.amount)) }
                dt { "Amount due" } dd { (rupees(v.amount_due)) }
                dt { "Amount paid" } dd { (rupees(v.amount_paid)) }
                dt { "Payment" } dd {
                    @if let Some(p) = &v.payment { (payment_line(p)) } @else { "—" }
                }
                dt { "Pay link" } dd { a href=(v.pay_url) { (v.pay_url) } }
                dt { "Issued" } dd { (when(v.issued_at)) }
                @if let Some(t) = v.voided_at { dt { "Voided" } dd { (when(t)) } }
            }
        }
        div.panel {
            table {
                thead { tr { th scope="col" { "Line" } th.num scope="col" { "Qty" } th scope="col" { "Period" } th.num scope="col" { "Amount" } } }
                tbody {
                    @for l in &v.lines {
                        tr { td { (l.description) } td.num { (l.quantity) } td { (l.period_start) " to " (l.period_end) } td.num { (rupees(l.amount)) } }
                    }
                }
            }
        }
        h2 { "Reminders" }
        div.panel #reminders {
            p.muted { "Dunning: " (dunning.status) }
            @if dunning.reminders.is_empty() {
                p.muted { "None sent yet." }
            } @else {
                table {
                    thead { tr { th scope="col" { "When" } th scope="col" { "Reminder" } th scope="col" { "Channel" } th scope="col" { "Outcome" } } }
                    tbody {
                        @for r in &dunning.reminders {
                            tr {
                                td { (when(r.at)) }
                                td { (label(&r.kind)) }
                                td { (label(&r.channel)) }
                                td { (status_badge(&label(&r.outcome))) }
                            }
                        }
                    }
                }
            }
        }
        @if !v.overpayments.is_empty() {
            h2 { "Overpayments" }
            div.panel {
                table {
                    thead { tr { th scope="col" { "Payment" } th scope="col" { "Refund" } } }
                    tbody {
                        @for o in &v.overpayments {
                            tr {
                                td { (payment_line(&o.payment)) }
                                td { (status_badge(&label(&o.refund_status))) @if let Some(r) = &o.refund_id { " " span.muted { (r) } } }
                            }
                        }
                    }
                }
            }
        }
        @if act {
            div.panel.actions {
                h2 { "Record a payment received outside" }
                form method="post" action={ (path) "/record-payment" } {
                    input type="hidden" name="csrf" value=(nav.csrf);
                    p { "The full amount due, " (rupees(v.amount_due)) ", received in:" }
                    label for="method" { "Method " }
                    select id="method" name="method" {
                        option value="cash" { "cash" }
                        option value="bank_deposit" { "bank_deposit" }
                    }
                    " " label for="received_on" { "Received on " }
                    input id="received_on" name="received_on" type="date" required max=(today.to_string()) value=(today.to_string());
                    " " label for="reference" { "Reference " }
                    input id="reference" name="reference" required maxlength=(MAX_REFERENCE);
                    " " button type="submit" { "Record payment" }
                }
                form method="post" action={ (path) "/void" } {
                    input type="hidden" name="csrf" value=(nav.csrf);
                    button type="submit" { "Void" }
                }
            }
        }
        p { a href="/dashboard/billing/invoices" { "← Billing invoices" } }
    };
    Ok(html(status, layout(&nav, &v.number, body)))
}

pub async fn invoice_page(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<BillingInvoiceId>,
    RawQuery(raw): RawQuery,
) -> Page {
    let id = id.get_or(no_invoice)?;
    let q = query(&raw);
    let notice = match q.get("done").map(String::as_str) {
        Some("void") => Some("The invoice is void."),
        Some("paid") => Some("The payment is recorded: the invoice is paid."),
        Some("overpaid") => Some(
            "The invoice was paid already: the payment is recorded as an overpayment, to return by hand.",
        ),
        _ => None,
    };
    invoice_view_page(&state, &signed, &id, notice, None, StatusCode::OK).await
}

pub async fn void_invoice(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<BillingInvoiceId>,
    body: Bytes,
) -> Page {
    signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let id = id.get_or(no_invoice)?;
    let inv = billing_invoice::get_invoice(&state, &signed.tenant, &id)
        .await
        .map_err(fail)?;
    audit(&state, &signed, "billing_invoice.void", &id, &inv.number).await?;
    billing_invoice::void(&state, &signed.tenant, &id, state.clock.now())
        .await
        .map_err(fail)?;
    Ok(see_other(&format!(
        "/dashboard/billing/invoices/{id}?done=void"
    )))
}

/// The longest reference of a payment received outside.
const MAX_REFERENCE: usize = 100;

/// A payment received outside, from its form; an error names the field.
fn out_of_band(
    f: &std::collections::HashMap<String, String>,
    today: NaiveDate,
) -> Result<(OutOfBandMethod, NaiveDate, String), String> {
    let method = match f.get("method").map(String::as_str) {
        Some("cash") => OutOfBandMethod::Cash,
        Some("bank_deposit") => OutOfBandMethod::BankDeposit,
        _ => return Err("Method: choose cash or bank_deposit".into()),
    };
    let on = f.get("received_on").map(|s| s.trim()).unwrap_or("");
    let on = NaiveDate::parse_from_str(on, "%Y-%m-%d")
        .map_err(|_| "Received on: a date, YYYY-MM-DD".to_owned())?;
    if on > today {
        return Err("Received on: not after today (in Nepal)".into());
    }
    let reference = f.get("reference").map(|s| s.trim()).unwrap_or("");
    if reference.is_empty() {
        return Err(
            "Reference: say what identifies the payment (a receipt or deposit slip number)".into(),
        );
    }
    if reference.chars().count() > MAX_REFERENCE || reference.chars().any(char::is_control) {
        return Err(format!(
            "Reference: at most {MAX_REFERENCE} characters on one line"
        ));
    }
    Ok((method, on, reference.to_owned()))
}

pub async fn record_payment(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<BillingInvoiceId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let id = id.get_or(no_invoice)?;
    let inv = billing_invoice::get_invoice(&state, &signed.tenant, &id)
        .await
        .map_err(fail)?;
    let now = state.clock.now();
    let (method, received_on, reference) = match out_of_band(&f, calendar::nepal_day(now)) {
        Ok(p) => p,
        Err(e) => {
            return invoice_view_page(
                &state,
                &signed,
                &id,
                None,
                Some(&e),
                StatusCode::BAD_REQUEST,
            )
            .await;
        }
    };
    if !collectible(inv.status) {
        let e = format!(
            "The invoice is {}: only an open or overdue invoice takes a payment here.",
            inv.status.as_str()
        );
        return invoice_view_page(&state, &signed, &id, None, Some(&e), StatusCode::CONFLICT).await;
    }
    let detail = format!(
        "{} {} received {received_on}, ref. {reference}, by {}",
        label(&method),
        rupees(inv.amount_due),
        signed.user.email
    );
    audit(
        &state,
        &signed,
        "billing_invoice.record_payment",
        &id,
        &detail,
    )
    .await?;
    let payment = OutOfBand {
        method,
        received_on,
        reference,
        recorded_by: signed.user.id.clone(),
        amount: inv.amount_due,
    };
    let done = match billing_invoice::record_out_of_band_payment(
        &state,
        &signed.tenant,
        &id,
        payment,
        now,
    )
    .await
    .map_err(fail)?
    {
        PayOutcome::Paid(_) | PayOutcome::AlreadyPaid(_) => "paid",
        PayOutcome::Overpayment(_) => "overpaid",
    };
    Ok(see_other(&format!(
        "/dashboard/billing/invoices/{id}?done={done}"
    )))
}
