//! Coupons and promotion codes in the dashboard (issue 40): each list
//! with a form to make one and a button to deactivate one, through the
//! same domain calls as `/v1/billing/coupons` and
//! `/v1/billing/promotion-codes` (the same checks, the same webhooks).
//!
//! Making and deactivating take `Action::ChangeRecords` and the form's
//! CSRF token, with an audit entry first.

use axum::body::Bytes;
use axum::extract::State;
use edge::PathId;
use edge::html::html;
use http::StatusCode;
use maud::html as markup;
use shared::AppState;
use shared::domain::billing::coupons::{
    self, Coupon, CouponDuration, CouponError, CreateCoupon, CreatePromotionCode, DiscountType,
    PromotionCode, PromotionFilter, UpdatePromotionCode,
};
use shared::domain::billing::customers::{BillingError, PageRequest};
use shared::domain::dashboard::Action;
use shared::ids::{CouponId, PromotionCodeId};
use shared::money::parse_rupees;
use shared::refusal::Refusal;
use shared::time::Timestamp;

use crate::billing::{entitled, entitled_to_change, tabs};
use crate::pages::{layout, rupees, status_badge, when};
use crate::{Page, Signed, Stop, audit, fail, nav, see_other};

const COUPONS: &str = "/dashboard/billing/coupons";
const CODES: &str = "/dashboard/billing/promotion-codes";
/// Records listed on a page.
const SHOWN: usize = 50;

fn first_page() -> PageRequest {
    PageRequest {
        page: 1,
        limit: SHOWN,
    }
}

/// What a coupon takes off, in words.
fn off(c: &Coupon) -> String {
    let value = match (
        c.terms.discount_type,
        c.terms.percent_off,
        c.terms.amount_off,
    ) {
        (DiscountType::Percent, Some(p), _) => format!("{p}% off"),
        (_, _, Some(a)) => format!("{} off", rupees(a)),
        _ => "—".into(),
    };
    let duration = match (c.terms.duration, c.terms.duration_in_cycles) {
        (CouponDuration::Once, _) => "once".to_owned(),
        (CouponDuration::Repeating, Some(n)) => format!("for {n} invoices"),
        (CouponDuration::Repeating, None) => "repeating".to_owned(),
        (CouponDuration::Forever, _) => "forever".to_owned(),
    };
    format!("{value}, {duration}")
}

fn used(count: u32, max: Option<u32>) -> String {
    match max {
        Some(m) => format!("{count} of {m}"),
        None => count.to_string(),
    }
}

fn active_badge(active: bool) -> maud::Markup {
    status_badge(if active { "active" } else { "inactive" })
}

/// The words of a refusal the merchant can act on (its field named).
fn said(e: CouponError) -> Result<String, Stop> {
    let r = Refusal::from(e);
    match r.kind {
        shared::refusal::Kind::Invalid | shared::refusal::Kind::Conflict => Ok(match r.field {
            Some(f) => format!("{f}: {}", r.message),
            None => r.message,
        }),
        _ => Err(fail(r)),
    }
}

