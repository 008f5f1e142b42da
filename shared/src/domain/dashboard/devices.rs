//! Known devices and failed sign-ins. A browser that signed in as a user
//! before carries a "known device" cookie: a random token whose SHA-256
//! names a stored record (as a session's does), bound to the user, the
//! user's session epoch and an expiry. Nothing in the cookie can be forged
//! or altered into another valid one, so no MAC key is needed; raising the
//! epoch ("sign out everywhere", a password reset, disabling) revokes it.
//! Such a browser signs in on its own small budget instead of the shared
//! per-email and per-address ones a stranger can fill.
//!
//! Failed sign-ins for a user are counted, with the networks they came
//! from (an IPv4 /24, an IPv6 /48: never a full address), and shown to the
//! owner once, on the next successful sign-in.

use serde::{Deserialize, Serialize};

use super::users::get_user;
use super::{DashboardUser, random_alnum};
use crate::domain::record::{Changes, Record, from_item};
use crate::ids::UserId;
use crate::store::{Key, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// Random characters of a device cookie after its prefix.
const TOKEN_RANDOM: usize = 43;
const TOKEN_PREFIX: &str = "dd_";
/// How long a browser stays known after it signs in.
pub const DEVICE_LIFETIME: chrono::Duration = chrono::Duration::days(90);
/// Sign-in attempts per known device per window (the sign-in window): a
/// stolen cookie guesses no faster than a stranger at one address.
pub const ATTEMPTS_PER_DEVICE: i64 = 10;
/// Distinct networks a failure notice names at most.
const NETWORKS_MAX: usize = 10;
/// How long a failure notice waits for its owner to sign in.
const FAILURES_KEPT: chrono::Duration = chrono::Duration::days(30);

/// A browser that signed in as `user_id`. Stored under the SHA-256 of its
/// cookie.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownDevice {
    pub user_id: UserId,
    /// The user's `session_epoch` when it signed in.
    pub epoch: i64,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
    /// When the store may drop it (epoch seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<i64>,
    /// The SHA-256 of its cookie: not stored, the item's key holds it.
    #[serde(skip)]
    token_hash: String,
}

crate::attrs! { KnownDevice {
    USER_ID: UserId = user_id,
    EPOCH: i64 = epoch,
    CREATED_AT: Timestamp = created_at,
    EXPIRES_AT: Timestamp = expires_at,
    TTL: Option<i64> = ttl,
} }

/// A known device's item, by the SHA-256 of its cookie.
pub fn device_key(token_hash: &str) -> Key {
    Key::new(format!("DDEV#{token_hash}"), "DDEV")
}

impl Record for KnownDevice {
    fn item_key(&self) -> Key {
        device_key(&self.token_hash)
    }
}

impl KnownDevice {
    /// The bucket its own sign-in budget is counted in (by the cookie's
    /// hash, never the cookie).
    pub fn bucket(&self) -> String {
        format!("DSIGND#{}", self.token_hash)
    }
}

fn token_hash(cookie: &str) -> String {
    super::super::account::hash_secret(cookie)
}

fn well_formed(cookie: &str) -> bool {
    cookie.strip_prefix(TOKEN_PREFIX).is_some_and(|rest| {
        rest.len() == TOKEN_RANDOM && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// The known device `cookie` names, if it is one of ours, unexpired, and
/// its user signs in with `email` (normalized), is enabled and has not
/// raised their epoch since. Anything else (a tampered, foreign or revoked
/// cookie) is `None`: the browser is a stranger, not an error.
pub(super) async fn known_device(
    store: &dyn Store,
    now: Timestamp,
    cookie: Option<&str>,
    email: &str,
) -> Result<Option<KnownDevice>, StoreError> {
    let Some(cookie) = cookie.filter(|c| well_formed(c)) else {
        return Ok(None);
    };
    let hash = token_hash(cookie);
    let found: Option<KnownDevice> = crate::domain::record::get(store, &device_key(&hash)).await?;
    let Some(mut device) = found.filter(|d| d.expires_at > now) else {
        return Ok(None);
    };
    let valid = get_user(store, &device.user_id)
        .await?
        .is_some_and(|u| u.email == email && !u.disabled && u.session_epoch == device.epoch);
    device.token_hash = hash;
    Ok(valid.then_some(device))
}

/// This browser as a new known device of `user`: the cookie to set (shown
/// to this browser once) and the put of its record, for the sign-in's
/// transaction.
pub(super) fn new_device(
    now: Timestamp,
    user: &DashboardUser,
) -> Result<(String, TxOp), StoreError> {
    let cookie = format!("{TOKEN_PREFIX}{}", random_alnum(TOKEN_RANDOM));
    let expires_at = now.plus(DEVICE_LIFETIME);
    let device = KnownDevice {
        user_id: user.id.clone(),
        epoch: user.session_epoch,
        created_at: now,
        expires_at,
        ttl: Some(expires_at.unix_seconds() + 3600),
        token_hash: token_hash(&cookie),
    };
    Ok((cookie, device.put_new()?))
}

/// The network an address is in, as the audit log and the failure notice
/// name it: an IPv4 /24, an IPv6 /48; anything else as the edge gave it
/// (`unknown`), cut short.
pub fn network_of(address: &str) -> String {
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4_network(v4),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}::/48", s[0], s[1], s[2])
            }
        },
        Ok(std::net::IpAddr::V4(v4)) => v4_network(v4),
        Err(_) => address.chars().take(64).collect(),
    }
}

