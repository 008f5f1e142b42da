//! The provider sends the browser back: the return is verified before it
//! triggers a server-to-server check, and never decides anything itself.

use super::review::hold_for_review;
use super::settle::check_and_apply;
use super::start::payment_of;
use super::sweep::claim_check;
use super::{AttemptError, POLL_CHECK_EVERY, is_open};
use crate::app::Deps;
use crate::domain::Provider;
use crate::domain::checkout::{self, CheckoutSession};
use crate::domain::payments::{Payment, PaymentStatus};
use crate::domain::record::word;
use crate::ids::{PaymentId, SessionId};
use crate::providers::{self, esewa, fonepay, khalti};
use crate::time::Timestamp;

/// Which way the provider sent the customer back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReturnKind {
    /// eSewa `success_url`, Khalti `return_url`, Fonepay `RU`.
    Ok,
    /// eSewa `failure_url`.
    Fail,
}

/// Why a return was not believed (logged; nothing changes), and whether
/// a person must look (a genuine return saying another amount was paid).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Distrust {
    pub reason: String,
    pub review: bool,
}

impl Distrust {
    fn new(reason: impl Into<String>) -> Self {
        Distrust {
            reason: reason.into(),
            review: false,
        }
    }
}

/// Checks the provider's browser return for `payment`. `Ok(())`: worth a
/// server-to-server check now. `Err`: tampered, replayed onto another
/// attempt, or for another amount.
pub(super) fn verify_return(
    payment: &Payment,
    creds: &providers::ProviderCredentials,
    kind: ReturnKind,
    params: &str,
) -> Result<(), Distrust> {
    let reference = payment.attempt.reference.as_deref().unwrap_or_default();
    match payment.provider {
        Provider::Esewa => {
            let data = form_urlencoded::parse(params.trim_start_matches('?').as_bytes())
                .find(|(k, _)| k == "data")
                .map(|(_, v)| v.into_owned());
            match (kind, data) {
                // eSewa's failure redirect carries nothing to verify.
                (ReturnKind::Fail, None) => Ok(()),
                (_, None) => Err(Distrust::new("eSewa return without data")),
                (_, Some(data)) => {
                    let cb = esewa::verify_callback(creds, &data)
                        .map_err(|e| Distrust::new(format!("eSewa data: {e}")))?;
                    if cb.transaction_uuid != reference {
                        return Err(Distrust::new(format!(
                            "eSewa data names attempt {}, not ours",
                            providers_clip(&cb.transaction_uuid)
                        )));
                    }
                    if cb.total_amount != payment.amount {
                        return Err(Distrust::new(format!(
                            "eSewa data says {} paisa, the payment is {}",
                            cb.total_amount.get(),
                            payment.amount.get()
                        )));
                    }
                    Ok(())
                }
            }
        }
        Provider::Khalti => {
            let r = khalti::parse_return(params);
            let token = payment.attempt.provider_token.as_deref();
            if r.pidx.is_none() || r.pidx.as_deref() != token {
                return Err(Distrust::new("Khalti return names another pidx"));
            }
            if let Some(order) = &r.purchase_order_id {
                if order != reference {
                    return Err(Distrust::new("Khalti return names another order"));
                }
            }
            if let Some(amount) = r.amount {
                if amount != payment.amount {
                    return Err(Distrust::new(format!(
                        "Khalti return says {} paisa, the payment is {}",
                        amount.get(),
                        payment.amount.get()
                    )));
                }
            }
            Ok(())
        }
        Provider::Fonepay => {
            let r = fonepay::verify_web_return(creds, params)
                .map_err(|e| Distrust::new(format!("Fonepay return: {e}")))?;
            if r.prn != reference {
                return Err(Distrust::new("Fonepay return names another PRN"));
            }
            if r.requested_amount != payment.amount {
                return Err(Distrust::new(format!(
                    "Fonepay return says {} paisa requested, the payment is {}",
                    r.requested_amount.get(),
                    payment.amount.get()
                )));
            }
            if r.paid && r.paid_amount != payment.amount {
                // Signed by Fonepay: the customer really paid another
                // amount (a discount). Never success without a person.
                return Err(Distrust {
                    reason: format!(
                        "Fonepay says {} paisa were paid for a payment of {}",
                        r.paid_amount.get(),
                        payment.amount.get()
                    ),
                    review: true,
                });
            }
            Ok(())
        }
    }
}

fn providers_clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// The provider sent the customer back: verify the return, then ask the
/// provider. Answers the session and the payment as they now stand.
///
/// Proof: the return itself proves nothing (a browser carries it). It is
/// checked first ([`verify_return`]: eSewa's signature over `status`,
/// `total_amount`, `transaction_uuid` and product code with our amount and
/// reference; Khalti's `pidx`, `purchase_order_id` and amount as ours;
/// Fonepay's DV over our PRN and amount), and only a return that passes
/// triggers the server-to-server check whose answer [`decide`](super::settle::decide) judges. A
/// tampered return changes nothing, or (a signed Fonepay return for
/// another amount) holds the payment for review.
pub async fn on_return(
    state: &Deps,
    session_id: &SessionId,
    payment_id: &PaymentId,
    kind: ReturnKind,
    params: &str,
    now: Timestamp,
) -> Result<(CheckoutSession, Payment), AttemptError> {
    let store = &*state.store;
    let payment = payment_of(store, session_id, payment_id)
        .await?
        .ok_or(AttemptError::NotFound)?;
    let mut payment = payment;
    // A cancelled payment may still be paid (the customer finished at the
    // provider after the cancel): its return is checked like an open one.
    // A payment held for review waits for a person: a return changes
    // nothing (and asks the provider nothing).
    let reviewable = payment.checks.review.is_none();
    if reviewable && (is_open(payment.status) || payment.status == PaymentStatus::Cancelled) {
        let creds = crate::domain::credentials::for_payment(state, &payment).await?;
        match verify_return(&payment, &creds, kind, params) {
            // One provider check per payment every few seconds, however
            // often the return is replayed.
            Ok(()) => match claim_check(store, &payment, now, POLL_CHECK_EVERY).await? {
                true => match check_and_apply(state, &payment, Some(kind), now).await {
                    Ok(p) => payment = p,
                    Err(e) => {
                        tracing::warn!(payment = %payment.id, error = %e, "status check failed; the reconciler will retry");
                    }
                },
                false => {
                    tracing::info!(payment = %payment.id, "return within seconds of the last check: not asking the provider again");
                }
            },
            Err(d) if d.review => {
                tracing::error!(
                    payment = %payment.id,
                    provider = payment.provider.as_str(),
                    reason = %d.reason,
                    "payment needs review: held as processing"
                );
                payment = hold_for_review(store, &payment, &d.reason, now).await?;
            }
            Err(d) => {
                tracing::warn!(
                    payment = %payment.id,
                    provider = payment.provider.as_str(),
                    reason = %d.reason,
                    "provider return not believed; payment left for the reconciler"
                );
            }
        }
    } else {
        tracing::info!(payment = %payment.id, status = %word(&payment.status), "return for a settled payment (replay or reload): nothing to do");
    }
    let session = checkout::find_any_at(store, &session_id.to_owned(), now)
        .await?
        .ok_or(AttemptError::NotFound)?;
    Ok((session, payment))
}
