//! Direct-QR (Fonepay): a checkout session of flow `qr` whose Fonepay QR
//! the merchant shows on its own screen (a shop counter's tablet) instead
//! of sending the customer to our hosted page (docs/decisions-refined.md,
//! "Direct-QR"). The session and its payments are the hosted flow's: the
//! same attempt start (Fonepay's QR API, the sandbox caps), the same
//! server-to-server proof before a payment succeeds, the same webhooks.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::account::{Plan, Principal};
use super::attempts::{self, AttemptError, PayChoice};
use super::billing::invoice::collect::{self, CollectError};
use super::billing::invoice::{self, BillingInvoice};
use super::checkout::{
    self, CheckoutError, CheckoutSession, Creator, CustomerInput, Flow, SessionStatus,
    ValidCheckout,
};
use super::{Mode, Provider};
use crate::app::Deps;
use crate::fields::Description;
use crate::ids::{BillingInvoiceId, PaymentId, SessionId};
use crate::money::Currency;
use crate::providers::Handoff;
use crate::refusal::{Kind, Refusal};
use crate::store::StoreError;
use crate::store::fence::Fence;
use crate::time::Timestamp;

/// The entitlement a plan needs for Direct-QR, as the envelope names it.
pub const ENTITLEMENT: &str = "fonepay.directQr";

