//! The public link page: the amount a customer may type, counting views, and
//! opening a checkout session that holds one use of the link.

use super::manage::{get_in, text};
use super::{PaymentLink, below_max_uses, held_text};
use crate::app::Deps;
use crate::domain::Tenant;
use crate::domain::checkout::{self, CheckoutError, MAX_AMOUNT_PAISA};
use crate::domain::record::{Changes, Record};
use crate::fields::{Email, PersonName, Phone, Rule};
use crate::ids::{ApiKeyId, LinkId};
use crate::money::Paisa;
use crate::store::{Cond, StoreError, TxOp};
use crate::time::Timestamp;

/// Why the public page could not open a checkout for a link.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("no such payment link")]
    NotFound,
    /// Inactive, expired or used up: the page shows this message.
    #[error("{0}")]
    Unusable(String),
    /// Every use is held by customers at a provider: try again in so many
    /// minutes.
    #[error("{}", held_text(*.0))]
    Held(i64),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the customer typed on the link page.
#[derive(Clone, Debug, Default)]
pub struct LinkCustomer {
    /// NPR as typed (`1500` or `1500.50`), for a link without a fixed amount.
    pub amount: Option<String>,
    pub name: Option<String>,
    pub email: Option<String>,
    pub phone: Option<String>,
}

/// What a customer typed on a link's page, trimmed (blank is none) and
/// held to the field's rule; when nothing was typed, the link's pre-fill
/// if it keeps the rule.
pub(super) fn typed<T: Rule + Into<String>>(
    field: &str,
    typed: Option<String>,
    prefill: Option<&String>,
) -> Result<Option<String>, OpenError> {
    match typed {
        Some(v) => text(Some(v))
            .map(|v| T::parse(v).map(Into::into))
            .transpose()
            .map_err(|message| OpenError::Invalid {
                field: field.to_owned(),
                message: format!("{field} {message}"),
            }),
        // The link's own pre-fill: one stored before a stricter rule is
        // left out rather than refusing every customer of the link.
        None => Ok(text(prefill.cloned()).and_then(|p| T::parse(p).ok().map(Into::into))),
    }
}

/// The message a link shows when it cannot be used.
pub fn inactive_text(link: &PaymentLink) -> String {
    link.inactive_message
        .clone()
        .unwrap_or_else(|| "This payment link is no longer available.".into())
}