async fn coupons_view(
    state: &AppState,
    signed: &Signed,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let nav = nav(state, signed, "billing").await?;
    if let Some(page) = entitled(state, &nav, signed, "Coupons").await? {
        return Ok(html(StatusCode::OK, page));
    }
    let (list, total) = coupons::list_coupons(state, &signed.tenant, first_page(), None)
        .await
        .map_err(fail)?;
    let act = signed.allows(Action::ChangeRecords);
    let body = markup! {
        (tabs("coupons"))
        p.muted { "A coupon is a reusable discount; apply it to a subscription through the API (apply-coupon), directly or through a promotion code." }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        @if act {
            div.panel {
                form method="post" action=(COUPONS) {
                    input type="hidden" name="csrf" value=(nav.csrf);
                    label for="coupon_code" { "Code " }
                    input id="coupon_code" name="code" maxlength="64" required;
                    " " label for="coupon_name" { "Name " }
                    input id="coupon_name" name="name" maxlength="200" required;
                    br;
                    label for="coupon_type" { "Discount " }
                    select id="coupon_type" name="discount_type" {
                        option value="percent" { "percent off" }
                        option value="amount" { "amount off (Rs)" }
                    }
                    " " label for="coupon_value" { "Value " }
                    input id="coupon_value" name="value" required size="8";
                    br;
                    label for="coupon_duration" { "Duration " }
                    select id="coupon_duration" name="duration" {
                        option value="once" { "once" }
                        option value="repeating" { "repeating" }
                        option value="forever" { "forever" }
                    }
                    " " label for="coupon_cycles" { "Invoices (repeating) " }
                    input id="coupon_cycles" name="duration_in_cycles" type="number" min="1" max="120";
                    " " label for="coupon_max" { "Most redemptions " }
                    input id="coupon_max" name="max_redemptions" type="number" min="1";
                    " " button type="submit" { "Create coupon" }
                }
            }
        }
        div.panel {
            p.muted { (total) " coupons, newest first." }
            @if list.is_empty() { p { "No coupons yet." } } @else {
                table {
                    thead { tr {
                        th scope="col" { "Code" } th scope="col" { "Name" } th scope="col" { "Discount" }
                        th scope="col" { "Redeemed" } th scope="col" { "Status" } th scope="col" { "Created" }
                        @if act { th scope="col" { span.sr-only { "Action" } } }
                    } }
                    tbody {
                        @for c in &list {
                            tr {
                                td { strong { (c.code) } br; span.muted { (c.id) } }
                                td { (c.name) }
                                td { (off(c)) }
                                td { (used(c.redeemed_count, c.max_redemptions)) }
                                td { (active_badge(c.active)) }
                                td { (when(c.created_at)) }
                                @if act {
                                    td {
                                        @if c.active {
                                            form method="post" action={ (COUPONS) "/" (c.id) "/deactivate" } {
                                                input type="hidden" name="csrf" value=(nav.csrf);
                                                button type="submit" { "Deactivate" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html(status, layout(&nav, "Coupons", body)))
}

pub async fn coupons_page(State(state): State<AppState>, signed: Signed) -> Page {
    coupons_view(&state, &signed, None, StatusCode::OK).await
}

/// A whole number from a form field (empty: none).
fn count(f: &std::collections::HashMap<String, String>, name: &str) -> Result<Option<i64>, String> {
    match f.get(name).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(raw) => raw
            .parse::<i64>()
            .map(Some)
            .map_err(|_| format!("{name}: a whole number, got {raw:?}")),
    }
}

/// The API's body from the form (values checked by the domain).
fn coupon_body(f: &std::collections::HashMap<String, String>) -> Result<CreateCoupon, String> {
    let get = |k: &str| f.get(k).map(|s| s.trim().to_owned()).unwrap_or_default();
    let discount_type = get("discount_type");
    let value = get("value");
    let (percent_off, amount_off) = if discount_type == "amount" {
        let paisa = parse_rupees(&value).map_err(|e| format!("Value: {e}"))?;
        (None, Some(paisa))
    } else {
        let p = value
            .trim_end_matches('%')
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("Value: a percent from 1 to 100, got {value:?}"))?;
        (Some(p), None)
    };
    Ok(CreateCoupon {
        code: get("code"),
        name: get("name"),
        discount_type,
        duration: get("duration"),
        percent_off,
        amount_off,
        currency: None,
        duration_in_cycles: count(f, "duration_in_cycles")?,
        max_redemptions: count(f, "max_redemptions")?,
        redeem_by: None,
        applies_to_plan_ids: None,
        project_ids: None,
        metadata: None,
    })
}

pub async fn create_coupon(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let body = match coupon_body(&f) {
        Ok(b) => b,
        Err(e) => return coupons_view(&state, &signed, Some(&e), StatusCode::BAD_REQUEST).await,
    };
    let detail = format!("{} ({})", body.code, body.name);
    audit(&state, &signed, "coupon.create", &body.code, &detail).await?;
    match coupons::create_coupon(&state, &signed.tenant, body, None).await {
        Ok(_) => Ok(see_other(COUPONS)),
        Err(e) => {
            let e = said(e)?;
            coupons_view(&state, &signed, Some(&e), StatusCode::BAD_REQUEST).await
        }
    }
}

fn no_coupon(_: &'static str, raw: &str) -> Stop {
    fail(BillingError::NotFound {
        what: "coupon",
        named: raw.to_owned(),
    })
}

fn no_code(_: &'static str, raw: &str) -> Stop {
    fail(BillingError::NotFound {
        what: "promotion code",
        named: raw.to_owned(),
    })
}

pub async fn deactivate_coupon(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<CouponId>,
    body: Bytes,
) -> Page {
    signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let id = id.get_or(no_coupon)?;
    audit(&state, &signed, "coupon.deactivate", id.as_str(), "").await?;
    coupons::deactivate_coupon(&state, &signed.tenant, &id)
        .await
        .map_err(fail)?;
    Ok(see_other(COUPONS))
}

async fn codes_view(
    state: &AppState,
    signed: &Signed,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let nav = nav(state, signed, "billing").await?;
    if let Some(page) = entitled(state, &nav, signed, "Promotion codes").await? {
        return Ok(html(StatusCode::OK, page));
    }
    let (list, total) = coupons::list_promotion_codes(
        state,
        &signed.tenant,
        first_page(),
        &PromotionFilter::default(),
    )
    .await
    .map_err(fail)?;
    let (active, _) = coupons::list_coupons(state, &signed.tenant, first_page(), Some(true))
        .await
        .map_err(fail)?;
    let act = signed.allows(Action::ChangeRecords);
    let code_of = |c: &CouponId| {
        active
            .iter()
            .find(|x| &x.id == c)
            .map(|x| x.code.clone())
            .unwrap_or_else(|| c.to_string())
    };
    let body = markup! {
        (tabs("promotion codes"))
        p.muted { "A promotion code is what a customer types (any case) to redeem a coupon, with limits of its own." }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        @if act {
            div.panel {
                @if active.is_empty() { p { "Create an active coupon first." } } @else {
                    form method="post" action=(CODES) {
                        input type="hidden" name="csrf" value=(nav.csrf);
                        label for="promo_coupon" { "Coupon " }
                        select id="promo_coupon" name="coupon_id" {
                            @for c in &active { option value=(c.id) { (c.code) " — " (off(c)) } }
                        }
                        " " label for="promo_code" { "Code " }
                        input id="promo_code" name="code" maxlength="64" required;
                        br;
                        label for="promo_max" { "Most redemptions " }
                        input id="promo_max" name="max_redemptions" type="number" min="1";
                        " " label for="promo_min" { "Minimum amount (Rs) " }
                        input id="promo_min" name="minimum_amount" size="8";
                        " " label { input type="checkbox" name="first_time" value="true"; " first-time customers only" }
                        " " button type="submit" { "Create promotion code" }
                    }
                }
            }
        }
        div.panel {
            p.muted { (total) " promotion codes, newest first." }
            @if list.is_empty() { p { "No promotion codes yet." } } @else {
                table {
                    thead { tr {
                        th scope="col" { "Code" } th scope="col" { "Coupon" } th scope="col" { "Redeemed" }
                        th scope="col" { "Expires" } th scope="col" { "Status" }
                        @if act { th scope="col" { span.sr-only { "Action" } } }
                    } }
                    tbody {
                        @for p in &list {
                            tr {
                                td { strong { (p.code) } br; span.muted { (p.id) } }
                                td { (code_of(&p.coupon_id)) }
                                td { (used(p.redeemed_count, p.max_redemptions)) }
                                td { (p.expires_at.map(when).unwrap_or_else(|| "—".into())) }
                                td { (active_badge(p.active)) }
                                @if act {
                                    td {
                                        @if p.active {
                                            form method="post" action={ (CODES) "/" (p.id) "/deactivate" } {
                                                input type="hidden" name="csrf" value=(nav.csrf);
                                                button type="submit" { "Deactivate" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html(status, layout(&nav, "Promotion codes", body)))
}

pub async fn codes_page(State(state): State<AppState>, signed: Signed) -> Page {
    codes_view(&state, &signed, None, StatusCode::OK).await
}

fn code_body(f: &std::collections::HashMap<String, String>) -> Result<CreatePromotionCode, String> {
    let get = |k: &str| f.get(k).map(|s| s.trim().to_owned()).unwrap_or_default();
    let minimum = get("minimum_amount");
    let minimum_amount = if minimum.is_empty() {
        None
    } else {
        Some(parse_rupees(&minimum).map_err(|e| format!("Minimum amount: {e}"))?)
    };
    Ok(CreatePromotionCode {
        coupon_id: get("coupon_id"),
        code: get("code"),
        max_redemptions: count(f, "max_redemptions")?,
        expires_at: None::<Timestamp>,
        first_time_transaction: Some(get("first_time") == "true"),
        minimum_amount,
        customer_ids: None,
        metadata: None,
    })
}

pub async fn create_code(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let body = match code_body(&f) {
        Ok(b) => b,
        Err(e) => return codes_view(&state, &signed, Some(&e), StatusCode::BAD_REQUEST).await,
    };
    let detail = format!("{} for {}", body.code, body.coupon_id);
    audit(
        &state,
        &signed,
        "promotion_code.create",
        &body.code,
        &detail,
    )
    .await?;
    match coupons::create_promotion_code(&state, &signed.tenant, body, None).await {
        Ok(_) => Ok(see_other(CODES)),
        Err(e) => {
            let e = said(e)?;
            codes_view(&state, &signed, Some(&e), StatusCode::BAD_REQUEST).await
        }
    }
}

pub async fn deactivate_code(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<PromotionCodeId>,
    body: Bytes,
) -> Page {
    signed.action_form(Action::ChangeRecords, &body)?;
    entitled_to_change(&state, &signed).await?;
    let id = id.get_or(no_code)?;
    audit(
        &state,
        &signed,
        "promotion_code.deactivate",
        id.as_str(),
        "",
    )
    .await?;
    let off = UpdatePromotionCode {
        active: Some(false),
        metadata: None,
    };
    let _: PromotionCode = coupons::update_promotion_code(&state, &signed.tenant, &id, off)
        .await
        .map_err(fail)?;
    Ok(see_other(CODES))
}
