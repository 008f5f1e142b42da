//! Short pay links (`/r/<token>`, issue 39 part 6): a Nepali SMS must fit
//! two UCS-2 segments, so a reminder's pay URL is at most
//! [`MAX_PAY_URL_CHARS`] characters; the bill page's `/b/<invoice id>` is
//! longer. A target (a billing invoice, or a subscription in its trial)
//! gets one token, made once and kept:
//!
//! - the token item `SHORT#<token>` / `SHORT` ([`ShortLink`]): what the
//!   route reads;
//! - a back-pointer beside its target, `BINV#<id>` / `SHORT` or
//!   `SUB#<id>` / `SHORT` ([`ShortBack`]): what [`ensure`] reads to hand
//!   out the same token again.
//!
//! Both are written in one transaction conditioned on neither existing:
//! two callers racing for one target get one token (the loser reads the
//! winner's), and a token drawn twice (about 59 random bits each) is drawn
//! again. Tokens are global, like the ids they stand for: the page a
//! token opens shows that target only.
//!
//! [`MAX_PAY_URL_CHARS`]: crate::domain::billing::reminders::MAX_PAY_URL_CHARS

use chrono::NaiveDate;
use rand::TryRngCore;
use serde::{Deserialize, Serialize};

use crate::Deps;
use crate::domain::account;
use crate::domain::billing::calendar;
use crate::domain::billing::invoice::BillingInvoice;
use crate::domain::billing::subscription::Subscription;
use crate::domain::record::{self, Record};
use crate::domain::{Mode, Tenant};
use crate::ids::{BillingInvoiceId, ProjectId, SubscriptionId};
use crate::money::Currency;
use crate::store::{Key, StoreError, TxReason};
use crate::time::Timestamp;

/// Characters of a token.
pub const TOKEN_LEN: usize = 10;
/// The path a token is served under (`<base>/r/<token>`).
pub const PATH: &str = "/r/";
/// Writes [`ensure`] tries before it gives up (token collisions and
/// conflicting transactions each take one).
const TRIES: usize = 16;

const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// What a token opens.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum ShortTarget {
    /// A billing invoice: the token redirects to its bill page (`/b/<id>`).
    Invoice(BillingInvoiceId),
    /// A subscription in its trial: the token shows what it will bill and
    /// when.
    Subscription(SubscriptionId),
}

impl ShortTarget {
    /// The back-pointer's key, beside the target's own item.
    pub fn back_key(&self) -> Key {
        match self {
            ShortTarget::Invoice(id) => Key::new(format!("BINV#{id}"), "SHORT"),
            ShortTarget::Subscription(id) => Key::new(format!("SUB#{id}"), "SHORT"),
        }
    }

    /// The target's own record key (checked to be the tenant's before a
    /// token is made).
    fn record_key(&self) -> Key {
        match self {
            ShortTarget::Invoice(id) => BillingInvoice::key(id),
            ShortTarget::Subscription(id) => Subscription::key(id),
        }
    }

    fn describe(&self) -> String {
        match self {
            ShortTarget::Invoice(id) => format!("billing invoice {id}"),
            ShortTarget::Subscription(id) => format!("subscription {id}"),
        }
    }
}

/// A token and what it opens (stored kind "short link").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShortLink {
    pub token: String,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub target: ShortTarget,
    pub created_at: Timestamp,
}

impl ShortLink {
    pub fn key(token: &str) -> Key {
        Key::new(format!("SHORT#{token}"), "SHORT")
    }

    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }

    /// `<base>/r/<token>`.
    pub fn url(&self, base: &str) -> String {
        url(base, &self.token)
    }
}

impl Record for ShortLink {
    fn item_key(&self) -> Key {
        ShortLink::key(&self.token)
    }
}

/// The same link stored beside its target (stored kind "short link
/// pointer"): how [`ensure`] finds a target's token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ShortBack(pub ShortLink);

