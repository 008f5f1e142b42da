//! The Direct-QR function: `POST /v1/qr/fonepay`,
//! `POST /v1/qr/{id}/refresh` and a billing invoice's QR,
//! `POST /v1/billing/invoices/{id}/qr`. A shop counter shows the Fonepay QR on its
//! own screen; the session, its payment, the proof of payment and the
//! webhooks are the hosted flow's (`shared::domain::qr`).

use axum::Router;
use axum::extract::{Extension, State};
use base64::Engine;
use edge::Json;
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, JsonBody, PathId, with_edge};
use http::{HeaderMap, StatusCode};
use serde::Serialize;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::qr::{self, CreateQr, QrError, ShownQr};
use shared::ids::{BillingInvoiceId, SessionId};
use shared::refusal::Refusal;
use shared::time::Timestamp;

/// The function's routes and their description, one value.
pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_fonepay_qr)))
        .routes(idempotent(state, routes!(refresh_qr)))
        .routes(idempotent(state, routes!(billing_invoice_qr)))
}

/// The function's routes, behind the idempotency layer, in the shared edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

/// What the counter shows (snake_case, as the SDKs read it).
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = FonepayQr)]
struct Shown {
    /// The Direct-QR session, `cs_…`: the same on every refresh.
    id: String,
    /// The EMV QR string Fonepay answered: render it yourself, or show
    /// `qr_image`.
    qr_message: String,
    /// `data:image/png;base64,…`: the same QR as a PNG a phone camera
    /// reads.
    qr_image: String,
    /// Server-sent events for the customer's screen: `qr.scanned` (a
    /// hint from Fonepay), `qr.paid` (only once Fonepay confirmed it
    /// server to server), `qr.failed`, `qr.expired`; each has an `id` for
    /// `Last-Event-ID`. No key needed; deployed, on its own host.
    events_url: String,
    /// When the session ends (a QR itself is shown for about 3 minutes:
    /// refresh it).
    expires_at: Timestamp,
    livemode: bool,
}

fn shown(s: ShownQr, events_url: String) -> Result<Shown, ApiError> {
    let qr_image = png_data_url(&s.qr_message).ok_or_else(ApiError::internal)?;
    Ok(Shown {
        events_url,
        id: s.session.id.into(),
        qr_message: s.qr_message,
        qr_image,
        expires_at: s.session.expires_at,
        livemode: s.session.mode.is_live(),
    })
}

/// Create a Direct-QR session: a Fonepay QR for your own screen.
#[utoipa::path(
    post, path = "/v1/qr/fonepay", tag = "Direct-QR", operation_id = "createFonepayQr",
    request_body = CreateQr,
    security(("bearer" = ["payments:write"])),
    responses(
        (status = 201, description = "The session and its QR.", body = Shown),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = Shown),
        (status = 422, description = "Fonepay is not enabled, or the sandbox cap is reached (`provider_unavailable`, `fonepay_sandbox_cap`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_fonepay_qr(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    headers: HeaderMap,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreateQr>, ApiError>,
) -> Result<(StatusCode, Json<Shown>), ApiError> {
    let who = auth.require(Scope::PaymentsWrite)?;
    let JsonBody(body) = body?;
    let base = edge::requests::public_base(&state, &headers);
    let valid = qr::validate(body, who.mode(), &base)?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let now = state.clock.now();
    let s = qr::create(&state, who, valid, &base, now, fence).await?;
    let events = edge::requests::events_url(&state, &headers, &s.session.id);
    Ok((StatusCode::CREATED, Json(shown(s, events)?)))
}

