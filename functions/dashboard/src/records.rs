//! The business's records in the dashboard, read through the same domain
//! functions as the API for the session's project and mode: payment
//! links (with their views and uses), invoices (and their PDF), the SMS
//! reminder log, and webhook endpoints with their delivery log and a test
//! event. Every list paginates.

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use edge::PathId;
use edge::html::html;
use http::StatusCode;
use maud::html as markup;
use shared::AppState;
use shared::domain::dashboard::{self, Action, FormClaim};
use shared::domain::invoices::{self, Invoice};
use shared::domain::links::{self, PaymentLink};
use shared::domain::outbox::EventType;
use shared::domain::sms::{self, SmsReminder};
use shared::domain::webhooks::{self, Delivery, Endpoint, WebhookError};
use shared::ids::{EndpointId, EventId, IdKind, InvoiceId, LinkId};

use crate::pages::{Nav, label, layout, pages_of, places, rupees, status_badge, when};
use crate::{Page, Place, Signed, Stop, expired_form, fail, nav, query};

pub async fn links_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    let place = Place::of(&query(&raw), IdKind::PaymentLink)?;
    let (list, total) = links::list(&state, &signed.tenant, None, place.window())
        .await
        .map_err(fail)?;
    let nav = nav(&state, &signed, "links").await?;
    let q = query(&raw);
    let notice = crate::id_param(&q, "made", "lnk_")
        .map(|id| format!("Payment link {id} made: share /l/{id}."))
        .or_else(|| {
            crate::id_param(&q, "cancelled", "lnk_")
                .map(|id| format!("Payment link {id} cancelled."))
        });
    let act = signed.allows(Action::ChangeRecords);
    Ok(html(
        StatusCode::OK,
        links_html(
            &nav,
            &list,
            &place,
            total,
            act.then(dashboard::new_form_nonce).as_deref(),
            notice.as_deref(),
            None,
        ),
    ))
}

