//! The dashboard's HTML (maud: every value escaped). One layout: a header
//! with the merchant switcher (for a person of several), the project and
//! sandbox/live switch and the person signed in, a
//! navigation of the pages the role may see, a main landmark. No script.

use maud::{DOCTYPE, Markup, html};
use serde::Serialize;
use shared::domain::Mode;
use shared::domain::account::{ApiKey, KeyKind, Scope};
use shared::domain::analytics::{DayFigures, Overview};
use shared::domain::dashboard::{Action, AuditEntry, Role, allows};
use shared::domain::outbox::TimelineEntry;
use shared::domain::payments::{AttemptInfo, Checks, PaymentView};
use shared::domain::refunds::Refund;
use shared::domain::webhooks::Delivery;
use shared::money::Paisa;
use shared::time::Timestamp;

/// What every signed-in page's header shows.
pub struct Nav {
    pub email: String,
    pub role: Role,
    pub csrf: String,
    pub project_id: String,
    pub mode: Mode,
    /// (id, name) of the merchant's projects.
    pub projects: Vec<(String, String)>,
    /// The page shown (`overview`, `payments`, `audit`).
    pub current: &'static str,
    /// A notice shown once, above the page (failed sign-ins since the
    /// last one).
    pub alert: Option<String>,
    /// The merchant the session looks at.
    pub merchant_id: String,
    /// (id, "name (role)") of the merchants the person may switch to;
    /// empty when they belong to one only.
    pub merchants: Vec<(String, String)>,
}

/// The pages, their paths and who sees them in the navigation.
const PAGES: [(&str, &str, &str, Action); 14] = [
    ("overview", "/dashboard", "Overview", Action::ReadRecords),
    (
        "payments",
        "/dashboard/payments",
        "Payments",
        Action::ReadRecords,
    ),
    (
        "refunds",
        "/dashboard/refunds",
        "Refunds",
        Action::ReadRecords,
    ),
    ("links", "/dashboard/links", "Links", Action::ReadRecords),
    (
        "invoices",
        "/dashboard/invoices",
        "Invoices",
        Action::ReadRecords,
    ),
    (
        "webhooks",
        "/dashboard/webhooks",
        "Webhooks",
        Action::Webhooks,
    ),
    ("keys", "/dashboard/keys", "API keys", Action::ReadKeys),
    (
        "credentials",
        "/dashboard/credentials",
        "Credentials",
        Action::ReadCredentials,
    ),
    (
        "billing",
        "/dashboard/billing/customers",
        "Billing",
        Action::ReadRecords,
    ),
    ("sms", "/dashboard/sms", "SMS", Action::ReadRecords),
    (
        "reconciliation",
        crate::reconciliation::PATH,
        "Reconciliation",
        Action::ReadRecords,
    ),
    (
        "exports",
        crate::exports::PATH,
        "Exports",
        Action::ReadRecords,
    ),
    ("people", "/dashboard/people", "People", Action::People),
    ("audit", "/dashboard/audit", "Audit log", Action::Audit),
];

/// An amount in paisa as people read it (`NPR 1,234.50`).
pub fn rupees(paisa: i64) -> String {
    Paisa::new(paisa)
        .map(|p| p.display_npr())
        .unwrap_or_else(|_| format!("{paisa} paisa"))
}

/// The lowercase name serde gives a value (a status, a provider).
pub(crate) fn label<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

/// The pages a list of `total` takes (at least one).
pub(crate) fn pages_of(total: u64) -> usize {
    usize::try_from(total)
        .unwrap_or(usize::MAX)
        .div_ceil(crate::PAGE)
        .max(1)
}

/// A time as people read it: `2026-11-26 10:03 UTC`.
pub(crate) fn when(t: Timestamp) -> String {
    t.datetime().format("%Y-%m-%d %H:%M UTC").to_string()
}

fn head(title: &str) -> Markup {
    html! {
        meta charset="utf-8";
        meta name="viewport" content="width=device-width,initial-scale=1";
        meta name="robots" content="noindex";
        title { (title) " · Dhukuti dashboard" }
        link rel="stylesheet" href="/dashboard/assets/dashboard.css";
    }
}

