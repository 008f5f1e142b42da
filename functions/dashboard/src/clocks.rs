//! Sandbox test clocks in the dashboard (issue 39): the project's clocks,
//! a form to make one, and a clock's page: its time and status, a form
//! to advance it, and what ran (the subscriptions on the clock and their
//! invoices, those issued by the last advance marked, and the events and
//! notices the last advance made). Through the same
//! domain calls as `/v1/billing/test-clocks`: an advance answers
//! `advancing` at once, and each view of an advancing clock runs part of
//! its work (`domain::clocks`). Live mode has no clocks: the page says so.
//!
//! Making and advancing a clock take `Action::ChangeRecords` and the
//! form's CSRF token, with an audit entry first.

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use chrono::{NaiveDateTime, TimeZone, Utc};
use edge::PathId;
use edge::html::html;
use http::StatusCode;
use maud::{Markup, html as markup};
use shared::AppState;
use shared::domain::Mode;
use shared::domain::billing::customers::PageRequest;
use shared::domain::billing::invoice::BillingInvoice;
use shared::domain::billing::invoice::view as invoice_view;
use shared::domain::billing::test_clock::{self, ClockStatus, TestClock, TestClockError};
use shared::domain::clocks;
use shared::domain::dashboard::{Action, billing_timeline};
use shared::domain::outbox::BillingTimeline;
use shared::ids::{BillingInvoiceId, TestClockId};
use shared::time::Timestamp;

use crate::billing::{TIMELINE, entitled, entitled_to_change, tabs, timeline_panel};
use crate::pages::{Nav, rupees, status_badge, when};
use crate::{Page, Signed, Stop, audit, fail, nav, query, see_other};

const LIST: &str = "/dashboard/billing/test-clocks";
/// Clocks listed, subscriptions shown on a clock's page.
const SHOWN: usize = 25;

/// A time from a form: RFC 3339, or `YYYY-MM-DDTHH:MM` (a browser's
/// `datetime-local`) read as UTC.
fn time_of(raw: &str) -> Option<Timestamp> {
    let raw = raw.trim();
    Timestamp::parse(raw).or_else(|| {
        let t = NaiveDateTime::parse_from_str(raw, "%Y-%m-%dT%H:%M").ok()?;
        Some(Timestamp::from_datetime(Utc.from_utc_datetime(&t)))
    })
}

/// The page of a live session: clocks are sandbox only.
fn live_only(nav: &Nav) -> String {
    crate::pages::layout(
        nav,
        "Test clocks",
        markup! {
            (tabs("test clocks"))
            div.panel { p { "Test clocks exist in sandbox only: switch to sandbox to use them." } }
        },
    )
}

fn status_of(c: &TestClock) -> Markup {
    status_badge(match c.status {
        ClockStatus::Ready => "ready",
        ClockStatus::Advancing => "advancing",
    })
}