/// A fresh QR for the same session (same `id` and webhooks); the session's
/// lifetime is unchanged.
#[utoipa::path(
    post, path = "/v1/qr/{id}/refresh", tag = "Direct-QR", operation_id = "refreshFonepayQr",
    params(("id" = String, Path, description = "A Direct-QR session id, `cs_…`.")),
    security(("bearer" = ["payments:write"])),
    responses(
        (status = 200, description = "The session and its new QR.", body = Shown),
        (status = 422, description = "The session is final (`session_closed`), or the sandbox cap is reached.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn refresh_qr(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    id: PathId<SessionId>,
) -> Result<Json<Shown>, ApiError> {
    let who = auth.require(Scope::PaymentsWrite)?;
    let base = edge::requests::public_base(&state, &headers);
    // The plan is checked before the session is looked for, as it was.
    qr::entitled(who)?;
    let id = id.get_or(|_, raw| ApiError::from(Refusal::from(QrError::NotFound(raw.into()))))?;
    let s = qr::refresh(&state, who, &id, &base, state.clock.now()).await?;
    let events = edge::requests::events_url(&state, &headers, &s.session.id);
    Ok(Json(shown(s, events)?))
}

/// A billing invoice's Direct-QR: the session's QR and what it pays.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = BillingInvoiceQr)]
struct InvoiceQr {
    #[serde(flatten)]
    shown: Shown,
    /// The billing invoice it pays, `inv_…`.
    invoice_id: String,
    /// Paisa: the invoice's amount due.
    amount: i64,
    currency: shared::money::Currency,
    /// `fonepay`.
    provider: shared::domain::Provider,
    /// The session's status (`initiated` while its QR waits).
    status: shared::domain::checkout::SessionStatus,
}

/// Mint a Fonepay Direct-QR paying a billing invoice: its amount due, and
/// its success pays the invoice (and moves its subscription), as the pay
/// page does. A paid, void or draft invoice is refused; so is an amount
/// above the sandbox Fonepay cap.
#[utoipa::path(
    post, path = "/v1/billing/invoices/{id}/qr", tag = "Billing", operation_id = "createBillingInvoiceQr",
    params(("id" = String, Path, description = "A billing invoice id, `inv_…`.")),
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 201, description = "The session and its QR.", body = InvoiceQr),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = InvoiceQr),
        (status = 403, description = "The key lacks `billing:write` (`missing_scope`) or the plan the billing API (`permission_denied`).", body = edge::openapi::ErrorEnvelope),
        (status = 409, description = "The invoice is paid, void or a draft (`billing_invoice_state_conflict`).", body = edge::openapi::ErrorEnvelope),
        (status = 422, description = "Fonepay is not enabled, or the amount is over the sandbox cap (`provider_unavailable`, `fonepay_sandbox_cap`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn billing_invoice_qr(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    headers: HeaderMap,
    id: PathId<BillingInvoiceId>,
) -> Result<(StatusCode, Json<InvoiceQr>), ApiError> {
    let who = auth.require(Scope::BillingWrite)?;
    shared::domain::billing::customers::entitled(who)?;
    let id = id.get()?;
    let base = edge::requests::public_base(&state, &headers);
    let fence = fence.as_ref().map(|Extension(f)| f);
    let now = state.clock.now();
    let (s, inv) = qr::for_billing_invoice(&state, who, &id, &base, now, fence).await?;
    let events = edge::requests::events_url(&state, &headers, &s.session.id);
    let status = s.session.status_at(now);
    Ok((
        StatusCode::CREATED,
        Json(InvoiceQr {
            shown: shown(s, events)?,
            invoice_id: inv.id.to_string(),
            amount: inv.amount_due,
            currency: inv.currency,
            provider: shared::domain::Provider::Fonepay,
            status,
        }),
    ))
}

/// `text` as a QR in a PNG, as a `data:` URL: black modules on white, 6
/// pixels each, with the 4-module quiet zone readers need. `None` only if
/// `text` is too long for a QR.
pub fn png_data_url(text: &str) -> Option<String> {
    const SCALE: usize = 6;
    const QUIET: usize = 4;
    let code = qrcode::QrCode::new(text.as_bytes()).ok()?;
    let modules = code.width();
    let colors = code.to_colors();
    let side = (modules + 2 * QUIET) * SCALE;
    let mut pixels = vec![255u8; side * side];
    for (i, color) in colors.iter().enumerate() {
        if *color != qrcode::Color::Dark {
            continue;
        }
        let (mx, my) = (i % modules + QUIET, i / modules + QUIET);
        for y in my * SCALE..(my + 1) * SCALE {
            let row = y * side;
            pixels[row + mx * SCALE..row + (mx + 1) * SCALE].fill(0);
        }
    }
    let mut png = Vec::new();
    {
        let side = u32::try_from(side).ok()?;
        let mut encoder = png::Encoder::new(&mut png, side, side);
        encoder.set_color(png::ColorType::Grayscale);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().ok()?;
        writer.write_image_data(&pixels).ok()?;
    }
    Some(format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_is_a_png_of_the_qr_with_its_quiet_zone() {
        let url = png_data_url("000201010212").unwrap_or_default();
        let b64 = url.strip_prefix("data:image/png;base64,").unwrap_or("");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_default();
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap_or_else(|e| panic!("{e}"));
        let mut buf = vec![0; reader.output_buffer_size().unwrap_or(0)];
        let info = reader
            .next_frame(&mut buf)
            .unwrap_or_else(|e| panic!("{e}"));
        // Version 1 is 21 modules, plus 4 each side, 6 px a module.
        assert_eq!((info.width, info.height), (174, 174));
        // The quiet zone is white; the finder pattern's corner is black.
        assert_eq!(buf[0], 255);
        let corner = 4 * 6 * 174 + 4 * 6;
        assert_eq!(buf[corner], 0);
    }

    #[test]
    fn text_too_long_for_a_qr_has_no_image() {
        assert!(png_data_url(&"x".repeat(8000)).is_none());
    }
}