/// Counts one view of the public page (an atomic `ADD`).
pub async fn count_view(deps: &Deps, id: &LinkId) -> Result<(), StoreError> {
    match deps
        .store
        .update(
            &PaymentLink::key(id),
            Changes::<PaymentLink>::new()
                .add(PaymentLink::VIEWS, 1)
                .into(),
            Some(Cond::Exists),
        )
        .await
    {
        Ok(_) | Err(StoreError::ConditionFailed) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The amount of a payment through `link`: its fixed amount, or what the
/// customer typed, within the link's bounds and the provider's limits.
fn amount_for(link: &PaymentLink, typed: Option<&str>) -> Result<Paisa, OpenError> {
    let bad = |m: String| OpenError::Invalid {
        field: "amount".into(),
        message: m,
    };
    let paisa = match link.amount {
        Some(a) => a.get(),
        None => {
            let t = typed
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| bad("Enter an amount.".into()))?;
            crate::providers::amount::parse_rupees(t)
                .map_err(|_| {
                    bad(format!(
                        "{t:?} is not an amount in rupees (e.g. 1500 or 1500.50)"
                    ))
                })?
                .get()
        }
    };
    let (min, max) = (
        link.min_amount.unwrap_or(1),
        link.max_amount.unwrap_or(MAX_AMOUNT_PAISA),
    );
    if link.amount.is_none() && (paisa < min || paisa > max) {
        return Err(bad(format!(
            "Enter an amount from {} to {}.",
            Paisa::new(min).unwrap_or_default().display_npr(),
            Paisa::new(max).unwrap_or_default().display_npr()
        )));
    }
    checkout::check_amount(paisa, link.provider, link.mode).map_err(|e| match e {
        CheckoutError::Invalid { message, .. } => bad(message),
        CheckoutError::FonepaySandboxCap(m) => bad(m),
        other => bad(other.to_string()),
    })
}

/// Opens a checkout session for a customer of `link`. The session takes no
/// use of the link: its attempt does ([`claim_op`](super::claim_op), in the attempt's
/// transaction), so opening the page again and again holds nothing. The
/// session is refused while the link is used up (checked in the same
/// transaction) or every use is held.
pub async fn open_session(
    deps: &Deps,
    link_id: &LinkId,
    customer: LinkCustomer,
    base: &str,
    now: Timestamp,
) -> Result<checkout::CheckoutSession, OpenError> {
    let store = &*deps.store;
    let link = get_in(store, link_id).await?.ok_or(OpenError::NotFound)?;
    if link.unusable(now).is_some() {
        return Err(OpenError::Unusable(inactive_text(&link)));
    }
    if let Some(minutes) = link.held(now) {
        return Err(OpenError::Held(minutes));
    }
    let amount = amount_for(&link, customer.amount.as_deref())?;
    let valid = checkout::ValidCheckout {
        amount,
        return_url: link
            .redirect_url
            .clone()
            .unwrap_or_else(|| format!("{base}/l/{}/thanks", link.id)),
        cancel_url: Some(format!("{base}/l/{}", link.id)),
        provider: link.provider,
        flow: checkout::Flow::Hosted,
        description: Some(link.title.clone()),
        metadata: link.metadata.clone(),
        customer_name: typed::<PersonName>(
            "customerName",
            customer.name,
            link.customer_name.as_ref(),
        )?,
        customer_email: typed::<Email>(
            "customerEmail",
            customer.email,
            link.customer_email.as_ref(),
        )?,
        customer_phone: typed::<Phone>(
            "customerPhone",
            customer.phone,
            link.customer_phone.as_ref(),
        )?,
        customer_address: link.customer_address.clone(),
        collect_address: link.collect_address,
        client_secret_sha256: None,
    };
    let creator = checkout::Creator {
        project_id: link.project_id.clone(),
        mode: link.mode,
        // Not a key: the link stands for one, as stored since links began.
        api_key_id: ApiKeyId::stored(format!("link:{}", link.id)),
        spend_cap_paisa: None,
    };
    let mut session = checkout::new_session(&creator, valid, now);
    session.link_id = Some(link.id.clone());
    let left = below_max_uses(link.max_uses, PaymentLink::USED_COUNT);
    let mut ops = vec![
        TxOp::Check {
            key: PaymentLink::key(&link.id),
            cond: Cond::And(vec![Cond::Exists, PaymentLink::ACTIVE.eq(&true), left]),
        },
        session.put_new()?,
    ];
    // The day's counters, in the same transaction.
    let mut tally = checkout::stats::Tally::new();
    tally.session_created(&session);
    tally.apply_to(&mut ops)?;
    ops.extend(session.insert_counts());
    crate::domain::active::touch(
        store,
        &Tenant::new(session.project_id.clone(), session.mode),
        now,
    )
    .await?;
    for attempt in 0..6u64 {
        match store.transact(ops.clone()).await {
            Ok(()) => return Ok(session),
            // Busy (views, other customers): try again.
            Err(StoreError::TransactionCanceled { reasons })
                if !reasons.contains(&crate::store::TxReason::ConditionFailed) =>
            {
                let pause = 5 + 10 * attempt + rand::random::<u64>() % 20;
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
            Err(StoreError::TransactionCanceled { .. }) => {
                let now_link = get_in(store, link_id).await?.ok_or(OpenError::NotFound)?;
                return Err(OpenError::Unusable(inactive_text(&now_link)));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Unavailable("the payment link is busy; try again".into()).into())
}