async fn list_page(
    state: &AppState,
    signed: &Signed,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let nav = nav(state, signed, "billing").await?;
    if let Some(page) = entitled(state, &nav, signed, "Test clocks").await? {
        return Ok(html(StatusCode::OK, page));
    }
    if signed.tenant.mode != Mode::Sandbox {
        return Ok(html(StatusCode::OK, live_only(&nav)));
    }
    let list = test_clock::list(state, &signed.tenant, SHOWN)
        .await
        .map_err(fail)?;
    let act = signed.allows(Action::ChangeRecords);
    let body = markup! {
        (tabs("test clocks"))
        p.muted { "A test clock is a frozen time that the subscriptions of its customers live by (sandbox only). Put a customer on a clock with testClockId when you create it through the API." }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        @if act {
            div.panel {
                form method="post" action=(LIST) {
                    input type="hidden" name="csrf" value=(nav.csrf);
                    label for="clock_name" { "Name " }
                    input id="clock_name" name="name" maxlength="100" required;
                    " " label for="clock_time" { "Frozen time (UTC) " }
                    input id="clock_time" name="frozen_time" type="datetime-local" required;
                    " " button type="submit" { "Create test clock" }
                }
            }
        }
        div.panel {
            @if list.is_empty() { p { "No test clocks yet." } } @else {
                table {
                    thead { tr { th scope="col" { "Clock" } th scope="col" { "Name" } th scope="col" { "Frozen time" } th scope="col" { "Status" } } }
                    tbody {
                        @for c in &list {
                            tr {
                                td { a href={ (LIST) "/" (c.id) } { (c.id) } }
                                td { (c.name) }
                                td { (when(c.frozen_time)) }
                                td { (status_of(c)) }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html(
        status,
        crate::pages::layout(&nav, "Test clocks", body),
    ))
}

pub async fn clocks_page(State(state): State<AppState>, signed: Signed) -> Page {
    list_page(&state, &signed, None, StatusCode::OK).await
}

pub async fn create_clock(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let name = f.get("name").map(|s| s.trim()).unwrap_or("");
    let Some(frozen) = f.get("frozen_time").and_then(|t| time_of(t)) else {
        let e = "Frozen time: a date and time, YYYY-MM-DDTHH:MM (UTC)";
        return list_page(&state, &signed, Some(e), StatusCode::BAD_REQUEST).await;
    };
    let now = state.clock.now();
    let clock = match test_clock::create(&state, &signed.tenant, name, frozen, now).await {
        Ok(c) => c,
        Err(e @ TestClockError::Name) => {
            let e = format!("Name: {e}");
            return list_page(&state, &signed, Some(&e), StatusCode::BAD_REQUEST).await;
        }
        Err(e) => return Err(fail(e)),
    };
    audit(
        &state,
        &signed,
        "test_clock.create",
        clock.id.as_str(),
        &format!("{} at {}", clock.name, when(clock.frozen_time)),
    )
    .await?;
    Ok(see_other(&format!("{LIST}/{}", clock.id)))
}

fn no_clock(_: &'static str, raw: &str) -> Stop {
    fail(TestClockError::NotFound(TestClockId::stored(raw)))
}

/// An invoice's row on a clock's page; `new` marks one issued by the
/// clock's last advance.
fn invoice_row(i: &BillingInvoice, new: bool) -> Markup {
    markup! {
        tr {
            td { a href={ "/dashboard/billing/invoices/" (i.id) } { (i.number) } }
            td { (i.period_start) " to " (i.period_end) }
            td.num { (rupees(i.amount_due)) }
            td { (status_badge(i.status.as_str())) }
            td { @if new { strong { "new" } } }
        }
    }
}

async fn clock_view(
    state: &AppState,
    signed: &Signed,
    id: &TestClockId,
    notice: Option<&str>,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let nav = nav(state, signed, "billing").await?;
    if let Some(page) = entitled(state, &nav, signed, "Test clock").await? {
        return Ok(html(StatusCode::OK, page));
    }
    if signed.tenant.mode != Mode::Sandbox {
        return Ok(html(StatusCode::OK, live_only(&nav)));
    }
    // Viewing an advancing clock drives it, as the API's GET does.
    let clock = clocks::get(state, &signed.tenant, id, clocks::CHUNK)
        .await
        .map_err(fail)?;
    let (subs, total, whole) = test_clock::subscriptions(state, &signed.tenant, id, SHOWN)
        .await
        .map_err(fail)?;
    let since = clock.advanced_from;
    let mut ran = Vec::new();
    for s in &subs {
        let filters = invoice_view::Filters {
            subscription_id: Some(s.id.clone()),
            ..invoice_view::Filters::default()
        };
        let first = PageRequest {
            page: 1,
            limit: crate::PAGE,
        };
        let (invoices, _) = invoice_view::list(state, &signed.tenant, first, &filters)
            .await
            .map_err(fail)?;
        // Its events and notices; after an advance, those it made.
        let ids: Vec<BillingInvoiceId> = invoices.iter().map(|i| i.id.clone()).collect();
        let mut rows = billing_timeline(
            state,
            BillingTimeline::Subscription(&s.id),
            &ids,
            std::slice::from_ref(&s.id),
            TIMELINE,
        )
        .await
        .map_err(fail)?;
        if let Some(t) = since {
            rows.retain(|r| r.at() > t);
        }
        ran.push((s, invoices, rows));
    }
    let act = signed.allows(Action::ChangeRecords) && clock.status == ClockStatus::Ready;
    let path = format!("{LIST}/{}", clock.id);
    let body = markup! {
        (tabs("test clocks"))
        @if let Some(n) = notice { p.notice role="status" { (n) } }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        div.panel {
            dl.facts {
                dt { "Test clock" } dd { (clock.id) }
                dt { "Name" } dd { (clock.name) }
                dt { "Frozen time" } dd { (when(clock.frozen_time)) }
                dt { "Status" } dd { (status_of(&clock)) }
                @if let Some(t) = since { dt { "Last advanced from" } dd { (when(t)) } }
                dt { "Created" } dd { (when(clock.created_at)) }
            }
            @if clock.status == ClockStatus::Advancing {
                p { "Everything due up to its time is running. " a href=(path) { "Reload" } " to see it finish." }
            }
        }
        @if act {
            div.panel.actions {
                form method="post" action={ (path) "/advance" } {
                    input type="hidden" name="csrf" value=(nav.csrf);
                    label for="advance_to" { "Advance to (UTC) " }
                    input id="advance_to" name="frozen_time" type="datetime-local" required;
                    " " button type="submit" { "Advance" }
                }
            }
        }
        h2 { "What ran" }
        p.muted {
            (total) " subscriptions on this clock"
            @if !whole { " among the sandbox's newest " (test_clock::CLOCK_SCAN) }
            @if let Some(t) = since { "; invoices marked new were issued since " (when(t)) }
            "."
        }
        @for (s, invoices, rows) in &ran {
            div.panel {
                p {
                    a href={ "/dashboard/billing/subscriptions/" (s.id) } { (s.id) } " "
                    (status_badge(s.status.as_str())) " · customer "
                    a href={ "/dashboard/billing/customers/" (s.customer_id) } { (s.customer_id) }
                }
                @if invoices.is_empty() { p { "No invoices yet." } } @else {
                    table {
                        thead { tr { th scope="col" { "Invoice" } th scope="col" { "Period" } th.num scope="col" { "Amount due" } th scope="col" { "Status" } th scope="col" { "" } } }
                        tbody {
                            @for i in invoices {
                                (invoice_row(i, since.is_some_and(|t| i.issued_at > t)))
                            }
                        }
                    }
                }
                h3 { @if since.is_some() { "Events and notices of the last advance" } @else { "Events and notices" } }
                (timeline_panel(rows, None))
            }
        }
        p { a href=(LIST) { "← Test clocks" } }
    };
    Ok(html(
        status,
        crate::pages::layout(&nav, clock.id.as_str(), body),
    ))
}

pub async fn clock_page(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<TestClockId>,
    RawQuery(raw): RawQuery,
) -> Page {
    let id = id.get_or(no_clock)?;
    let q = query(&raw);
    let notice = match q.get("done").map(String::as_str) {
        Some("advance") => Some("The clock is advancing."),
        _ => None,
    };
    clock_view(&state, &signed, &id, notice, None, StatusCode::OK).await
}

pub async fn advance_clock(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<TestClockId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let id = id.get_or(no_clock)?;
    // Its tenant's: another merchant's id is a 404 before any audit entry.
    test_clock::get(&state, &signed.tenant, &id)
        .await
        .map_err(fail)?;
    let Some(to) = f.get("frozen_time").and_then(|t| time_of(t)) else {
        let e = "Advance to: a date and time, YYYY-MM-DDTHH:MM (UTC)";
        return clock_view(&state, &signed, &id, None, Some(e), StatusCode::BAD_REQUEST).await;
    };
    audit(
        &state,
        &signed,
        "test_clock.advance",
        id.as_str(),
        &format!("to {}", when(to)),
    )
    .await?;
    let now = state.clock.now();
    let clock = match clocks::advance(&state, &signed.tenant, &id, to, now).await {
        Ok(c) => c,
        Err(e @ (TestClockError::NotForward { .. } | TestClockError::Advancing { .. })) => {
            let e = format!("Advance to: {e}");
            return clock_view(
                &state,
                &signed,
                &id,
                None,
                Some(&e),
                StatusCode::BAD_REQUEST,
            )
            .await;
        }
        Err(e) => return Err(fail(e)),
    };
    if clock.status == ClockStatus::Advancing && state.runs_background_work() {
        clocks::spawn_finish((*state).clone(), clock);
    }
    Ok(see_other(&format!("{LIST}/{id}?done=advance")))
}