/// The fields of the new-link form as the API's body (`CreateLink`), so
/// the API's rules apply; an error names the field.
fn link_request(
    f: &std::collections::HashMap<String, String>,
) -> Result<links::CreateLink, String> {
    let mut body = serde_json::Map::new();
    let text = |name: &str| {
        f.get(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if let Some(t) = text("title") {
        body.insert("title".into(), t.into());
    }
    if let Some(d) = text("description") {
        body.insert("description".into(), d.into());
    }
    if let Some(a) = text("amount") {
        let paisa = shared::money::parse_rupees(&a).map_err(|e| format!("Amount: {e}"))?;
        body.insert("amount".into(), paisa.into());
    }
    if let Some(m) = text("max_uses") {
        let n: i64 = m
            .parse()
            .map_err(|_| "Uses: a whole number, or empty".to_owned())?;
        body.insert("maxUses".into(), n.into());
    }
    serde_path_to_error::deserialize(serde_json::Value::Object(body)).map_err(|e| {
        let field = e.path().to_string();
        format!(
            "{}: {}",
            if field == "." {
                "Title".to_owned()
            } else {
                field
            },
            e.inner()
        )
    })
}

pub async fn make_link(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    let nonce = f.get("nonce").map(String::as_str).unwrap_or("");
    let now = state.clock.now();
    let Some(fence) = dashboard::form_fence(&signed.user.merchant_id, nonce, now) else {
        return Err(expired_form());
    };
    let made = link_request(&f).and_then(|req| {
        links::new_link(&signed.tenant, req, now)
            .map_err(|e| shared::refusal::Refusal::from(e).message)
    });
    let link = match made {
        Ok(l) => l,
        Err(why) => {
            let (list, total) = links::list(&state, &signed.tenant, None, Place::first().window())
                .await
                .map_err(fail)?;
            let nav = nav(&state, &signed, "links").await?;
            return Ok(html(
                StatusCode::UNPROCESSABLE_ENTITY,
                links_html(
                    &nav,
                    &list,
                    &Place::first(),
                    total,
                    Some(nonce),
                    None,
                    Some(&format!("Not made: {why}")),
                ),
            ));
        }
    };
    // A double submit finds the first link (the fence is in its write).
    let audit = signed.audit_op(&state, "link.create", &link.id, &link.title)?;
    let link = links::insert_once(&state, &link, Some(&fence), audit)
        .await
        .map_err(fail)?;
    Ok(crate::see_other(&format!(
        "/dashboard/links?made={}",
        link.id
    )))
}

pub async fn link_page(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<LinkId>,
    RawQuery(raw): RawQuery,
) -> Page {
    let id = id.get_or(no_link)?;
    let saved = query(&raw).contains_key("saved");
    link_view(
        &state,
        &signed,
        &id,
        saved.then_some("Saved."),
        None,
        StatusCode::OK,
    )
    .await
}

/// The 404 page of a link the path names, also for an id that cannot be
/// one.
fn no_link(_: &'static str, raw: &str) -> Stop {
    fail(links::LinkError::NotFound(raw.to_owned()))
}

async fn link_view(
    state: &AppState,
    signed: &Signed,
    id: &LinkId,
    notice: Option<&str>,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let found = links::find(state, &signed.tenant, id).await.map_err(fail)?;
    let l = found.ok_or_else(|| fail(shared::refusal::Refusal::not_found("payment link", id)))?;
    let nav = nav(state, signed, "links").await?;
    let act = signed.allows(Action::ChangeRecords);
    let conversion = if l.views > 0 {
        l.used_count as f64 * 100.0 / l.views as f64
    } else {
        0.0
    };
    let body = markup! {
        @if let Some(n) = notice { p.notice role="status" { (n) } }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        div.cards {
            div.card { div.n { (l.views) } div.l { "Views" } }
            div.card { div.n { (l.used_count) } div.l { "Paid" } }
            div.card { div.n { (format!("{conversion:.0}%")) } div.l { "Conversion" } }
        }
        div.panel {
            dl.facts {
                dt { "Page" } dd { a href={ "/l/" (l.id) } { "/l/" (l.id) } }
                dt { "Amount" } dd { (link_amount(&l)) }
                dt { "State" } dd { (status_badge(if l.active { "active" } else { "inactive" })) }
            }
        }
        @if act && l.active {
            section.panel aria-labelledby="edit-title" {
                h2 id="edit-title" { "Edit" }
                form.stack method="post" action={ "/dashboard/links/" (l.id) } {
                    input type="hidden" name="csrf" value=(nav.csrf);
                    label for="title" { "Title" }
                    input id="title" name="title" required maxlength="100" value=(l.title);
                    label for="description" { "Description (empty: none)" }
                    input id="description" name="description" maxlength="500" value=(l.description.as_deref().unwrap_or(""));
                    label for="max_uses" { "How many payments it takes (empty: no limit)" }
                    input id="max_uses" name="max_uses" inputmode="numeric" maxlength="9" value=(l.max_uses.map(|m| m.to_string()).unwrap_or_default());
                    button.primary type="submit" { "Save" }
                }
            }
        }
        p { a href="/dashboard/links" { "← All links" } }
    };
    Ok(html(status, layout(&nav, &l.title, body)))
}

/// Edits a link's title, description and use limit through the API's
/// rule (`links::patch`: a limit below the uses so far is refused). The
/// same edit twice is the same link.
pub async fn edit_link(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<LinkId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    let id = id.get_or(no_link)?;
    let text = |name: &str| f.get(name).map(|v| v.trim().to_owned()).unwrap_or_default();
    let patch = (|| -> Result<links::PatchLink, String> {
        let title =
            shared::fields::LinkTitle::parse(text("title")).map_err(|e| format!("Title: {e}"))?;
        if title.trim().is_empty() {
            return Err("Title: a link needs one".into());
        }
        let description = match text("description") {
            d if d.is_empty() => None,
            d => Some(
                shared::fields::Description::parse(d).map_err(|e| format!("Description: {e}"))?,
            ),
        };
        let max_uses = match text("max_uses") {
            m if m.is_empty() => None,
            m => Some(
                m.parse::<i64>()
                    .map_err(|_| "Uses: a whole number, or empty".to_owned())?,
            ),
        };
        Ok(links::PatchLink {
            title: Some(Some(title)),
            description: Some(description),
            max_uses: Some(max_uses),
            ..Default::default()
        })
    })();
    let now = state.clock.now();
    let result = match patch {
        Ok(p) => {
            let audit = signed.audit_op(&state, "link.edit", &id, &text("title"))?;
            links::patch(&state, &signed.tenant, &id, p, now, audit)
                .await
                .map_err(|e| match e {
                    links::LinkError::NotFound(_) => Err(fail(e)),
                    other => Ok(shared::refusal::Refusal::from(other).message),
                })
        }
        Err(why) => Err(Ok(why)),
    };
    match result {
        Ok(l) => Ok(crate::see_other(&format!(
            "/dashboard/links/{}?saved=1",
            l.id
        ))),
        Err(Err(stop)) => Err(stop),
        Err(Ok(why)) => {
            link_view(
                &state,
                &signed,
                &id,
                None,
                Some(&format!("Not saved: {why}")),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await
        }
    }
}

pub async fn cancel_link(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<LinkId>,
    body: Bytes,
) -> Page {
    signed.action_form(Action::ChangeRecords, &body)?;
    let now = state.clock.now();
    let id = id.get_or(no_link)?;
    let audit = signed.audit_op(&state, "link.cancel", &id, "")?;
    match links::cancel(&state, &signed.tenant, &id, now, audit).await {
        // Already inactive (a second click): the same outcome.
        Ok(_) | Err(links::LinkError::Inactive) => {}
        Err(e) => return Err(fail(e)),
    }
    Ok(crate::see_other(&format!(
        "/dashboard/links?cancelled={id}"
    )))
}

fn link_amount(l: &PaymentLink) -> String {
    match (l.amount, l.min_amount, l.max_amount) {
        (Some(a), _, _) => a.display_npr(),
        (None, min, max) => format!(
            "{} to {}",
            min.map(rupees).unwrap_or_else(|| "any".into()),
            max.map(rupees).unwrap_or_else(|| "any".into())
        ),
    }
}

fn links_html(
    nav: &Nav,
    list: &[PaymentLink],
    place: &Place,
    total: u64,
    nonce: Option<&str>,
    notice: Option<&str>,
    error: Option<&str>,
) -> String {
    let body = markup! {
        @if let Some(n) = notice { p.notice role="status" { (n) } }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        p.muted { (total) " payment links. Page " (place.page) " of " (pages_of(total).max(place.page)) "." }
        div.panel {
            @if list.is_empty() { p { "No payment links yet." } } @else {
                table {
                    thead { tr {
                        th scope="col" { "Link" } th scope="col" { "Amount" }
                        th.num scope="col" { "Views" } th.num scope="col" { "Paid" }
                        th.num scope="col" { "Conversion" } th scope="col" { "State" }
                    } }
                    tbody { @for l in list {
                        tr {
                            td { a href={ "/dashboard/links/" (l.id) } { (l.title) } br; span.muted { (l.id) } }
                            td { (link_amount(l)) }
                            td.num { (l.views) }
                            td.num { (l.used_count) @if let Some(m) = l.max_uses { " of " (m) } }
                            td.num { (format!("{:.0}%", if l.views > 0 { l.used_count as f64 * 100.0 / l.views as f64 } else { 0.0 })) }
                            td { (status_badge(if l.active { "active" } else { "inactive" }))
                                 @if let Some(t) = l.expires_at { br; span.muted { "until " (when(t)) } }
                                 @if let (true, Some(_)) = (l.active, nonce) {
                                     form method="post" action={ "/dashboard/links/" (l.id) "/cancel" } {
                                         input type="hidden" name="csrf" value=(nav.csrf);
                                         button type="submit" { "Cancel link" }
                                     }
                                 }
                            }
                        }
                    } }
                }
            }
        }
        (places(
            "/dashboard/links",
            place,
            list.first().map(|l| l.id.as_str()),
            list.last().map(|l| l.id.as_str()),
            list.len() >= crate::PAGE,
        ))
        @if let Some(nonce) = nonce {
            section.panel aria-labelledby="new-link-title" {
                h2 id="new-link-title" { "New payment link" }
                form.stack method="post" action="/dashboard/links" {
                    input type="hidden" name="csrf" value=(nav.csrf);
                    input type="hidden" name="nonce" value=(nonce);
                    label for="title" { "Title" }
                    input id="title" name="title" required maxlength="100";
                    label for="description" { "Description (optional)" }
                    input id="description" name="description" maxlength="500";
                    label for="amount" { "Amount in rupees (empty: the customer types it)" }
                    input id="amount" name="amount" inputmode="decimal" maxlength="20";
                    label for="max_uses" { "How many payments it takes (empty: no limit)" }
                    input id="max_uses" name="max_uses" inputmode="numeric" maxlength="9";
                    button.primary type="submit" { "Make link" }
                }
            }
        }
    };
    layout(nav, "Payment links", body)
}

pub async fn invoices_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    let place = Place::of(&query(&raw), IdKind::Invoice)?;
    let (list, total) = invoices::list(&state, &signed.tenant, None, None, place.window())
        .await
        .map_err(fail)?;
    let nav = nav(&state, &signed, "invoices").await?;
    let body = markup! {
        p.muted { (total) " invoices. Page " (place.page) " of " (pages_of(total).max(place.page)) "." }
        div.panel {
            @if list.is_empty() { p { "No invoices yet." } } @else {
                table {
                    thead { tr {
                        th scope="col" { "Invoice" } th scope="col" { "Buyer" }
                        th.num scope="col" { "Total" } th.num scope="col" { "Paid" }
                        th scope="col" { "State" } th scope="col" { "Due" }
                    } }
                    tbody { @for i in &list {
                        tr {
                            td { a href={ "/dashboard/invoices/" (i.id) } { (i.invoice_number.as_deref().unwrap_or("draft")) } br; span.muted { (i.id) } }
                            td { (i.buyer.as_ref().map(|b| label(&b.name)).unwrap_or_default()) }
                            td.num { (rupees(i.total_amount)) }
                            td.num { (rupees(i.amount_paid)) }
                            td { (status_badge(&label(&i.document_status))) " " (status_badge(&label(&i.collection_status))) }
                            td { (when(i.due_at)) }
                        }
                    } }
                }
            }
        }
        (places(
            "/dashboard/invoices",
            &place,
            list.first().map(|i| i.id.as_str()),
            list.last().map(|i| i.id.as_str()),
            list.len() >= crate::PAGE,
        ))
    };
    Ok(html(StatusCode::OK, layout(&nav, "Invoices", body)))
}

/// The invoice of the path, or the invoice's 404 page (also for an id
/// that cannot be one).
pub(crate) async fn invoice_of(
    state: &AppState,
    signed: &Signed,
    id: PathId<InvoiceId>,
) -> Result<Invoice, Stop> {
    let iid = id.get_or(|_, raw| fail(invoices::InvoiceError::NotFound(raw.to_owned())))?;
    invoices::get(state, &signed.tenant, &iid)
        .await
        .map_err(fail)
}

pub async fn invoice_page(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<InvoiceId>,
) -> Page {
    let i = invoice_of(&state, &signed, id).await?;
    let nav = nav(&state, &signed, "invoices").await?;
    let title = format!(
        "Invoice {}",
        i.invoice_number.as_deref().unwrap_or("(draft)")
    );
    let body = markup! {
        div.panel {
            dl.facts {
                dt { "Invoice" } dd { (i.id) }
                dt { "State" } dd { (status_badge(&label(&i.document_status))) " " (status_badge(&label(&i.collection_status))) }
                dt { "Total" } dd { (rupees(i.total_amount)) }
                dt { "Paid" } dd { (rupees(i.amount_paid)) }
                dt { "Due" } dd { (when(i.due_at)) }
                @if let Some(note) = &i.note { dt { "Note" } dd { (note) } }
            }
        }
        section.panel aria-labelledby="lines-title" {
            h2 id="lines-title" { "Lines" }
            table {
                thead { tr { th scope="col" { "Description" } th.num scope="col" { "Quantity" } th.num scope="col" { "Amount" } } }
                tbody { @for l in &i.lines {
                    tr { td { (l.description) } td.num { (l.quantity) } td.num { (rupees(l.line_total)) } }
                } }
            }
        }
        @if label(&i.document_status) == "draft" {
            p.muted { "A draft has no PDF until it is finalized." }
        } @else {
            p { a href={ "/dashboard/invoices/" (i.id) "/pdf" } { "Download the PDF" } }
        }
        p { a href="/dashboard/invoices" { "← All invoices" } }
    };
    Ok(html(StatusCode::OK, layout(&nav, &title, body)))
}

/// A phone number as the SMS log shows it: the last three digits only.
fn masked(phone: &str) -> String {
    let digits: Vec<char> = phone.chars().filter(char::is_ascii_digit).collect();
    let tail: String = digits[digits.len().saturating_sub(3)..].iter().collect();
    format!("•••••••{tail}")
}

pub async fn sms_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    let place = Place::of(&query(&raw), IdKind::Sms)?;
    let (list, total): (Vec<SmsReminder>, u64) = sms::list(&state, &signed.tenant, place.window())
        .await
        .map_err(fail)?;
    let nav = nav(&state, &signed, "sms").await?;
    let body = markup! {
        p.muted { (total) " reminders. Page " (place.page) " of " (pages_of(total).max(place.page)) "." }
        div.panel {
            @if list.is_empty() { p { "No SMS reminders yet." } } @else {
                table {
                    thead { tr {
                        th scope="col" { "Reminder" } th scope="col" { "To" }
                        th scope="col" { "State" } th scope="col" { "Sent for" } th scope="col" { "Created" }
                    } }
                    tbody { @for r in &list {
                        tr {
                            td { (r.id) }
                            td { (masked(&r.to)) }
                            td { (status_badge(&label(&r.status))) @if let Some(e) = &r.last_error { br; span.muted { (e) } } }
                            td { (r.session_id.as_deref().unwrap_or("—")) }
                            td { (when(r.created_at)) }
                        }
                    } }
                }
            }
        }
        (places(
            "/dashboard/sms",
            &place,
            list.first().map(|r| r.id.as_str()),
            list.last().map(|r| r.id.as_str()),
            list.len() >= crate::PAGE,
        ))
    };
    Ok(html(StatusCode::OK, layout(&nav, "SMS reminders", body)))
}

fn events_of(e: &Endpoint) -> String {
    if e.events.is_empty() {
        "every event".into()
    } else {
        e.events
            .iter()
            .map(|t| t.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

pub async fn webhooks_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    signed.require(Action::Webhooks)?;
    let q = query(&raw);
    let notice = crate::id_param(&q, "deleted", "we_").map(|id| format!("Endpoint {id} deleted."));
    webhooks_view(&state, &signed, notice.as_deref(), None, StatusCode::OK).await
}

async fn webhooks_view(
    state: &AppState,
    signed: &Signed,
    notice: Option<&str>,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let list = webhooks::list(state, &signed.tenant).await.map_err(fail)?;
    let nav = nav(state, signed, "webhooks").await?;
    let nonce = dashboard::new_form_nonce();
    let body = markup! {
        @if let Some(n) = notice { p.notice role="status" { (n) } }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        div.panel {
            @if list.is_empty() { p { "No webhook endpoints in this mode yet." } } @else {
                table {
                    thead { tr { th scope="col" { "Endpoint" } th scope="col" { "Events" } th scope="col" { "State" } } }
                    tbody { @for e in &list {
                        tr {
                            td { a href={ "/dashboard/webhooks/" (e.id) } { (e.url) } br; span.muted { (e.id) } }
                            td { (events_of(e)) }
                            td { (status_badge(if e.enabled { "enabled" } else { "disabled" })) }
                        }
                    } }
                }
            }
        }
        section.panel aria-labelledby="add-hook-title" {
            h2 id="add-hook-title" { "Add an endpoint" }
            form.stack method="post" action="/dashboard/webhooks" {
                input type="hidden" name="csrf" value=(nav.csrf);
                input type="hidden" name="nonce" value=(nonce);
                label for="url" { "URL (https)" }
                input id="url" name="url" type="url" required maxlength="2048";
                fieldset {
                    legend { "Events (none ticked: every event)" }
                    @for t in EventType::ALL {
                        div {
                            input type="checkbox" id={ "ev-" (t.as_str()) } name={ "event:" (t.as_str()) } value="on";
                            " "
                            label for={ "ev-" (t.as_str()) } { (t.as_str()) }
                        }
                    }
                }
                button.primary type="submit" { "Add endpoint" }
            }
        }
    };
    Ok(html(status, layout(&nav, "Webhooks", body)))
}

/// Adds an endpoint (`webhooks::create`, the API's rules: https, no
/// private address, at most 16); its signing secret is shown once. The
/// form's fence makes a double submit find the first endpoint.
pub async fn add_endpoint(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::Webhooks, &body)?;
    let nonce = f.get("nonce").map(String::as_str).unwrap_or("");
    let Some(fence) = dashboard::form_fence(&signed.user.merchant_id, nonce, state.clock.now())
    else {
        return Err(expired_form());
    };
    let events: Vec<String> = EventType::ALL
        .iter()
        .filter(|t| f.contains_key(&format!("event:{}", t.as_str())))
        .map(|t| t.as_str().to_owned())
        .collect();
    let req = webhooks::CreateEndpoint {
        url: f
            .get("url")
            .map(|u| u.trim().to_owned())
            .unwrap_or_default(),
        events: Some(events),
        enabled: Some(true),
    };
    let audit = |e: &webhooks::Endpoint| {
        let entry = signed.entry(&state, "webhook.add", &e.id, &e.url);
        Ok(vec![dashboard::audit_op(&entry)?])
    };
    let made = webhooks::create_with(&state, &signed.tenant, req, Some(&fence), audit).await;
    let (endpoint, secret) = match made {
        Ok(v) => v,
        Err(e @ (WebhookError::Invalid { .. } | WebhookError::TooMany)) => {
            let why = format!("Not added: {}", shared::refusal::Refusal::from(e).message);
            return webhooks_view(
                &state,
                &signed,
                None,
                Some(&why),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await;
        }
        Err(e) => return Err(fail(e)),
    };
    let nav = nav(&state, &signed, "webhooks").await?;
    let body = markup! {
        @match &secret {
            Some(secret) => {
                p.notice role="status" { "Copy the signing secret now: it is shown only this once." }
                div.panel {
                    label for="secret" { "Signing secret of " (endpoint.url) }
                    input id="secret" name="secret" readonly value=(secret) size="70";
                }
            }
            None => {
                p.notice role="status" { "This form was already sent: the endpoint exists, and its signing secret was shown once." }
            }
        }
        p { a href={ "/dashboard/webhooks/" (endpoint.id) } { "The endpoint" } " · " a href="/dashboard/webhooks" { "All endpoints" } }
    };
    Ok(html(StatusCode::OK, layout(&nav, "Endpoint added", body)))
}

/// Enables, disables or deletes an endpoint (deleting asks to confirm).
pub async fn change_endpoint(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<EndpointId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::Webhooks, &body)?;
    match f.get("do").map(String::as_str) {
        Some(on @ ("enable" | "disable")) => {
            let patch = webhooks::PatchEndpoint {
                enabled: Some(on == "enable"),
                ..Default::default()
            };
            let id = id.get_or(no_endpoint)?;
            let audit = signed.audit_op(&state, &format!("webhook.{on}"), &id, "")?;
            webhooks::patch_with(&state, &signed.tenant, &id, patch, audit)
                .await
                .map_err(fail)?;
            Ok(crate::see_other(&format!("/dashboard/webhooks/{id}")))
        }
        Some("delete") if f.get("confirm").map(String::as_str) == Some("yes") => {
            // A malformed id is no endpoint: gone already, as below.
            let id = match id.get_or(|_, raw| raw.to_owned()) {
                Ok(id) => {
                    let audit = signed.audit_op(&state, "webhook.delete", &id, "")?;
                    match webhooks::delete_with(&state, &signed.tenant, &id, audit).await {
                        Ok(()) => {}
                        // Gone already (a second click): the same outcome,
                        // and nothing to log.
                        Err(WebhookError::NotFound(_)) => {}
                        Err(e) => return Err(fail(e)),
                    }
                    id.to_string()
                }
                Err(raw) => raw,
            };
            Ok(crate::see_other(&format!(
                "/dashboard/webhooks?deleted={id}"
            )))
        }
        Some("delete") => {
            let id = id.get_or(no_endpoint)?;
            endpoint_view(
                &state,
                &signed,
                &id,
                &Place::first(),
                Some("Tick the box to confirm the deletion."),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await
        }
        _ => Err(fail(shared::refusal::Refusal::invalid(
            "do",
            "Choose enable, disable or delete",
        ))),
    }
}

/// Sends one final delivery again (`webhooks::resend`).
pub async fn resend(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<EndpointId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::Webhooks, &body)?;
    let id = id.get_or(|_, raw| raw.to_owned());
    let shown = shown(&id);
    let event = f.get("event").cloned().unwrap_or_default();
    let nonce = f.get("nonce").map(String::as_str).unwrap_or("");
    let Some(fence) = dashboard::form_fence(&signed.user.merchant_id, nonce, state.clock.now())
    else {
        return Err(expired_form());
    };
    // Claimed first; the domain call then finds the endpoint (another
    // project's is a 404, which only spends this form's token).
    if let FormClaim::Done(_) = dashboard::claim_form::<EventId>(&state, &fence)
        .await
        .map_err(fail)?
    {
        // A double click: the first one sent it again.
        return Ok(crate::see_other(&format!(
            "/dashboard/webhooks/{shown}?resent={event}"
        )));
    }
    let id = id.map_err(|raw| no_endpoint("", &raw))?;
    // The intent is recorded before the delivery is queued (a queue send
    // shares no transaction with the store).
    crate::audit(&state, &signed, "webhook.resend", &id, &event).await?;
    match EventId::parse(&event) {
        Some(event_id) => webhooks::resend(&state, &signed.tenant, &event_id, &id).await,
        // No such delivery, once the endpoint is found (as `resend` answers).
        None => webhooks::get(&state, &signed.tenant, &id)
            .await
            .and_then(|_| Err(WebhookError::NotFound(format!("{event} to {id}")))),
    }
    .map_err(fail)?;
    Ok(crate::see_other(&format!(
        "/dashboard/webhooks/{id}?resent={event}"
    )))
}

async fn endpoint_view(
    state: &AppState,
    signed: &Signed,
    id: &EndpointId,
    place: &Place,
    notice: Option<&str>,
    status: StatusCode,
) -> Page {
    let e = webhooks::get(state, &signed.tenant, id)
        .await
        .map_err(fail)?;
    let (log, _total): (Vec<Delivery>, u64) =
        webhooks::deliveries_page(state, &signed.tenant, id, place.window())
            .await
            .map_err(fail)?;
    let nav = nav(state, signed, "webhooks").await?;
    let nonce = dashboard::new_form_nonce();
    let body = markup! {
        @if let Some(n) = notice { p.notice role="status" { (n) } }
        div.panel {
            dl.facts {
                dt { "URL" } dd { (e.url) }
                dt { "Events" } dd { (events_of(&e)) }
                dt { "State" } dd { (status_badge(if e.enabled { "enabled" } else { "disabled" })) }
            }
            form method="post" action={ "/dashboard/webhooks/" (e.id) } {
                input type="hidden" name="csrf" value=(nav.csrf);
                @if e.enabled {
                    button type="submit" name="do" value="disable" { "Disable" }
                } @else {
                    button type="submit" name="do" value="enable" { "Enable" }
                }
            }
            form method="post" action={ "/dashboard/webhooks/" (e.id) } {
                input type="hidden" name="csrf" value=(nav.csrf);
                input type="checkbox" id="confirm-delete" name="confirm" value="yes";
                " "
                label for="confirm-delete" { "I am sure" }
                " "
                button type="submit" name="do" value="delete" { "Delete endpoint" }
            }
        }
        section.panel aria-labelledby="log-title" {
            h2 id="log-title" { "Latest deliveries" }
            @if log.is_empty() { p.muted { "Nothing delivered yet." } } @else {
                table {
                    thead { tr {
                        th scope="col" { "Event" } th scope="col" { "State" } th.num scope="col" { "Attempts" }
                        th scope="col" { "Answer" } th scope="col" { "Last try" } th scope="col" { "Again" }
                    } }
                    tbody { @for d in &log {
                        tr {
                            td { (d.event_type.as_str()) br; span.muted { (d.event_id) } }
                            td { (status_badge(&label(&d.status))) }
                            td.num { (d.attempts) }
                            td { (d.response_status.map(|s| s.to_string()).unwrap_or_default())
                                 @if let Some(err) = &d.last_error { br; span.muted { (err) } } }
                            td { (d.last_attempt_at.map(when).unwrap_or_else(|| "—".into())) }
                            td {
                                @if d.status.is_final() {
                                    form method="post" action={ "/dashboard/webhooks/" (e.id) "/resend" } {
                                        input type="hidden" name="csrf" value=(nav.csrf);
                                        input type="hidden" name="nonce" value=(dashboard::new_form_nonce());
                                        input type="hidden" name="event" value=(d.event_id);
                                        button type="submit" { "Resend" }
                                    }
                                }
                            }
                        }
                    } }
                }
            }
        }
        section.panel aria-labelledby="test-title" {
            h2 id="test-title" { "Send a test event" }
            form.stack method="post" action={ "/dashboard/webhooks/" (e.id) "/test" } {
                input type="hidden" name="csrf" value=(nav.csrf);
                input type="hidden" name="nonce" value=(nonce);
                label for="type" { "Event type" }
                select id="type" name="type" {
                    @for t in EventType::ALL { option value=(t.as_str()) { (t.as_str()) } }
                }
                button.primary type="submit" { "Send test event" }
            }
        }
        (places(
            &format!("/dashboard/webhooks/{}", e.id),
            place,
            log.first().map(|d| d.id.as_str()),
            log.last().map(|d| d.id.as_str()),
            log.len() >= crate::PAGE,
        ))
        p { a href="/dashboard/webhooks" { "← All endpoints" } }
    };
    Ok(html(status, layout(&nav, "Webhook endpoint", body)))
}

pub async fn endpoint_page(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<EndpointId>,
    RawQuery(raw): RawQuery,
) -> Page {
    signed.require(Action::Webhooks)?;
    let q = query(&raw);
    let notice = crate::id_param(&q, "sent", "evt_")
        .map(|id| format!("Test event {id} queued for this endpoint."))
        .or_else(|| {
            crate::id_param(&q, "resent", "evt_")
                .map(|id| format!("Event {id} queued to be sent again."))
        });
    let place = Place::of(&q, IdKind::WebhookDelivery)?;
    let id = id.get_or(no_endpoint)?;
    endpoint_view(
        &state,
        &signed,
        &id,
        &place,
        notice.as_deref(),
        StatusCode::OK,
    )
    .await
}

/// Sends a test event to one endpoint (`webhooks::send_test_event`); the
/// form's one-time token keeps a double submit from sending two.
pub async fn send_test(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<EndpointId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::Webhooks, &body)?;
    let id = id.get_or(|_, raw| raw.to_owned());
    let shown = shown(&id);
    let Some(t) = f.get("type").and_then(|t| EventType::parse(t)) else {
        return Err(fail(shared::refusal::Refusal::invalid(
            "type",
            "Choose an event type",
        )));
    };
    let nonce = f.get("nonce").map(String::as_str).unwrap_or("");
    let Some(fence) = dashboard::form_fence(&signed.user.merchant_id, nonce, state.clock.now())
    else {
        return Err(expired_form());
    };
    // Claimed first; the domain call then finds the endpoint (another
    // project's is a 404, which only spends this form's token).
    if let FormClaim::Done(sent) = dashboard::claim_form::<EventId>(&state, &fence)
        .await
        .map_err(fail)?
    {
        let location = match sent {
            Some(evt) => format!("/dashboard/webhooks/{shown}?sent={evt}"),
            None => format!("/dashboard/webhooks/{shown}"),
        };
        return Ok(crate::see_other(&location));
    }
    let id = id.map_err(|raw| no_endpoint("", &raw))?;
    // The intent is recorded before the test event is sent.
    crate::audit(&state, &signed, "webhook.test", &id, t.as_str()).await?;
    let event = webhooks::send_test_event(&state, &signed.tenant, &id, t)
        .await
        .map_err(fail)?;
    if let Err(e) = dashboard::complete_form(&state, &fence, &event.id).await {
        tracing::warn!(error = %e, "form result not recorded");
    }
    Ok(crate::see_other(&format!(
        "/dashboard/webhooks/{id}?sent={}",
        event.id
    )))
}

/// What a page answers for a path that names no endpoint (as the lookup
/// answered before ids were typed).
fn no_endpoint(_noun: &'static str, raw: &str) -> Stop {
    fail(WebhookError::NotFound(raw.to_owned()))
}

/// The endpoint id as the path held it.
fn shown(id: &Result<EndpointId, String>) -> String {
    match id {
        Ok(id) => id.to_string(),
        Err(raw) => raw.clone(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn phones_show_only_their_last_digits() {
        assert_eq!(super::masked("+977 9841000123"), "•••••••123");
        assert_eq!(super::masked("12"), "•••••••12");
        assert_eq!(super::masked(""), "•••••••");
    }
}