/// The body of `POST /v1/qr/fonepay`. Unknown fields refused.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateFonepayQr)]
pub struct CreateQr {
    /// Paisa; Fonepay's bounds for this mode apply (`GET /v1/providers`).
    #[schema(minimum = 1)]
    pub amount: i64,
    #[serde(default)]
    pub currency: Option<Currency>,
    #[serde(default)]
    pub description: Option<Description>,
    #[serde(default)]
    pub customer: Option<CustomerInput>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

/// Why a Direct-QR operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum QrError {
    /// The merchant's plan does not include Direct-QR.
    #[error("Direct-QR is not in the {0:?} plan; it is in every paid plan")]
    NotEntitled(Plan),
    /// No Direct-QR session `id` for this project and mode.
    #[error("no such Direct-QR session")]
    NotFound(String),
    /// The session is final: no new QR.
    #[error("this Direct-QR session is {}: create a new one", .0.as_str())]
    Closed(SessionStatus),
    #[error(transparent)]
    Checkout(#[from] CheckoutError),
    #[error(transparent)]
    Attempt(#[from] AttemptError),
    #[error(transparent)]
    BillingInvoice(#[from] CollectError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<QrError> for Refusal {
    fn from(err: QrError) -> Self {
        match err {
            e @ QrError::NotEntitled(_) => Refusal::forbidden("permission_denied", e.to_string())
                .with_extra("entitlement", Value::from(ENTITLEMENT)),
            QrError::NotFound(id) => Refusal::not_found("Direct-QR session", &id),
            e @ QrError::Closed(_) => Refusal::unprocessable("session_closed", e.to_string()),
            QrError::Checkout(e) => e.into(),
            QrError::Attempt(AttemptError::NotFound) => Refusal::not_found("Direct-QR session", ""),
            QrError::Attempt(AttemptError::Provider(e)) => Refusal::new(
                Kind::Unavailable,
                "provider_error",
                format!("Fonepay did not give a QR ({e}); retry with the same Idempotency-Key"),
            ),
            QrError::Attempt(e) => e.into(),
            QrError::BillingInvoice(e) => e.into(),
            QrError::Store(e) => e.into(),
        }
    }
}

/// Checks a create request (no store needed). `base`: our public base URL,
/// the session's return address (a counter has no shop page to return to).
pub fn validate(req: CreateQr, mode: Mode, base: &str) -> Result<ValidCheckout, CheckoutError> {
    let as_own_page = super::mobile::CreateMobileSession {
        amount: req.amount,
        provider: Some(Provider::Fonepay),
        currency: req.currency,
        description: req.description,
        metadata: req.metadata,
        customer: req.customer,
        collect_address: None,
    };
    super::mobile::validate_for(Flow::Qr, as_own_page, mode, base)
}

/// A session and the QR of its open payment.
#[derive(Clone, Debug)]
pub struct ShownQr {
    pub session: CheckoutSession,
    pub qr_message: String,
}

/// Creates the session and its first QR. A retry of the same request
/// (its fence) finds the session the first run made, and its QR if that
/// run got one.
pub async fn create(
    state: &Deps,
    who: &Principal,
    valid: ValidCheckout,
    base: &str,
    now: Timestamp,
    fence: Option<&Fence>,
) -> Result<ShownQr, QrError> {
    create_bound(state, who, valid, None, base, now, fence).await
}

/// [`create`] of a session bound to a billing invoice (`billing`): its
/// success pays the invoice ([`crate::domain::billing::invoice::collect`]).
pub async fn create_bound(
    state: &Deps,
    who: &Principal,
    valid: ValidCheckout,
    billing: Option<BillingInvoiceId>,
    base: &str,
    now: Timestamp,
    fence: Option<&Fence>,
) -> Result<ShownQr, QrError> {
    if !who.merchant.plan.direct_qr() {
        return Err(QrError::NotEntitled(who.merchant.plan));
    }
    let session =
        checkout::create_bound_in(&*state.store, &Creator::of(who), valid, billing, now, fence)
            .await?;
    if let Some(shown) = open_qr(state, &session).await? {
        return Ok(shown);
    }
    new_qr(state, session, base, now).await
}

/// A Direct-QR session of the amount due of the tenant's billing invoice
/// `id` (`POST /v1/billing/invoices/{id}/qr`), through [`create_bound`]:
/// the plan check, the sandbox Fonepay cap, Fonepay's QR API. Its success
/// pays the invoice. A paid, void or draft invoice is refused
/// (`billing_invoice_state_conflict`).
pub async fn for_billing_invoice(
    state: &Deps,
    who: &Principal,
    id: &BillingInvoiceId,
    base: &str,
    now: Timestamp,
    fence: Option<&Fence>,
) -> Result<(ShownQr, BillingInvoice), QrError> {
    let inv = invoice::get_invoice(state, who.tenant(), id)
        .await
        .map_err(CollectError::from)?;
    collect::payable(&inv)?;
    let mut metadata = Map::new();
    metadata.insert("billing_invoice_id".into(), Value::from(inv.id.to_string()));
    metadata.insert("invoice_number".into(), Value::from(inv.number.clone()));
    let request = CreateQr {
        amount: inv.amount_due,
        currency: Some(inv.currency),
        description: Description::parse(collect::description(&inv)).ok(),
        customer: None,
        metadata: Some(metadata),
    };
    let valid = validate(request, inv.mode, base)?;
    let shown = create_bound(state, who, valid, Some(inv.id.clone()), base, now, fence).await?;
    Ok((shown, inv))
}

/// Refuses a merchant whose plan has no Direct-QR (checked before any
/// lookup, so the answer does not depend on the session asked for).
pub fn entitled(who: &Principal) -> Result<(), QrError> {
    if who.merchant.plan.direct_qr() {
        Ok(())
    } else {
        Err(QrError::NotEntitled(who.merchant.plan))
    }
}

/// A fresh QR for the same session (a Fonepay QR is shown for about three
/// minutes): the open payment is superseded by a new one.
pub async fn refresh(
    state: &Deps,
    who: &Principal,
    id: &SessionId,
    base: &str,
    now: Timestamp,
) -> Result<ShownQr, QrError> {
    entitled(who)?;
    let session = checkout::find_at(&*state.store, who.tenant(), id, now)
        .await?
        .filter(|s| s.flow == Flow::Qr)
        .ok_or_else(|| QrError::NotFound(id.to_string()))?;
    let status = session.status_at(now);
    if status.is_final() {
        return Err(QrError::Closed(status));
    }
    new_qr(state, session, base, now).await
}

/// The QR of the session's open payment, if it has one.
async fn open_qr(state: &Deps, session: &CheckoutSession) -> Result<Option<ShownQr>, QrError> {
    let Some(payment_id) = session.payment_id.clone() else {
        return Ok(None);
    };
    let sid = session.id.clone();
    let payment = attempts::find_payment(state, &sid, &payment_id).await?;
    Ok(payment
        .filter(|p| p.status == super::payments::PaymentStatus::Pending)
        .and_then(|p| p.attempt.qr_message)
        .map(|qr_message| ShownQr {
            session: session.clone(),
            qr_message,
        }))
}

async fn new_qr(
    state: &Deps,
    session: CheckoutSession,
    base: &str,
    now: Timestamp,
) -> Result<ShownQr, QrError> {
    let choice = PayChoice {
        provider: Some(Provider::Fonepay),
        fonepay_web: false,
        address: None,
        from_page: false,
    };
    let started = attempts::start_for(state, session, choice, base, now).await?;
    match started.handoff {
        Handoff::Qr { qr_message, .. } => Ok(ShownQr {
            session: started.session,
            qr_message,
        }),
        _ => Err(QrError::Attempt(AttemptError::NotOffered(
            "Fonepay did not answer with a QR".into(),
        ))),
    }
}

/// One event of a Direct-QR session's stream (`/c/{id}/events`).
#[derive(Clone, Debug, PartialEq)]
pub struct StreamEvent {
    /// Its SSE `id:` line: unique per session and outcome, so
    /// `Last-Event-ID` resumes without loss or repeat.
    pub tag: String,
    /// `qr.scanned`, `qr.paid`, `qr.failed` or `qr.expired`.
    pub kind: &'static str,
    pub data: Value,
    /// After it the stream ends: the session is final, or its current
    /// payment failed and nothing can be paid until another attempt (a
    /// mobile app starts one and opens a new stream).
    pub last: bool,
}

/// The events the session's state shows now. A payment is `qr.paid` only
/// once the session is `success`, which only a server-to-server check
/// makes it; a failed payment is `qr.failed` (the counter may refresh);
/// a session past its time is `qr.expired`.
pub fn stream_events(
    session: &CheckoutSession,
    payment: Option<&super::payments::Payment>,
    now: Timestamp,
) -> Vec<StreamEvent> {
    use super::payments::PaymentStatus;
    let payment_id = payment.map(|p| p.id.clone());
    let data = |status: &str| {
        serde_json::json!({
            "id": session.id,
            "payment_id": payment_id,
            "amount": session.amount.get(),
            "status": status,
        })
    };
    let on_payment = |what: &str| format!("{}:{what}", payment_id.as_deref().unwrap_or("none"));
    // The scan comes first whatever followed, so a screen that missed it
    // still sees it once (its id is the payment's).
    // A failed or cancelled payment's scan is over: not told again.
    let mut out: Vec<StreamEvent> = payment
        .filter(|p| p.scanned_at.is_some())
        .filter(|p| !matches!(p.status, PaymentStatus::Failed | PaymentStatus::Cancelled))
        .map(|_| StreamEvent {
            tag: on_payment("scanned"),
            kind: "qr.scanned",
            data: data("scanned"),
            last: false,
        })
        .into_iter()
        .collect();
    let outcome = match session.status_at(now) {
        SessionStatus::Success => vec![StreamEvent {
            tag: on_payment("paid"),
            kind: "qr.paid",
            data: data("success"),
            last: true,
        }],
        SessionStatus::Failed => vec![StreamEvent {
            tag: on_payment("failed"),
            kind: "qr.failed",
            data: data("failed"),
            last: true,
        }],
        SessionStatus::Expired => vec![StreamEvent {
            tag: format!("{}:expired", session.id),
            kind: "qr.expired",
            data: data("expired"),
            last: true,
        }],
        SessionStatus::Pending | SessionStatus::Initiated => match payment {
            Some(p) if p.status == PaymentStatus::Failed => vec![StreamEvent {
                tag: on_payment("failed"),
                kind: "qr.failed",
                data: data("failed"),
                last: true,
            }],
            _ => Vec::new(),
        },
    };
    out.extend(outcome);
    out
}

/// Records that Fonepay's websocket saw the customer scan the QR of open
/// payment `payment_id` (a hint: the screen shows it; nothing is judged on
/// it). Once per payment; `false` when it was already recorded or the
/// payment is no longer open.
pub async fn record_scan(
    deps: &Deps,
    payment_id: &PaymentId,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let store = &*deps.store;
    use super::payments::{Payment, PaymentStatus};
    use super::record::Changes;
    use crate::store::Cond;
    let cond = Cond::And(vec![
        Cond::Exists,
        Payment::SCANNED_AT.missing(),
        Payment::STATUS.eq(&PaymentStatus::Pending),
    ]);
    let update = Changes::<Payment>::new().set_some(Payment::SCANNED_AT, &now);
    match store
        .update(&Payment::key(payment_id), update.into(), Some(cond))
        .await
    {
        Ok(_) => Ok(true),
        Err(StoreError::ConditionFailed) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(amount: i64) -> CreateQr {
        CreateQr {
            amount,
            currency: None,
            description: None,
            customer: None,
            metadata: None,
        }
    }

    #[test]
    fn a_qr_session_pays_with_fonepay_by_qr_within_fonepays_bounds() {
        let v = validate(body(50_000), Mode::Sandbox, "http://127.0.0.1:8080").unwrap();
        assert_eq!(v.flow, Flow::Qr);
        assert_eq!(v.provider, Some(Provider::Fonepay));
        assert_eq!(v.return_url, "http://127.0.0.1:8080");
        assert!(!v.collect_address);
        assert!(validate(body(0), Mode::Sandbox, "x").is_err());
        // Sandbox Fonepay is capped at NPR 1,000 a payment.
        assert!(matches!(
            validate(body(100_001), Mode::Sandbox, "x"),
            Err(CheckoutError::FonepaySandboxCap(_))
        ));
    }

    #[test]
    fn every_paid_plan_has_direct_qr() {
        assert!(!Plan::Free.direct_qr());
        assert!(Plan::Growth.direct_qr());
        assert!(Plan::Pro.direct_qr());
    }

    fn session(status: SessionStatus) -> CheckoutSession {
        let now = crate::testenv::at("2026-11-26T10:00:00Z");
        serde_json::from_value(serde_json::json!({
            "id": "cs_01", "project_id": "prj_1", "mode": "sandbox", "flow": "qr",
            "api_key_id": "key_1",
            "amount": 50000, "currency": "NPR", "provider": "fonepay",
            "status": status.as_str(), "return_url": "http://x", "metadata": {},
            "expires_at": now.plus(chrono::Duration::minutes(30)).to_rfc3339(),
            "created_at": now.to_rfc3339(), "updated_at": now.to_rfc3339(),
            "payment_id": "pay_1",
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_stream_shows_only_what_the_state_proves() {
        let now = crate::testenv::at("2026-11-26T10:01:00Z");
        let open = session(SessionStatus::Initiated);
        assert!(stream_events(&open, None, now).is_empty());
        let paid = stream_events(&session(SessionStatus::Success), None, now);
        assert_eq!(paid.len(), 1);
        assert_eq!((paid[0].kind, paid[0].last), ("qr.paid", true));
        let failed = stream_events(&session(SessionStatus::Failed), None, now);
        assert_eq!((failed[0].kind, failed[0].last), ("qr.failed", true));
        // Past its time an open session is expired, whatever is stored.
        let later = now.plus(chrono::Duration::hours(1));
        let expired = stream_events(&open, None, later);
        assert_eq!(expired[0].kind, "qr.expired");
        assert_eq!(expired[0].tag, "cs_01:expired");
    }

    #[tokio::test]
    async fn a_scan_is_told_once_before_whatever_follows() {
        use crate::domain::payments::{Payment, PaymentStatus};
        let now = crate::testenv::at("2026-11-26T10:01:00Z");
        let store = crate::testenv::memory_store();
        let st = crate::AppState::new(
            store.clone(),
            std::sync::Arc::new(crate::time::ManualClock::new(now)),
            crate::Config {
                public_base_url: "https://pay.example".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        );
        let mut p: Payment = serde_json::from_value(serde_json::json!({
            "id": "pay_1", "project_id": "prj_1", "checkout_session_id": "cs_01",
            "mode": "sandbox", "amount": 50000, "currency": "NPR", "provider": "fonepay",
            "status": "pending", "created_at": now.to_rfc3339(), "updated_at": now.to_rfc3339(),
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let item = crate::domain::record::Record::to_item(&p).unwrap_or_else(|e| panic!("{e}"));
        store
            .put(item, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            record_scan(&st, &"pay_1".into(), now)
                .await
                .unwrap_or(false)
        );
        // Once only; an unknown payment is no error.
        assert!(!record_scan(&st, &"pay_1".into(), now).await.unwrap_or(true));
        assert!(!record_scan(&st, &"pay_x".into(), now).await.unwrap_or(true));
        let stored = store
            .get(&Payment::key(&"pay_1".into()))
            .await
            .ok()
            .flatten()
            .and_then(|i| crate::domain::record::from_item::<Payment>(i).ok());
        assert_eq!(stored.and_then(|p| p.scanned_at), Some(now));

        let open = session(SessionStatus::Initiated);
        assert!(stream_events(&open, Some(&p), now).is_empty());
        p.scanned_at = Some(now);
        let e = stream_events(&open, Some(&p), now);
        assert_eq!(e.len(), 1);
        assert_eq!(
            (e[0].kind, e[0].tag.as_str(), e[0].last),
            ("qr.scanned", "pay_1:scanned", false)
        );
        p.status = PaymentStatus::Success;
        let e = stream_events(&session(SessionStatus::Success), Some(&p), now);
        let kinds: Vec<&str> = e.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["qr.scanned", "qr.paid"]);
        assert!(e[1].last);
        // Once it failed, a reconnecting screen is not told "scanned".
        p.status = PaymentStatus::Failed;
        let e = stream_events(&open, Some(&p), now);
        let kinds: Vec<&str> = e.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["qr.failed"]);
        // Nothing is payable until another attempt: the stream ends.
        assert!(e[0].last);
    }

    #[test]
    fn the_refusals_say_what_the_contract_says() {
        let r: Refusal = QrError::NotEntitled(Plan::Free).into();
        assert_eq!((r.kind, r.code), (Kind::Forbidden, "permission_denied"));
        assert_eq!(r.extra, Some(("entitlement", Value::from(ENTITLEMENT))));
        let r: Refusal = QrError::Closed(SessionStatus::Success).into();
        assert_eq!((r.kind, r.code), (Kind::Unprocessable, "session_closed"));
        let r: Refusal = QrError::NotFound("cs_x".into()).into();
        assert_eq!(r.kind, Kind::NotFound);
    }
}