/// A whole signed-in page.
pub(crate) fn layout(nav: &Nav, title: &str, body: Markup) -> String {
    let sandbox = nav.mode == Mode::Sandbox;
    html! {
        (DOCTYPE)
        html lang="en" {
            head { (head(title)) }
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    span.brand { "Dhukuti" }
                    @if !nav.merchants.is_empty() {
                        form method="post" action="/dashboard/switch" {
                            input type="hidden" name="csrf" value=(nav.csrf);
                            label for="merchant" { "Merchant" }
                            select id="merchant" name="merchant" {
                                @for (id, name) in &nav.merchants {
                                    option value=(id) selected[*id == nav.merchant_id] { (name) }
                                }
                            }
                            button type="submit" { "Switch merchant" }
                        }
                    }
                    form method="post" action="/dashboard/view" {
                        input type="hidden" name="csrf" value=(nav.csrf);
                        input type="hidden" name="back" value=(PAGES.iter().find(|p| p.0 == nav.current).map(|p| p.1).unwrap_or("/dashboard"));
                        label for="project" { "Project" }
                        select id="project" name="project" {
                            @for (id, name) in &nav.projects {
                                option value=(id) selected[*id == nav.project_id] { (name) }
                            }
                        }
                        label for="mode" { "Mode" }
                        select id="mode" name="mode" {
                            option value="sandbox" selected[sandbox] { "Sandbox" }
                            option value="live" selected[!sandbox] { "Live" }
                        }
                        button type="submit" { "Switch" }
                    }
                    span {
                        (nav.email) " (" (nav.role.as_str()) ") "
                        form method="post" action="/dashboard/sign-out" {
                            input type="hidden" name="csrf" value=(nav.csrf);
                            button.link type="submit" { "Sign out" }
                        }
                    }
                }
                @if sandbox {
                    p.sandbox { "Sandbox: test payments, no real money." }
                }
                nav.main aria-label="Dashboard" {
                    @for (key, path, name, needs) in PAGES {
                        @if allows(nav.role, needs, nav.mode) {
                            @if key == nav.current {
                                a href=(path) aria-current="page" { (name) }
                            } @else {
                                a href=(path) { (name) }
                            }
                        }
                    }
                }
                main id="main" {
                    @if let Some(alert) = &nav.alert {
                        p.notice.alert role="alert" { (alert) }
                    }
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
    .into_string()
}

/// A page with one message (errors, refusals, limits).
pub fn message(title: &str, text: &str) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { (head(title)) }
            body {
                main id="main" .signin {
                    h1 { (title) }
                    p { (text) }
                    p { a href="/dashboard" { "Back to the dashboard" } }
                }
            }
        }
    }
    .into_string()
}

/// A signed-out page with `body` (the invitation's form).
pub fn bare(title: &str, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { (head(title)) }
            body { (body) }
        }
    }
    .into_string()
}

/// The sign-in form.
pub fn sign_in(csrf: &str, next: &str, error: Option<&str>, email: &str) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { (head("Sign in")) }
            body {
                main id="main" .signin {
                    h1 { "Sign in to Dhukuti" }
                    @if let Some(e) = error {
                        p.error role="alert" { (e) }
                    }
                    form.stack method="post" action="/dashboard/sign-in" {
                        input type="hidden" name="csrf" value=(csrf);
                        input type="hidden" name="next" value=(next);
                        label for="email" { "Email" }
                        input id="email" type="email" name="email" value=(email)
                            autocomplete="username" required maxlength="254";
                        label for="password" { "Password" }
                        input id="password" type="password" name="password"
                            autocomplete="current-password" required maxlength="256";
                        button.primary type="submit" { "Sign in" }
                    }
                }
            }
        }
    }
    .into_string()
}