fn v4_network(v4: std::net::Ipv4Addr) -> String {
    let o = v4.octets();
    format!("{}.{}.{}.0/24", o[0], o[1], o[2])
}

/// Failed sign-ins for a user since they last signed in: how many, and
/// from which networks (the first [`NETWORKS_MAX`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedSignIns {
    #[serde(default)]
    pub count: i64,
    #[serde(default)]
    pub networks: Vec<String>,
    /// Raised with each change of `networks` (their writes race).
    #[serde(default)]
    pub version: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<i64>,
    /// The user: not stored, the item's key holds it.
    #[serde(skip)]
    user_id: UserId,
}

crate::attrs! { FailedSignIns {
    COUNT: i64 = count,
    NETWORKS: Vec<String> = networks,
    VERSION: i64 = version,
    TTL: Option<i64> = ttl,
} }

/// The failure notice of `user_id`.
pub fn failures_key(user_id: &UserId) -> Key {
    Key::new(format!("DUSER#{user_id}"), "DFAIL")
}

impl Record for FailedSignIns {
    fn item_key(&self) -> Key {
        failures_key(&self.user_id)
    }
}

/// Counts a failed sign-in of `user_id` from `network`: one write, and a
/// second the first time a network is seen (lost, not retried, when two
/// race: the count stays exact).
pub(super) async fn note_failure(
    store: &dyn Store,
    now: Timestamp,
    user_id: &UserId,
    network: &str,
) -> Result<FailedSignIns, StoreError> {
    let key = failures_key(user_id);
    let count = Changes::new()
        .add(FailedSignIns::COUNT, 1)
        .add(FailedSignIns::VERSION, 0)
        .set_some(FailedSignIns::TTL, &now.plus(FAILURES_KEPT).unix_seconds());
    let mut seen: FailedSignIns = from_item(store.update(&key, count.into(), None).await?)?;
    if seen.networks.iter().all(|n| n != network) && seen.networks.len() < NETWORKS_MAX {
        let mut networks = seen.networks.clone();
        networks.push(network.to_owned());
        let change = Changes::new()
            .set(FailedSignIns::NETWORKS, &networks)
            .add(FailedSignIns::VERSION, 1);
        let unchanged = FailedSignIns::VERSION.eq(&seen.version);
        match store.update(&key, change.into(), Some(unchanged)).await {
            Ok(_) => seen.networks = networks,
            Err(StoreError::ConditionFailed) => {}
            Err(e) => return Err(e),
        }
    }
    seen.user_id = user_id.clone();
    Ok(seen)
}

/// The failed sign-ins of `user_id` since their last sign-in (the
/// sign-in that shows them deletes them in its transaction).
pub(super) async fn failures_of(
    store: &dyn Store,
    user_id: &UserId,
) -> Result<Option<FailedSignIns>, StoreError> {
    let found: Option<FailedSignIns> =
        crate::domain::record::get(store, &failures_key(user_id)).await?;
    Ok(found.filter(|f| f.count > 0).map(|mut f| {
        f.user_id = user_id.clone();
        f
    }))
}

impl FailedSignIns {
    /// The notice's words: "12 failed sign-in attempts from 203.0.113.0/24,
    /// 2400:1a00:b040::/48".
    pub fn describe(&self) -> String {
        let attempts = if self.count == 1 {
            "1 failed sign-in attempt".to_owned()
        } else {
            format!("{} failed sign-in attempts", self.count)
        };
        if self.networks.is_empty() {
            attempts
        } else {
            let more = if self.networks.len() >= NETWORKS_MAX {
                " and others"
            } else {
                ""
            };
            format!("{attempts} from {}{more}", self.networks.join(", "))
        }
    }
}
