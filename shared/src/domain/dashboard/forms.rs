//! Double submits: every action form carries a one-time token; the
//! action's fence (or, for an action that cannot take one, a claim) on it
//! makes a second submit find what the first did instead of doing it again.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::random_alnum;
use crate::app::Deps;
use crate::ids::{MerchantId, TypedId};
use crate::keys;
use crate::store::fence::{Fence, RETENTION};
use crate::store::{Cond, StoreError, TxOp};
use crate::time::Timestamp;

/// Characters of a form's one-time token.
const NONCE_LEN: usize = 32;

/// A new one-time token for an action form.
pub fn new_form_nonce() -> String {
    random_alnum(NONCE_LEN)
}

/// The fence of the form `nonce` of `merchant_id`, kept a day; `None`
/// when the token is not shaped like ours.
pub fn form_fence(merchant_id: &MerchantId, nonce: &str, now: Timestamp) -> Option<Fence> {
    let ok = nonce.len() == NONCE_LEN && nonce.bytes().all(|b| b.is_ascii_alphanumeric());
    ok.then(|| {
        Fence::new(
            keys::dashboard_form(merchant_id, nonce),
            now.plus(RETENTION).unix_seconds(),
        )
    })
}

/// What claiming a form found: `T` is the kind of id the form makes.
#[derive(Debug, PartialEq, Eq)]
pub enum FormClaim<T> {
    /// This is the first submit: go ahead, then [`complete_form`].
    First,
    /// Submitted before; what it made, if it got that far.
    Done(Option<T>),
}

/// Claims a form for an action that cannot put the fence in its own
/// transaction (issuing a key: its secret can be shown only once).
pub async fn claim_form<T: TypedId + DeserializeOwned>(
    deps: &Deps,
    fence: &Fence,
) -> Result<FormClaim<T>, StoreError> {
    let store = &*deps.store;
    match store.transact(vec![fence.op("")]).await {
        Ok(()) => Ok(FormClaim::First),
        Err(e) if Fence::tripped(&e, 0) || e.is_condition_failure() => {
            let made = fence.resource_id(store).await?.filter(|id| !id.is_empty());
            // Our own id, stored by `complete_form`: taken as written.
            Ok(FormClaim::Done(made.and_then(|m| {
                serde_json::from_value(Value::String(m)).ok()
            })))
        }
        Err(e) => Err(e),
    }
}

/// Records what a claimed form made.
pub async fn complete_form<T: TypedId>(
    deps: &Deps,
    fence: &Fence,
    made: &T,
) -> Result<(), StoreError> {
    let store = &*deps.store;
    // The claim's own item, its id filled in.
    let TxOp::Put { item, .. } = fence.op(made.as_str()) else {
        return Ok(());
    };
    store.put(item, Some(Cond::Exists)).await
}