/// The overview: the last 30 days' figures and the chart of each day's
/// volume.
pub fn overview(nav: &Nav, o: &Overview, series: &[DayFigures]) -> String {
    let p = &o.payments;
    let f = &o.funnel;
    let body = html! {
        p.muted { "The last " (o.window.days) " days, " (when(o.window.start)) " to now." }
        div.cards {
            div.card { div.n { (rupees(p.success_volume_paisa)) } div.l { "Collected" } }
            div.card { div.n { (p.success) } div.l { "Successful payments" } }
            div.card { div.n { (format!("{:.0}%", p.success_rate * 100.0)) } div.l { "Success rate" } }
            div.card { div.n { (f.sessions_created) } div.l { "Checkouts opened" } }
            div.card { div.n { (format!("{:.0}%", f.conversion_rate_initiated_to_paid * 100.0)) } div.l { "Started checkouts paid" } }
        }
        section.panel.chart aria-labelledby="chart-title" {
            h2 id="chart-title" { "Collected per day" }
            (crate::chart::bars(series))
            details {
                summary { "The same figures as a table" }
                table {
                    thead { tr { th scope="col" { "Day" } th.num scope="col" { "Payments" } th.num scope="col" { "Collected" } } }
                    tbody {
                        @for d in series {
                            tr { td { (d.day) } td.num { (d.success) } td.num { (rupees(d.success_volume_paisa)) } }
                        }
                    }
                }
            }
        }
        section.panel aria-labelledby="providers-title" {
            h2 id="providers-title" { "By provider" }
            @if o.by_provider.is_empty() {
                p.muted { "No payments in this window yet." }
            } @else {
                table {
                    thead { tr { th scope="col" { "Provider" } th.num scope="col" { "Payments" } th.num scope="col" { "Successful" } th.num scope="col" { "Collected" } } }
                    tbody {
                        @for b in &o.by_provider {
                            tr {
                                td { (label(&b.provider)) }
                                td.num { (b.count) }
                                td.num { (b.success_count) }
                                td.num { (rupees(b.success_volume_paisa)) }
                            }
                        }
                    }
                }
            }
        }
        form method="post" action="/dashboard/sign-out-everywhere" {
            input type="hidden" name="csrf" value=(nav.csrf);
            button.primary type="submit" { "Sign out on every device" }
        }
    };
    layout(nav, "Overview", body)
}

pub(crate) fn status_badge(status: &str) -> Markup {
    html! { span class={ "status " (status) } { (status) } }
}

/// A page of payments, newest first.
/// The statuses and providers a payments list may be narrowed to.
const STATUSES: [&str; 6] = [
    "pending",
    "processing",
    "success",
    "failed",
    "refunded",
    "cancelled",
];
const PROVIDERS: [&str; 3] = ["esewa", "khalti", "fonepay"];

/// A page of payments, newest first, narrowed by `status` and `provider`
/// (empty: any).
pub fn payments(
    nav: &Nav,
    list: &[PaymentView],
    place: &crate::Place,
    total: u64,
    status: &str,
    provider: &str,
) -> String {
    let pages = pages_of(total);
    let mut path = "/dashboard/payments".to_owned();
    let filters: Vec<String> = [("status", status), ("provider", provider)]
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !filters.is_empty() {
        path = format!("{path}?{}", filters.join("&"));
    }
    let body = html! {
        form.filters method="get" action="/dashboard/payments" {
            label for="status" { "Status" } " "
            select id="status" name="status" {
                option value="" { "any" }
                @for s in STATUSES { option value=(s) selected[s == status] { (s) } }
            }
            " "
            label for="provider" { "Provider" } " "
            select id="provider" name="provider" {
                option value="" { "any" }
                @for p in PROVIDERS { option value=(p) selected[p == provider] { (p) } }
            }
            " "
            button type="submit" { "Show" }
        }
        p.muted { (total) " payments. Page " (place.page) " of " (pages.max(place.page)) "." }
        (crate::exports::button("payments", None))
        div.panel {
            @if list.is_empty() {
                p { "No payments yet." }
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "Payment" }
                        th scope="col" { "Status" }
                        th scope="col" { "Provider" }
                        th.num scope="col" { "Amount" }
                        th scope="col" { "Created" }
                    } }
                    tbody {
                        @for p in list {
                            tr {
                                td { a href={ "/dashboard/payments/" (p.id) } { (p.id) } }
                                td { (status_badge(&label(&p.status))) }
                                td { (label(&p.provider)) }
                                td.num { (p.amount.display_npr()) }
                                td { (when(p.created_at)) }
                            }
                        }
                    }
                }
            }
        }
        (places(
            &path,
            place,
            list.first().map(|p| p.id.as_str()),
            list.last().map(|p| p.id.as_str()),
            list.len() >= crate::PAGE,
        ))
    };
    layout(nav, "Payments", body)
}

