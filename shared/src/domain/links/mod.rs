//! Payment links (spec "Payment link", decisions "Payment links"):
//! reusable hosted pages that shops share, with a fixed amount or one the
//! customer enters between bounds.
//!
//! Stored at `LNK#<id>` / `LNK`, listed per project and mode through
//! `gsi1` (`PROJ#<p>#<mode>#LNK`, newest first). `views` and `used_count`
//! are counters on the item (atomic `ADD`); `maxUses` can never be set
//! below `used_count` (a condition on the update), a used link can never be
//! deleted (a condition on the delete), and a cancel of an inactive link
//! changes nothing (a condition on `active`).

use crate::domain::listing::counted;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::checkout::{self, StoredAddress};
use super::listing::counted::{CountedKind, CountedList, Narrowed};
use super::listing::{StatusChange, merge_counts};
use super::record::{Attr, Changes, Entry, Record};
use super::{Mode, Provider};
use crate::ids::{LinkId, ProjectId};
use crate::keys;
use crate::kinds::Tenant;
use crate::money::{Currency, Paisa};
use crate::store::{Cond, Index, Key, TxOp};
use crate::time::Timestamp;

mod manage;
#[cfg(test)]
mod narrowed_tests;
mod page;
#[cfg(test)]
mod tests;

pub(crate) use manage::get_in;
pub use manage::{
    CreateLink, LinkError, LinkStats, PatchLink, PaymentLinkView, cancel, check_spend_cap, delete,
    find, get, insert_once, list, new_link, patch,
};
pub use page::{LinkCustomer, OpenError, count_view, inactive_text, open_session};

pub const DEFAULT_PAGE: usize = 25;
/// The smallest amount a customer may enter when the link sets none.
pub const DEFAULT_MIN_AMOUNT: i64 = 1000;

/// A stored link.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PaymentLink {
    pub id: LinkId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub title: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub amount: Option<Paisa>,
    #[serde(default)]
    pub min_amount: Option<i64>,
    #[serde(default)]
    pub max_amount: Option<i64>,
    pub currency: Currency,
    #[serde(default)]
    pub provider: Option<Provider>,
    pub active: bool,
    #[serde(default)]
    pub max_uses: Option<i64>,
    #[serde(default)]
    pub used_count: i64,
    #[serde(default)]
    pub views: i64,
    /// Uses taken: completed payments plus attempts holding a use (a use
    /// is held from the moment a customer is sent to a provider until that
    /// attempt fails, is cancelled or its session expires).
    #[serde(default)]
    pub claimed: i64,
    /// When the last hold taken ends at the latest (its session's expiry):
    /// how long the page says to wait while every use is held.
    #[serde(default)]
    pub held_until: Option<Timestamp>,
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    #[serde(default)]
    pub redirect_url: Option<String>,
    #[serde(default)]
    pub inactive_message: Option<String>,
    #[serde(default)]
    pub customer_name: Option<String>,
    #[serde(default)]
    pub customer_email: Option<String>,
    #[serde(default)]
    pub customer_phone: Option<String>,
    #[serde(default)]
    pub collect_address: bool,
    #[serde(default)]
    pub customer_address: Option<StoredAddress>,
    #[serde(default)]
    pub reference_id: Option<String>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Counted in its project's list counters (`listing::counted`): set
    /// at creation, or by `dhukuti-admin lists migrate`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
    /// In its list's narrowing by `active` ([`PaymentLink::by_active`]):
    /// its `gsi4` partition is there (written by its entries, never from
    /// here). Set at creation, or by `dhukuti-admin lists migrate`.
    #[serde(
        default,
        rename = "gsi4pk",
        skip_serializing,
        deserialize_with = "crate::domain::listing::present"
    )]
    pub narrowed: bool,
}