impl Record for ShortBack {
    fn item_key(&self) -> Key {
        self.0.target.back_key()
    }
}

/// `<base>/r/<token>`, `base` without its trailing slash.
pub fn url(base: &str, token: &str) -> String {
    format!("{}{PATH}{token}", base.trim_end_matches('/'))
}

/// How long a short link is on `base` ([`url`] of a whole token), when
/// that is over [`MAX_PAY_URL_CHARS`] (a reminder's SMS would not fit its
/// two segments): the deployer should serve the pages on a shorter host.
/// `None` when it fits, or when no base is configured (each request's own
/// host is used then).
pub fn too_long_on(base: &str) -> Option<usize> {
    use crate::domain::billing::reminders::MAX_PAY_URL_CHARS;
    let n = url(base, &"x".repeat(TOKEN_LEN)).chars().count();
    (!base.is_empty() && n > MAX_PAY_URL_CHARS).then_some(n)
}

/// Whether `token` could be one: exactly [`TOKEN_LEN`] ASCII letters and
/// digits.
pub fn is_token(token: &str) -> bool {
    token.len() == TOKEN_LEN && token.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// A fresh token from the operating system's random source: each
/// character uniform over the 62 letters and digits (bytes of 248 and up
/// are drawn again, so no character is likelier).
pub fn new_token() -> Result<String, StoreError> {
    let mut out = String::with_capacity(TOKEN_LEN);
    let mut buf = [0u8; 32];
    while out.len() < TOKEN_LEN {
        rand::rngs::OsRng
            .try_fill_bytes(&mut buf)
            .map_err(|e| StoreError::Backend(format!("no randomness for a short link: {e}")))?;
        for b in buf {
            if out.len() == TOKEN_LEN {
                break;
            }
            if usize::from(b) < ALPHABET.len() * 4 {
                out.push(char::from(ALPHABET[usize::from(b) % ALPHABET.len()]));
            }
        }
    }
    Ok(out)
}

/// The target's one token, made the first time it is asked for. The
/// target must be the tenant's (else [`StoreError::Invalid`], nothing
/// written). Racing callers all answer the same token.
pub async fn ensure(
    deps: &Deps,
    tenant: &Tenant,
    target: &ShortTarget,
) -> Result<ShortLink, StoreError> {
    ensure_drawing(deps, tenant, target, new_token).await
}

/// [`ensure`], its tokens drawn by `draw` (tests draw a taken one).
async fn ensure_drawing(
    deps: &Deps,
    tenant: &Tenant,
    target: &ShortTarget,
    mut draw: impl FnMut() -> Result<String, StoreError>,
) -> Result<ShortLink, StoreError> {
    let store = &*deps.store;
    let mut checked = false;
    for attempt in 0..TRIES {
        if let Some(ShortBack(link)) = record::get::<ShortBack>(store, &target.back_key()).await? {
            return owned(tenant, target, link);
        }
        if !checked {
            target_is_tenants(deps, tenant, target).await?;
            checked = true;
        }
        let link = ShortLink {
            token: draw()?,
            project_id: tenant.project.clone(),
            mode: tenant.mode,
            target: target.clone(),
            created_at: deps.clock.now(),
        };
        let ops = vec![link.put_new()?, ShortBack(link.clone()).put_new()?];
        match store.transact(ops).await {
            Ok(()) => return Ok(link),
            Err(StoreError::TransactionCanceled { reasons }) => {
                let back_taken = matches!(reasons.get(1), Some(TxReason::ConditionFailed));
                let token_taken = matches!(reasons.first(), Some(TxReason::ConditionFailed));
                if back_taken {
                    // Another caller made the target's token: read it.
                    continue;
                }
                if token_taken {
                    tracing::warn!("a short link token was drawn twice; drawing again");
                    continue;
                }
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Unavailable(format!(
        "the short link of {} was contended too long; retry",
        target.describe()
    )))
}

fn owned(tenant: &Tenant, target: &ShortTarget, link: ShortLink) -> Result<ShortLink, StoreError> {
    if tenant.owns(link.project_id.as_str(), link.mode) {
        Ok(link)
    } else {
        Err(StoreError::Invalid(format!(
            "{} is not this project's",
            target.describe()
        )))
    }
}

async fn target_is_tenants(
    deps: &Deps,
    tenant: &Tenant,
    target: &ShortTarget,
) -> Result<(), StoreError> {
    let store = &*deps.store;
    let key = target.record_key();
    let whose = match target {
        ShortTarget::Invoice(_) => record::get::<BillingInvoice>(store, &key)
            .await?
            .map(|i| (i.project_id, i.mode)),
        ShortTarget::Subscription(_) => record::get::<Subscription>(store, &key)
            .await?
            .map(|s| (s.project_id, s.mode)),
    };
    match whose {
        Some((project, mode)) if tenant.owns(project.as_str(), mode) => Ok(()),
        _ => Err(StoreError::Invalid(format!(
            "no {} in this project",
            target.describe()
        ))),
    }
}

/// The link of `token`; `None` for a token that is none, without a store
/// read when it cannot be one ([`is_token`]).
pub async fn resolve(deps: &Deps, token: &str) -> Result<Option<ShortLink>, StoreError> {
    if !is_token(token) {
        return Ok(None);
    }
    record::get::<ShortLink>(&*deps.store, &ShortLink::key(token)).await
}

/// What a token's page shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Landing {
    /// A billing invoice: on to its bill page.
    Invoice(BillingInvoiceId),
    /// A subscription: what it will bill when its trial ends.
    Trial(TrialView),
}

/// A subscription's trial as its short link shows it: nothing of the
/// customer, only what the merchant bills and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrialView {
    pub merchant: String,
    pub sandbox: bool,
    /// The plan as the subscription bills it (its terms' description).
    pub plan: String,
    /// Per period, in paisa (the terms' amount times the quantity).
    pub amount: i64,
    pub currency: Currency,
    /// The Nepal day the trial ends (`None`: it has no trial).
    pub trial_ends_on: Option<NaiveDate>,
    /// That day in Bikram Sambat (Miti, Latin letters).
    pub trial_ends_bs: Option<String>,
    /// Whether the subscription has ended (cancelled or expired).
    pub ended: bool,
}

/// What the page of `token` shows: `None` when the token (or its target)
/// is none. Reads only.
pub async fn landing(deps: &Deps, token: &str) -> Result<Option<Landing>, StoreError> {
    let Some(link) = resolve(deps, token).await? else {
        return Ok(None);
    };
    let tenant = link.tenant();
    match link.target {
        ShortTarget::Invoice(id) => Ok(Some(Landing::Invoice(id))),
        ShortTarget::Subscription(id) => {
            let store = &*deps.store;
            let Some(sub) = record::get::<Subscription>(store, &Subscription::key(&id)).await?
            else {
                return Ok(None);
            };
            if !tenant.owns(sub.project_id.as_str(), sub.mode) {
                return Ok(None);
            }
            let (merchant, _) = account::storefront(deps, &sub.project_id).await?;
            let trial_ends_on = sub.trial_ends_at.map(calendar::nepal_day);
            Ok(Some(Landing::Trial(TrialView {
                merchant,
                sandbox: !sub.mode.is_live(),
                plan: sub.terms.description.clone(),
                amount: sub
                    .terms
                    .amount
                    .saturating_mul(i64::from(sub.quantity.max(1))),
                currency: sub.terms.currency,
                trial_ends_bs: trial_ends_on
                    .and_then(calendar::bs_from_ad)
                    .map(calendar::miti_latin),
                trial_ends_on,
                ended: sub.status.is_ended(),
            })))
        }
    }
}

#[cfg(test)]
mod tests;