/// Links to the newer and older page of `path` (which may carry a query
/// of its own: the list's filters).
pub(crate) fn pager(path: &str, page: usize, pages: usize) -> Markup {
    let join = if path.contains('?') { '&' } else { '?' };
    html! {
        nav.pager aria-label="Pages" {
            @if page > 1 {
                a href={ (path) (join) "page=" (page - 1) } rel="prev" { "← Newer" }
            } @else { span {} }
            @if page < pages {
                a href={ (path) (join) "page=" (page + 1) } rel="next" { "Older →" }
            }
        }
    }
}

/// Links to the newer and older page of a record list by the records
/// this page shows (`first` and `last`): each is one ranged read however
/// deep, so every record is reachable. `full`: the page may have more
/// after it. `path` may carry the list's filters.
pub(crate) fn places(
    path: &str,
    place: &crate::Place,
    first: Option<&str>,
    last: Option<&str>,
    full: bool,
) -> Markup {
    let join = if path.contains('?') { '&' } else { '?' };
    let newer = match (place.page, first) {
        (1, _) => None,
        // The newest page is the list itself.
        (2, _) | (_, None) => Some(path.to_owned()),
        (n, Some(id)) => Some(format!("{path}{join}before={id}&page={}", n - 1)),
    };
    let older = last
        .filter(|_| full)
        .map(|id| format!("{path}{join}after={id}&page={}", place.page + 1));
    html! {
        nav.pager aria-label="Pages" {
            @if let Some(href) = newer {
                a href=(href) rel="prev" { "← Newer" }
            } @else { span {} }
            @if let Some(href) = older {
                a href=(href) rel="next" { "Older →" }
            }
        }
    }
}

/// What a payment page says above its facts, and whether it offers the
/// refund form (its one-time token).
pub struct Notes<'a> {
    pub notice: Option<&'a str>,
    pub error: Option<&'a str>,
    pub refund_form: Option<&'a str>,
}

fn refund_status(r: &Refund) -> Markup {
    html! {
        (status_badge(r.status.as_str()))
        @if let Some(why) = &r.failure_reason {
            br; span.muted { (why) }
        }
    }
}

/// The refund form of a payment that can still be refunded: the amount
/// left (Fonepay: the whole amount, fixed), a reason, notes.
fn refund_form(nav: &Nav, p: &PaymentView, left: i64, nonce: &str) -> Markup {
    let fonepay = label(&p.provider) == "fonepay";
    let amount = format!("{}.{:02}", left / 100, left % 100);
    html! {
        section.panel aria-labelledby="refund-title" {
            h2 id="refund-title" { "Refund" }
            @if fonepay {
                p.muted { "Fonepay has no refund API: the full amount is recorded here, and you refund it in the Fonepay merchant portal." }
            }
            form.stack method="post" action={ "/dashboard/payments/" (p.id) "/refund" } {
                input type="hidden" name="csrf" value=(nav.csrf);
                input type="hidden" name="nonce" value=(nonce);
                label for="amount" { "Amount in rupees" }
                @if fonepay {
                    input id="amount" name="amount" value=(amount) readonly inputmode="decimal";
                } @else {
                    input id="amount" name="amount" value=(amount) required inputmode="decimal" maxlength="20";
                }
                label for="reason" { "Reason" }
                select id="reason" name="reason" {
                    option value="customer_request" { "The customer asked" }
                    option value="duplicate" { "Paid twice" }
                    option value="fraudulent" { "Fraud" }
                    option value="other" { "Other" }
                }
                @if label(&p.provider) == "khalti" {
                    label for="mobile" { "Customer's Khalti mobile number (needed when they paid from a bank)" }
                    input id="mobile" name="mobile" inputmode="tel" maxlength="14";
                }
                label for="notes" { "Notes (kept with the refund)" }
                textarea id="notes" name="notes" rows="3" maxlength="500" {}
                button.primary type="submit" { "Refund" }
            }
        }
    }
}