crate::attrs! { PaymentLink {
    ID: LinkId = id,
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    TITLE: String = title,
    DESCRIPTION: Option<String> = description,
    AMOUNT: Option<Paisa> = amount,
    MIN_AMOUNT: Option<i64> = min_amount,
    MAX_AMOUNT: Option<i64> = max_amount,
    CURRENCY: Currency = currency,
    PROVIDER: Option<Provider> = provider,
    ACTIVE: bool = active,
    MAX_USES: Option<i64> = max_uses,
    USED_COUNT: i64 = used_count,
    VIEWS: i64 = views,
    CLAIMED: i64 = claimed,
    HELD_UNTIL: Option<Timestamp> = held_until,
    EXPIRES_AT: Option<Timestamp> = expires_at,
    REDIRECT_URL: Option<String> = redirect_url,
    INACTIVE_MESSAGE: Option<String> = inactive_message,
    CUSTOMER_NAME: Option<String> = customer_name,
    CUSTOMER_EMAIL: Option<String> = customer_email,
    CUSTOMER_PHONE: Option<String> = customer_phone,
    COLLECT_ADDRESS: bool = collect_address,
    CUSTOMER_ADDRESS: Option<StoredAddress> = customer_address,
    REFERENCE_ID: Option<String> = reference_id,
    METADATA: Map<String, Value> = metadata,
    CREATED_AT: Timestamp = created_at,
    UPDATED_AT: Timestamp = updated_at,
    COUNTED: bool = counted,
    NARROWED: bool = narrowed as "gsi4pk",
} }

crate::domain::listing::counted::counted_per_tenant!(
    PaymentLink,
    crate::domain::listing::counted::CountedKind::Links,
    PaymentLink::list_partition
);

impl Narrowed for PaymentLink {
    const NARROWED: Attr<Self, bool> = PaymentLink::NARROWED;
    fn is_narrowed(&self) -> bool {
        self.narrowed
    }
    fn narrowings(&self) -> (Changes<Self>, Vec<TxOp>) {
        (
            Changes::new().enter([self.active_entry(self.active)]),
            PaymentLink::by_active(&self.tenant(), self.active)
                .count_new(&self.id, self.created_at),
        )
    }
    fn narrowed_as_read(&self) -> Cond {
        PaymentLink::ACTIVE.eq(&self.active)
    }
}

impl Record for PaymentLink {
    fn item_key(&self) -> Key {
        PaymentLink::key(&self.id)
    }

    /// Listed in its project's links, newest first; once narrowed, in
    /// the ones of its `active` (`gsi4`).
    fn entries(&self) -> Vec<Entry> {
        let mut out = vec![Entry::gsi1(
            PaymentLink::list_partition(&Tenant::new(self.project_id.clone(), self.mode)),
            self.id.clone(),
        )];
        if self.narrowed {
            out.push(self.active_entry(self.active));
        }
        out
    }
}

impl PaymentLink {
    pub fn key(id: &LinkId) -> Key {
        keys::record(keys::Record::PaymentLink, id)
    }

    fn list_partition(tenant: &Tenant) -> String {
        keys::per_mode(&tenant.project, tenant.mode, keys::PerMode::Links)
    }

    /// `tenant`'s links whose stored `active` is `active`: the list
    /// narrowed on `gsi4` (`<list>#A#<true|false>`, member
    /// `a_<true|false>`).
    pub fn by_active(tenant: &Tenant, active: bool) -> CountedList {
        CountedList::new(
            CountedKind::Links,
            tenant.clone(),
            PaymentLink::list_partition(tenant),
        )
        .narrowed(
            &format!("a_{active}"),
            Index::Gsi4,
            format!("{}#A#{active}", PaymentLink::list_partition(tenant)),
        )
    }

    fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }

    fn active_entry(&self, active: bool) -> Entry {
        Entry {
            index: Index::Gsi4,
            partition: PaymentLink::by_active(&self.tenant(), active).partition,
            sort: self.id.as_str().to_owned(),
        }
    }

    /// The counter writes of a new link, for its insert's transaction: its
    /// list's and (narrowed) its `active`'s, folded per counter item.
    pub fn insert_counts(&self) -> Vec<TxOp> {
        let mut ops = self.count_new();
        if self.narrowed {
            merge_counts(
                &mut ops,
                PaymentLink::by_active(&self.tenant(), self.active)
                    .count_new(&self.id, self.created_at),
            );
        }
        ops
    }

    /// The counter writes taking a deleted link (as read) out of its list
    /// and (narrowed) its `active`'s, for the delete's transaction.
    pub fn gone_counts(&self) -> Vec<TxOp> {
        let mut ops = if self.counted {
            self.counted_list_of_self()
                .count_gone(&self.id, self.created_at)
        } else {
            Vec::new()
        };
        if self.narrowed {
            merge_counts(
                &mut ops,
                PaymentLink::by_active(&self.tenant(), self.active)
                    .count_gone(&self.id, self.created_at),
            );
        }
        ops
    }

    /// Setting this link's (as read) `active` to `to`: `changes` with it
    /// set and its narrowed entry moved, the condition to write them under
    /// (`active` as read, narrowed or not as read) and the counter writes
    /// for the same transaction. Every write of `active` goes through here
    /// (a unit test fails on a `set` of it anywhere else).
    pub fn active_change(
        &self,
        to: bool,
        changes: Changes<PaymentLink>,
    ) -> StatusChange<PaymentLink> {
        let tenant = self.tenant();
        counted::value_change(
            self,
            PaymentLink::ACTIVE.eq(&self.active),
            changes.set(PaymentLink::ACTIVE, &to),
            (
                &PaymentLink::by_active(&tenant, self.active),
                &PaymentLink::by_active(&tenant, to),
            ),
            (self.id.as_str(), self.created_at),
        )
    }

    /// Why the link cannot take a payment at `now`, if it cannot.
    pub fn unusable(&self, now: Timestamp) -> Option<&'static str> {
        if !self.active {
            Some("inactive")
        } else if self.expires_at.is_some_and(|e| now >= e) {
            Some("expired")
        } else if self.max_uses.is_some_and(|m| self.used_count >= m) {
            Some("used up")
        } else {
            None
        }
    }

    /// While every remaining use is held by a customer at a provider (none
    /// used up): whole minutes, at least 1, until the holds end at the
    /// latest.
    pub fn held(&self, now: Timestamp) -> Option<i64> {
        let m = self.max_uses?;
        if self.used_count >= m || self.claimed < m {
            return None;
        }
        let until = self
            .held_until
            .unwrap_or(now.plus(checkout::SESSION_LIFETIME));
        let secs = (until.datetime() - now.datetime()).num_seconds();
        Some(((secs + 59) / 60).max(1))
    }
}

/// The page's words while every use of a link is held.
pub fn held_text(minutes: i64) -> String {
    let unit = if minutes == 1 { "minute" } else { "minutes" };
    format!(
        "This payment link is temporarily unavailable: every use is being paid \
         right now. Try again in {minutes} {unit}."
    )
}

/// The write taking one use of `link` (as read) for an attempt of a
/// session ending at `session_expires`: conditioned on a use being left
/// and `maxUses` unchanged.
pub fn claim_op(link: &PaymentLink, session_expires: Timestamp) -> TxOp {
    let room = below_max_uses(link.max_uses, PaymentLink::CLAIMED);
    let until = link
        .held_until
        .filter(|h| *h > session_expires)
        .unwrap_or(session_expires);
    TxOp::Update {
        key: PaymentLink::key(&link.id),
        update: Changes::<PaymentLink>::new()
            .add(PaymentLink::CLAIMED, 1)
            .set_some(PaymentLink::HELD_UNTIL, &until)
            .into(),
        cond: Some(Cond::And(vec![Cond::Exists, room])),
    }
}

/// The link's counter `count` is below `max_uses` as read (and `maxUses`
/// unchanged, or still unlimited, when the write lands).
fn below_max_uses(max_uses: Option<i64>, count: Attr<PaymentLink, i64>) -> Cond {
    match max_uses {
        None => Cond::Not(Box::new(PaymentLink::MAX_USES.ge(&Some(0)))),
        Some(m) => Cond::And(vec![
            PaymentLink::MAX_USES.is(&m),
            Cond::Or(vec![count.missing(), count.lt(&m)]),
        ]),
    }
}