/// One payment: its facts, the provider's references and its refunds.
pub fn payment(
    nav: &Nav,
    p: &PaymentView,
    attempt: &AttemptInfo,
    checks: &Checks,
    refunds: &[Refund],
    timeline: &[TimelineRow],
    notes: Notes<'_>,
) -> String {
    // What is left: the amount less every refund not failed (processing,
    // succeeded, or waiting for the merchant's hand).
    let held: i64 = refunds
        .iter()
        .filter(|r| r.status.as_str() != "failed")
        .map(|r| r.amount.get())
        .sum();
    let left = p.amount.get() - held;
    let refundable = label(&p.status) == "success" && left > 0;
    let body = html! {
        @if let Some(n) = notes.notice {
            p.notice role="status" { (n) }
        }
        @if let Some(e) = notes.error {
            p.error role="alert" { (e) }
        }
        div.panel {
            dl.facts {
                dt { "Payment" } dd { (p.id) }
                dt { "Status" } dd { (status_badge(&label(&p.status))) }
                dt { "Amount" } dd { (p.amount.display_npr()) }
                dt { "Refunded" } dd { (p.amount_refunded.display_npr()) }
                dt { "Fee" } dd {
                    @match (p.fee, &p.fee_source) {
                        (Some(fee), Some(source)) => {
                            (fee.display_npr()) " "
                            span.muted { @if label(source) == "provider" { "(stated by the provider)" } @else { "(from your configured rate)" } }
                        }
                        _ => "—",
                    }
                }
                dt { "Net" } dd { (p.net.map(|n| n.display_npr()).unwrap_or_else(|| "—".into())) }
                dt { "Provider" } dd { (label(&p.provider)) }
                dt { "Provider's reference" } dd { (p.provider_ref.as_deref().unwrap_or("—")) }
                dt { "Our reference" } dd { (attempt.reference.as_deref().unwrap_or("—")) }
                dt { "Checkout session" } dd { (p.checkout_session_id) }
                @if let Some(reason) = &p.failure_reason {
                    dt { "Why it failed" } dd { (reason) }
                }
                dt { "Paid by" } dd { @if attempt.qr { "QR scan" } @else { "the provider's page" } }
                dt { "Last checked with the provider" } dd { (checks.checked_at.map(when).unwrap_or_else(|| "—".into())) }
                @if let Some(why) = &checks.review {
                    dt { "Held for review" } dd { (why) }
                }
                dt { "Created" } dd { (when(p.created_at)) }
                dt { "Updated" } dd { (when(p.updated_at)) }
            }
        }
        section.panel aria-labelledby="refunds-title" {
            h2 id="refunds-title" { "Refunds" }
            @if refunds.is_empty() {
                p.muted { "No refunds." }
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "Refund" }
                        th scope="col" { "Status" }
                        th.num scope="col" { "Amount" }
                        th scope="col" { "Notes" }
                        th scope="col" { "Created" }
                    } }
                    tbody {
                        @for r in refunds {
                            tr {
                                td { (r.id) }
                                td { (refund_status(r)) }
                                td.num { (r.amount.display_npr()) }
                                td { (r.notes.as_deref().unwrap_or("")) }
                                td { (when(r.created_at)) }
                            }
                        }
                    }
                }
            }
        }
        (events(timeline))
        @if let (true, Some(nonce)) = (refundable, notes.refund_form) {
            (refund_form(nav, p, left, nonce))
        }
        p { a href="/dashboard/payments" { "← All payments" } }
    };
    layout(nav, &format!("Payment {}", p.id), body)
}

/// One event of a payment's timeline, with its deliveries (`None`: the
/// reader may not see webhook endpoints nor their answers).
pub struct TimelineRow {
    pub event: TimelineEntry,
    pub deliveries: Option<Vec<Delivery>>,
}

/// A payment's events, oldest first, and where each was delivered.
fn events(timeline: &[TimelineRow]) -> Markup {
    html! {
        section.panel aria-labelledby="events-title" {
            h2 id="events-title" { "Events" }
            @if timeline.is_empty() {
                p.muted { "No events yet." }
            } @else {
                @let shown = timeline.iter().all(|r| r.deliveries.is_some());
                table {
                    thead { tr {
                        th scope="col" { "When" }
                        th scope="col" { "Event" }
                        @if shown { th scope="col" { "Deliveries" } }
                    } }
                    tbody {
                        @for row in timeline {
                            tr {
                                td { (when(row.event.created_at)) }
                                td { (row.event.event_type.as_str()) br; span.muted { (row.event.event_id) } }
                                @if let Some(deliveries) = &row.deliveries { td {
                                    @if deliveries.is_empty() {
                                        span.muted { "None: no endpoint took it (yet)." }
                                    }
                                    @for d in deliveries {
                                        a href={ "/dashboard/webhooks/" (d.endpoint_id) } { (d.endpoint_id) }
                                        " " (status_badge(&label(&d.status)))
                                        " " (d.attempts) @if d.attempts == 1 { " attempt" } @else { " attempts" }
                                        @if let Some(code) = d.response_status { ", answered " (code) }
                                        br;
                                    }
                                } }
                            }
                        }
                    }
                }
                @if timeline.len() >= crate::TIMELINE {
                    p.muted { "The first " (crate::TIMELINE) " events are shown." }
                }
            }
        }
    }
}

/// A page of refunds, newest first.
pub fn refunds(nav: &Nav, list: &[Refund], place: &crate::Place, total: u64) -> String {
    let pages = pages_of(total).max(place.page);
    let body = html! {
        p.muted { (total) " refunds. Page " (place.page) " of " (pages) "." }
        (crate::exports::button("refunds", None))
        div.panel {
            @if list.is_empty() {
                p { "No refunds yet." }
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "Refund" }
                        th scope="col" { "Payment" }
                        th scope="col" { "Status" }
                        th.num scope="col" { "Amount" }
                        th scope="col" { "Notes" }
                        th scope="col" { "Created" }
                    } }
                    tbody {
                        @for r in list {
                            tr {
                                td { (r.id) }
                                td { a href={ "/dashboard/payments/" (r.payment_id) } { (r.payment_id) } }
                                td { (refund_status(r)) }
                                td.num { (r.amount.display_npr()) }
                                td { (r.notes.as_deref().unwrap_or("")) }
                                td { (when(r.created_at)) }
                            }
                        }
                    }
                }
            }
        }
        (places(
            "/dashboard/refunds",
            place,
            list.first().map(|r| r.id.as_str()),
            list.last().map(|r| r.id.as_str()),
            list.len() >= crate::PAGE,
        ))
    };
    layout(nav, "Refunds", body)
}

fn kind_name(kind: KeyKind) -> &'static str {
    match kind {
        KeyKind::Secret => "secret",
        KeyKind::Restricted => "restricted",
        KeyKind::Publishable => "publishable",
    }
}

/// The project's keys in this mode, the form to issue one, and each
/// key's rotate and revoke forms.
pub fn keys(
    nav: &Nav,
    keys: &[ApiKey],
    (page, total): (usize, usize),
    now: Timestamp,
    nonce: &str,
    notice: Option<&str>,
    error: Option<&str>,
) -> String {
    let body = html! {
        @if let Some(n) = notice { p.notice role="status" { (n) } }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        div.panel {
            @if keys.is_empty() {
                p { "No keys in this mode yet." }
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "Key" }
                        th scope="col" { "Kind" }
                        th scope="col" { "Scopes" }
                        th scope="col" { "Spend cap" }
                        th scope="col" { "Expires" }
                        th scope="col" { "Last used" }
                        th scope="col" { "Actions" }
                    } }
                    tbody {
                        @for k in keys {
                            tr {
                                td { (k.prefix) "…" (k.hint) br; span.muted { (k.id) " " (k.description) } }
                                td { (kind_name(k.kind)) @if k.pause.is_some() { " (paused)" } }
                                td { (k.scopes.join(", ")) }
                                td { (k.spend_cap_paisa.map(rupees).unwrap_or_else(|| "—".into())) }
                                td {
                                    @match k.expires_at {
                                        Some(t) if t <= now => { "expired " (when(t)) }
                                        Some(t) => { (when(t)) }
                                        None => { "never" }
                                    }
                                }
                                td { (k.last_used_at.map(when).unwrap_or_else(|| "—".into())) }
                                td {
                                    form method="post" action={ "/dashboard/keys/" (k.id) "/rotate" } {
                                        input type="hidden" name="csrf" value=(nav.csrf);
                                        input type="hidden" name="nonce" value=(shared::domain::dashboard::new_form_nonce());
                                        label for={ "grace-" (k.id) } { "Old key works for" }
                                        " "
                                        select id={ "grace-" (k.id) } name="grace" {
                                            option value="0" { "no longer" }
                                            option value="1h" { "1 hour" }
                                            option value="24h" selected { "24 hours" }
                                            option value="7d" { "7 days" }
                                        }
                                        " "
                                        button type="submit" { "Rotate" }
                                    }
                                    form method="post" action={ "/dashboard/keys/" (k.id) "/revoke" } {
                                        input type="hidden" name="csrf" value=(nav.csrf);
                                        input type="hidden" name="nonce" value=(shared::domain::dashboard::new_form_nonce());
                                        input type="checkbox" id={ "confirm-" (k.id) } name="confirm" value="yes";
                                        " "
                                        label for={ "confirm-" (k.id) } { "I am sure" }
                                        " "
                                        button type="submit" { "Revoke" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        (pager("/dashboard/keys", page, pages_of(total as u64)))
        section.panel aria-labelledby="issue-title" {
            h2 id="issue-title" { "Issue a key" }
            form.stack method="post" action="/dashboard/keys" {
                input type="hidden" name="csrf" value=(nav.csrf);
                input type="hidden" name="nonce" value=(nonce);
                label for="kind" { "Kind" }
                select id="kind" name="kind" {
                    @if allows(nav.role, Action::IssueSecretKey, nav.mode) {
                        option value="secret" { "Secret: every scope, for your server" }
                        option value="restricted" { "Restricted: only the scopes ticked below" }
                    }
                    option value="publishable" { "Publishable: for an app, mobile endpoints only" }
                }
                @if !allows(nav.role, Action::IssueSecretKey, nav.mode) {
                    p.muted { "Only an owner can issue or rotate live secret and restricted keys; developers can in sandbox." }
                }
                label for="description" { "Description" }
                input id="description" name="description" maxlength="100";
                fieldset {
                    legend { "Scopes of a restricted key" }
                    @for scope in Scope::ALL {
                        div {
                            input type="checkbox" id={ "scope-" (scope.as_str()) } name={ "scope:" (scope.as_str()) } value="on";
                            " "
                            label for={ "scope-" (scope.as_str()) } { (scope.as_str()) }
                        }
                    }
                }
                label for="spend_cap" { "Monthly spend cap in rupees (optional)" }
                input id="spend_cap" name="spend_cap" inputmode="decimal" maxlength="20";
                label for="expires_days" { "Expires after this many days (optional)" }
                input id="expires_days" name="expires_days" inputmode="numeric" maxlength="4";
                button.primary type="submit" { "Issue key" }
            }
        }
    };
    layout(nav, "API keys", body)
}

/// A new key's secret, shown this once.
pub fn secret_once(nav: &Nav, title: &str, secret: &str, key: &ApiKey) -> String {
    let body = html! {
        p.notice role="status" {
            "Copy the key now: it is shown only this once and we keep only its hash."
        }
        div.panel {
            label for="secret" { (title) }
            input id="secret" name="secret" readonly value=(secret) size="60";
            p.muted { (key.id) " · " (kind_name(key.kind)) " · " (key.scopes.join(", ")) }
        }
        p { a href="/dashboard/keys" { "← All keys" } }
    };
    layout(nav, "Key issued", body)
}

/// A page of the audit log, newest first.
pub fn audit(nav: &Nav, entries: &[AuditEntry], next: Option<&str>) -> String {
    let body = html! {
        div.panel {
            @if entries.is_empty() {
                p { "Nothing recorded yet." }
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "When" }
                        th scope="col" { "Who" }
                        th scope="col" { "What" }
                        th scope="col" { "On" }
                        th scope="col" { "From" }
                    } }
                    tbody {
                        @for e in entries {
                            tr {
                                td { (when(e.at)) }
                                td { (e.email) }
                                td { (e.action) @if !e.detail.is_empty() { br; span.muted { (e.detail) } } }
                                td { (e.target) }
                                td { (e.address) }
                            }
                        }
                    }
                }
            }
        }
        @if let Some(cursor) = next {
            nav.pager aria-label="Pages" {
                a href={ "/dashboard/audit?before=" (form_urlencoded::byte_serialize(cursor.as_bytes()).collect::<String>()) } rel="next" { "Older →" }
            }
        }
    };
    layout(nav, "Audit log", body)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_list_takes_at_least_one_page() {
        let page = crate::PAGE as u64;
        assert_eq!(super::pages_of(0), 1);
        assert_eq!(super::pages_of(page), 1);
        assert_eq!(super::pages_of(page + 1), 2);
    }
}
