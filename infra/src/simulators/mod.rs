//! Offline simulators of the three providers, so tests and a newcomer can
//! pay end to end with no internet: eSewa ePay v2 ([`esewa`]), Khalti KPG-2
//! ([`khalti`]) and Fonepay dynamic QR + web redirect ([`fonepay`]).
//!
//! The protocol each one follows is `../shared/research/providers.md`
//! (sections 1.7, 2.6 and 3.8); signatures come from
//! [`shared::providers::sign`], never re-implemented here.
//!
//! [`router`] nests each provider under its own prefix and keeps the
//! provider's real paths below it. The gateway mounts the router at some
//! base (e.g. `/sim`) and sets [`SimConfig::public_base_url`] to the public
//! URL of that base (e.g. `http://127.0.0.1:8080/sim`); every link,
//! redirect into our own pages and websocket URL is built from it. A
//! provider client is then configured with:
//!
//! | Provider | Client setting | Value |
//! |---|---|---|
//! | eSewa | form URL | `{base}/esewa/api/epay/main/v2/form` |
//! | eSewa | status URL | `{base}/esewa/api/epay/transaction/status/` |
//! | Khalti | API base (real: `https://dev.khalti.com/api/v2/`) | `{base}/khalti/api/v2/` |
//! | Khalti | refund base (real: `https://dev.khalti.com/api/`) | `{base}/khalti/api/` |
//! | Fonepay | QR API base (real: `https://merchantapi.fonepay.com/api`) | `{base}/fonepay/api` |
//! | Fonepay | web redirect host (real: `https://clientapi.fonepay.com`) | `{base}/fonepay` |
//! | SMS (Sparrow-style) | `DHUKUTI_SMS_BASE_URL` | `{base}/sms` (token [`sms::SMS_TEST_TOKEN`]) |
//! | Mail (SES stand-in) | `DHUKUTI_MAIL_BASE_URL` | `{base}/mail` ([`mail`]) |
//!
//! Besides the providers' own routes, each provider has a control API for
//! tests under `/{provider}/_control/` (see [`ControlNext`]) and small HTML
//! "wallet" pages where a person pays, fails or cancels without JavaScript.
//! `GET {base}` (no trailing slash: axum's `nest` does not match `{base}/`)
//! lists the credentials, the routes and the recent attempts.

// Handlers bail out early with a ready `Response` as the error; boxing it
// would only add noise.
#![allow(clippy::result_large_err)]

pub mod esewa;
pub mod fonepay;
pub mod khalti;
pub mod mail;
mod page;
pub mod sms;
pub mod statements;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::Offset as _;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The Khalti secret key the simulator accepts by default
/// (`Authorization: Key live_secret_key_…`). Made up for the simulator; the
/// real sandbox key comes from test-admin.khalti.com.
pub const KHALTI_TEST_SECRET_KEY: &str = "live_secret_key_0d8f5c3e2b1a4f6e9d7c8b5a4e3f2d1c";
/// The sandbox test secret key Khalti's public docs print: client
/// libraries and tutorials use it, so the simulator takes it too.
pub const KHALTI_DOCS_SECRET_KEY: &str = "live_secret_key_68791341fdd94846a146f0457ff7b455";

/// An eSewa merchant: `product_code` and the HMAC secret key.
#[derive(Clone, Debug)]
pub struct EsewaMerchant {
    pub product_code: String,
    pub secret_key: String,
}

/// A Fonepay merchant: the code, the HMAC secret (the `dataValidation` key)
/// and the API username/password, kept apart as Fonepay does.
#[derive(Clone, Debug)]
pub struct FonepayMerchant {
    pub merchant_code: String,
    pub secret_key: String,
    pub username: String,
    pub password: String,
}

/// How the simulators behave. [`SimConfig::new`] gives the defaults: the
/// providers' published test credentials, a 15 s "timeout" delay, two
/// pending status calls.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The public URL where [`router`] is mounted, e.g.
    /// `http://127.0.0.1:8080/sim` (no trailing slash needed).
    pub public_base_url: String,
    /// Default: `EPAYTEST` / `8gBm/:&EnhH.1/q` (eSewa's published UAT pair).
    pub esewa_merchants: Vec<EsewaMerchant>,
    /// Default: [`KHALTI_TEST_SECRET_KEY`].
    pub khalti_secret_keys: Vec<String>,
    /// Default: `NBQM` / `a7e3512f5032480a83137793cb2021dc` /
    /// `9861101076` / `admin123456` and `fonepay123` / `fonepay` /
    /// `bijayk` / `password` (Fonepay's published demo credentials).
    pub fonepay_merchants: Vec<FonepayMerchant>,
    /// How long a `timeout` fault sleeps before answering (default 15 s,
    /// past a client's 10 s timeout; tests use e.g. 2 s).
    pub timeout_delay: Duration,
    /// `pending_then_success`: how many status calls answer "pending"
    /// before the next one answers "paid" (default 2).
    pub pending_status_calls: u32,
    /// Reject a reused eSewa `transaction_uuid` / Fonepay `prn` (default
    /// true; the real behaviour is unconfirmed).
    pub reject_duplicate_references: bool,
    /// An eSewa session nobody acted on turns `NOT_FOUND` after this
    /// (default 30 min).
    pub esewa_session_timeout: Duration,
    /// Khalti `expires_in` (default 1800 s, as the sandbox sample);
    /// `Initiated` turns `Expired` after it.
    pub khalti_expires_in: Duration,
    /// Smallest Khalti amount in paisa (default 1000 = Rs 10, accepted).
    pub khalti_min_amount_paisa: i64,
    /// A pending Fonepay QR turns `failed` after this (default none).
    pub fonepay_qr_expiry: Option<Duration>,
    /// Khalti's fee on a completed payment, in basis points of its amount
    /// (rounded half up to the paisa), answered as the lookup's `fee`
    /// (default 300, a stand-in: real rates are per contract).
    pub khalti_fee_bps: i64,
    /// Fonepay's commission on a QR payment, in basis points (rounded
    /// half up to the paisa), sent as the result frame's
    /// `commissionAmount` in rupees (default 150, a stand-in).
    pub fonepay_commission_bps: i64,
}

/// `bps` basis points of `paisa`, rounded half up.
pub fn fee_of(paisa: i64, bps: i64) -> i64 {
    let v = (i128::from(paisa) * i128::from(bps) + 5_000) / 10_000;
    i64::try_from(v).unwrap_or(0)
}

impl SimConfig {
    /// The defaults, served from `public_base_url`.
    pub fn new(public_base_url: impl Into<String>) -> SimConfig {
        SimConfig {
            public_base_url: public_base_url.into().trim_end_matches('/').to_owned(),
            esewa_merchants: vec![EsewaMerchant {
                product_code: "EPAYTEST".into(),
                secret_key: "8gBm/:&EnhH.1/q".into(),
            }],
            khalti_secret_keys: vec![KHALTI_TEST_SECRET_KEY.into(), KHALTI_DOCS_SECRET_KEY.into()],
            fonepay_merchants: vec![
                FonepayMerchant {
                    merchant_code: "NBQM".into(),
                    secret_key: "a7e3512f5032480a83137793cb2021dc".into(),
                    username: "9861101076".into(),
                    password: "admin123456".into(),
                },
                FonepayMerchant {
                    merchant_code: "fonepay123".into(),
                    secret_key: "fonepay".into(),
                    username: "bijayk".into(),
                    password: "password".into(),
                },
            ],
            timeout_delay: Duration::from_secs(15),
            pending_status_calls: 2,
            reject_duplicate_references: true,
            esewa_session_timeout: Duration::from_secs(30 * 60),
            khalti_expires_in: Duration::from_secs(1800),
            khalti_min_amount_paisa: 1000,
            fonepay_qr_expiry: None,
            khalti_fee_bps: 300,
            fonepay_commission_bps: 150,
        }
    }
}

/// The simulators' state: configuration and every attempt, in memory.
/// Cheap to clone.
#[derive(Clone)]
pub struct SimState {
    inner: Arc<Inner>,
}

struct Inner {
    config: SimConfig,
    esewa: Mutex<Book<esewa::EsewaAttempt>>,
    khalti: Mutex<Book<khalti::KhaltiAttempt>>,
    fonepay: Mutex<Book<fonepay::FonepayAttempt>>,
    sms: Mutex<sms::SmsBook>,
    mail: Mutex<mail::MailBook>,
    statements: Mutex<statements::StatementBook>,
    fonepay_frames: tokio::sync::broadcast::Sender<fonepay::Frame>,
}

impl SimState {
    pub fn new(config: SimConfig) -> SimState {
        let (fonepay_frames, _) = tokio::sync::broadcast::channel(256);
        SimState {
            inner: Arc::new(Inner {
                config,
                esewa: Mutex::new(Book::default()),
                khalti: Mutex::new(Book::default()),
                fonepay: Mutex::new(Book::default()),
                sms: Mutex::new(sms::SmsBook::default()),
                mail: Mutex::new(mail::MailBook::default()),
                statements: Mutex::new(statements::StatementBook::default()),
                fonepay_frames,
            }),
        }
    }

    /// The defaults of [`SimConfig::new`].
    pub fn with_base_url(public_base_url: impl Into<String>) -> SimState {
        SimState::new(SimConfig::new(public_base_url))
    }

    pub fn config(&self) -> &SimConfig {
        &self.inner.config
    }

    /// The public base URL, without a trailing slash.
    pub fn base(&self) -> &str {
        self.inner.config.public_base_url.trim_end_matches('/')
    }

    /// The base as a websocket URL (`http` → `ws`, `https` → `wss`).
    pub fn ws_base(&self) -> String {
        let base = self.base();
        if let Some(rest) = base.strip_prefix("https://") {
            format!("wss://{rest}")
        } else if let Some(rest) = base.strip_prefix("http://") {
            format!("ws://{rest}")
        } else {
            base.to_owned()
        }
    }

    pub(crate) fn esewa(&self) -> MutexGuard<'_, Book<esewa::EsewaAttempt>> {
        self.inner.esewa.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn khalti(&self) -> MutexGuard<'_, Book<khalti::KhaltiAttempt>> {
        self.inner.khalti.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn fonepay(&self) -> MutexGuard<'_, Book<fonepay::FonepayAttempt>> {
        self.inner.fonepay.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn sms(&self) -> MutexGuard<'_, sms::SmsBook> {
        self.inner.sms.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn mail(&self) -> MutexGuard<'_, mail::MailBook> {
        self.inner.mail.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn statements(&self) -> MutexGuard<'_, statements::StatementBook> {
        self.inner
            .statements
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Where the mail simulator puts the bounce and complaint
    /// notifications its control endpoint makes: the gateway's mail queue
    /// (as SNS does on AWS).
    pub fn wire_mail_feedback(&self, queue: Arc<dyn shared::queue::Queue>) {
        self.mail().feedback = Some(queue);
    }

    pub(crate) fn fonepay_frames(&self) -> &tokio::sync::broadcast::Sender<fonepay::Frame> {
        &self.inner.fonepay_frames
    }
}

/// Every simulator, each under its own prefix: `/esewa`, `/khalti`,
/// `/fonepay`, `/sms` (the SMS provider, [`sms`]), plus an index page at
/// `/`.
pub fn router(state: SimState) -> Router {
    Router::new()
        .route("/", get(index))
        .nest("/esewa", esewa::routes().merge(statements::esewa_routes()))
        .nest(
            "/khalti",
            khalti::routes().merge(statements::khalti_routes()),
        )
        .nest(
            "/fonepay",
            fonepay::routes().merge(statements::fonepay_routes()),
        )
        .nest("/sms", sms::routes())
        .nest("/mail", mail::routes())
        .with_state(state)
}

// ---------------------------------------------------------------------------
// Scenarios and the control API

/// What the next attempt (or a given one) does, set with
/// `POST /{provider}/_control/next`.
///
/// - `success`, `failure`, `cancel`: the customer acts at once, as soon as
///   the browser reaches the provider (eSewa form POST, Khalti
///   `payment_url`, Fonepay web redirect; a Fonepay QR when it is
///   created), so the browser is redirected straight to the callback;
/// - `pending_then_success`: the customer pays but the provider answers
///   "pending" for [`SimConfig::pending_status_calls`] status calls (or
///   `pending_calls`), then "paid"; a control `pay` completes it earlier;
/// - `ambiguous`: the customer pays and the provider is stuck (eSewa
///   `AMBIGUOUS`, Khalti `Pending`, Fonepay `pending`) until a control
///   `pay` (→ paid) or `fail`/`cancel`;
/// - `timeout`: the status API (or, with `"on": "initiate"`, the create
///   call) sleeps [`SimConfig::timeout_delay`] before answering, `times`
///   times (default 1); the customer acts by hand;
/// - `server_error`: the same calls answer 5xx instead;
/// - `tampered_callback`: the customer cancels, yet the browser is sent to
///   a success-shaped callback with an altered amount and a signature that
///   does not match it; the status API tells the truth. A customer action
///   by hand on such an attempt also produces the forged callback.
///
/// With `"on": "refund"` (Khalti only: eSewa and Fonepay have no refund
/// API) the scenario scripts the refund call instead, and is kept apart
/// from the payment's scenario (it replaces nothing). Only three outcomes
/// are allowed there:
/// - `timeout`: the refund is APPLIED at once (the provider acted), then
///   the answer is held for [`SimConfig::timeout_delay`], so the client
///   times out although the money went back;
/// - `server_error`: HTTP 500, nothing applied;
/// - `failure`: Khalti rejects the refund: HTTP 400
///   `{"detail": "Refund not allowed", "error_key": "validation_error"}`,
///   nothing applied.
///
/// Each hits `times` refund calls (default 1) of the payment named by
/// `reference` (its `pidx`, `purchase_order_id` or `transaction_id`; the
/// payment may be created later), or without `reference` the next refund
/// call(s) of any Khalti payment. Only calls naming a known transaction
/// with the right key take a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Success,
    Failure,
    Cancel,
    PendingThenSuccess,
    Ambiguous,
    Timeout,
    ServerError,
    TamperedCallback,
}

/// Which server call a `timeout`/`server_error` fault (or, on `refund`, a
/// `failure`) hits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultOn {
    /// eSewa status, Khalti lookup, Fonepay QR status.
    #[default]
    Status,
    /// eSewa form POST, Khalti initiate, Fonepay QR create / web redirect.
    Initiate,
    /// Khalti refund (`POST /api/merchant-transaction/{txn}/refund/`); see
    /// [`Outcome`] for what `timeout`, `server_error` and `failure` do there.
    Refund,
}

/// The body of `POST /{provider}/_control/next`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlNext {
    pub outcome: Outcome,
    /// The merchant's reference (eSewa `transaction_uuid`, Khalti
    /// `purchase_order_id` or `pidx`, Fonepay `prn`). An existing attempt
    /// takes the scenario at once (a customer outcome then happens when
    /// the browser next loads the wallet page; for a QR, use the control
    /// `pay`/`fail`/`cancel`); an unknown one when it is created.
    /// Without it, the scenario applies to the provider's next attempt.
    #[serde(default)]
    pub reference: Option<String>,
    /// For `timeout`/`server_error`: which call (default `status`);
    /// `refund` also takes `failure` (see [`Outcome`]).
    #[serde(default)]
    pub on: Option<FaultOn>,
    /// For `timeout`/`server_error` (and `failure` on `refund`): how many
    /// calls (default 1).
    #[serde(default)]
    pub times: Option<u32>,
    /// For `pending_then_success`: pending answers before "paid".
    #[serde(default)]
    pub pending_calls: Option<u32>,
    /// Fonepay QR: never send a websocket frame for this attempt.
    #[serde(default)]
    pub silent_websocket: Option<bool>,
}

/// A customer action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Pay,
    Fail,
    Cancel,
}

impl Action {
    pub(crate) fn parse(s: &str) -> Option<Action> {
        match s {
            "pay" => Some(Action::Pay),
            "fail" => Some(Action::Fail),
            "cancel" => Some(Action::Cancel),
            _ => None,
        }
    }
}

/// A fault to apply to one server call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    Timeout,
    ServerError,
}

/// A fault to apply to one refund call (`"on": "refund"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RefundFault {
    /// Apply the refund, then answer late.
    Timeout,
    /// HTTP 500, nothing applied.
    ServerError,
    /// The provider rejects the refund, nothing applied.
    Failure,
}

/// The scenario an attempt runs.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Scenario {
    /// `None`: a person (or the control API) decides.
    pub outcome: Option<Outcome>,
    pub fault_on: FaultOn,
    pub faults_left: u32,
    pub pending_calls: Option<u32>,
    pub silent_websocket: bool,
}

impl Scenario {
    fn from_control(c: &ControlNext) -> Scenario {
        Scenario {
            outcome: Some(c.outcome),
            fault_on: c.on.unwrap_or_default(),
            faults_left: c.times.unwrap_or(1),
            pending_calls: c.pending_calls,
            silent_websocket: c.silent_websocket.unwrap_or(false),
        }
    }

    /// What the customer does at once when the browser reaches the
    /// provider, if the scenario says so.
    pub(crate) fn auto_action(&self) -> Option<Action> {
        match self.outcome? {
            Outcome::Success | Outcome::PendingThenSuccess | Outcome::Ambiguous => {
                Some(Action::Pay)
            }
            Outcome::Failure => Some(Action::Fail),
            Outcome::Cancel | Outcome::TamperedCallback => Some(Action::Cancel),
            Outcome::Timeout | Outcome::ServerError => None,
        }
    }

    /// Takes one fault for a call of kind `at`, if any is left.
    pub(crate) fn take_fault(&mut self, at: FaultOn) -> Option<Fault> {
        let fault = match self.outcome? {
            Outcome::Timeout => Fault::Timeout,
            Outcome::ServerError => Fault::ServerError,
            _ => return None,
        };
        if self.fault_on != at || self.faults_left == 0 {
            return None;
        }
        self.faults_left -= 1;
        Some(fault)
    }

    /// Takes one refund fault, if this is a refund scenario with faults
    /// left.
    fn take_refund_fault(&mut self) -> Option<RefundFault> {
        if self.fault_on != FaultOn::Refund || self.faults_left == 0 {
            return None;
        }
        let fault = match self.outcome? {
            Outcome::Timeout => RefundFault::Timeout,
            Outcome::ServerError => RefundFault::ServerError,
            Outcome::Failure => RefundFault::Failure,
            _ => return None,
        };
        self.faults_left -= 1;
        Some(fault)
    }

    pub(crate) fn is(&self, outcome: Outcome) -> bool {
        self.outcome == Some(outcome)
    }

    pub(crate) fn pending_calls(&self, config: &SimConfig) -> u32 {
        self.pending_calls.unwrap_or(config.pending_status_calls)
    }
}

/// Scenarios waiting for their attempt.
#[derive(Default)]
pub(crate) struct Presets {
    next: Option<Scenario>,
    by_ref: HashMap<String, Scenario>,
}

impl Presets {
    /// The scenario for a new attempt with these references.
    pub(crate) fn take(&mut self, references: &[&str]) -> Scenario {
        for r in references {
            if let Some(s) = self.by_ref.remove(*r) {
                return s;
            }
        }
        self.next.take().unwrap_or_default()
    }

    /// Gives back a scenario whose attempt was never created (a fault on
    /// the create call) and still has faults left.
    pub(crate) fn give_back(&mut self, reference: &str, scenario: Scenario) {
        if scenario.faults_left > 0 {
            self.by_ref.insert(reference.to_owned(), scenario);
        }
    }

    /// For refund scenarios (kept in [`Book::refund_presets`]): one fault
    /// for a refund call of the attempt with these references, from the
    /// first reference that has a scenario with faults left, else from
    /// the `next` one. A spent scenario is dropped.
    pub(crate) fn take_refund_fault(&mut self, references: &[&str]) -> Option<RefundFault> {
        for r in references {
            if let Some(s) = self.by_ref.get_mut(*r) {
                let fault = s.take_refund_fault();
                if s.faults_left == 0 {
                    self.by_ref.remove(*r);
                }
                if fault.is_some() {
                    return fault;
                }
            }
        }
        let s = self.next.as_mut()?;
        let fault = s.take_refund_fault();
        if s.faults_left == 0 {
            self.next = None;
        }
        fault
    }
}

/// An attempt of any provider.
pub(crate) trait Attempt: Serialize {
    /// Whether the provider has a refund API (`"on": "refund"` scenarios
    /// do something).
    const REFUND_API: bool = false;

    fn scenario_mut(&mut self) -> &mut Scenario;
}

/// One provider's attempts, keyed by the merchant's reference (Khalti: by
/// `pidx`, with `purchase_order_id` as an alias).
pub(crate) struct Book<A> {
    pub attempts: HashMap<String, A>,
    /// Keys in creation order.
    pub order: Vec<String>,
    pub aliases: HashMap<String, String>,
    pub presets: Presets,
    /// `"on": "refund"` scenarios, by reference or for the next refund
    /// call; kept apart from the payment's scenario.
    pub refund_presets: Presets,
    pub counter: u64,
}

impl<A> Default for Book<A> {
    fn default() -> Self {
        Book {
            attempts: HashMap::new(),
            order: Vec::new(),
            aliases: HashMap::new(),
            presets: Presets::default(),
            refund_presets: Presets::default(),
            counter: 0,
        }
    }
}

impl<A: Attempt> Book<A> {
    pub(crate) fn insert(&mut self, key: String, attempt: A) {
        if self.attempts.insert(key.clone(), attempt).is_none() {
            self.order.push(key);
        }
    }

    /// The key of the attempt for a reference (the key or an alias).
    pub(crate) fn resolve(&self, reference: &str) -> Option<String> {
        if self.attempts.contains_key(reference) {
            return Some(reference.to_owned());
        }
        self.aliases
            .get(reference)
            .filter(|k| self.attempts.contains_key(*k))
            .cloned()
    }

    pub(crate) fn get_mut(&mut self, reference: &str) -> Option<&mut A> {
        let key = self.resolve(reference)?;
        self.attempts.get_mut(&key)
    }

    /// `POST /_control/next`.
    pub(crate) fn control_next(&mut self, c: &ControlNext) -> serde_json::Value {
        let scenario = Scenario::from_control(c);
        if scenario.fault_on == FaultOn::Refund {
            let applied_to = c.reference.as_deref().unwrap_or("next");
            if !A::REFUND_API {
                return json!({
                    "applied_to": applied_to,
                    "on": "refund",
                    "ignored": "this provider has no refund API",
                });
            }
            let attempt_exists = c.reference.as_deref().map(|r| self.resolve(r).is_some());
            match &c.reference {
                Some(r) => {
                    self.refund_presets.by_ref.insert(r.clone(), scenario);
                }
                None => self.refund_presets.next = Some(scenario),
            }
            return match attempt_exists {
                Some(exists) => {
                    json!({"applied_to": applied_to, "on": "refund", "attempt_exists": exists})
                }
                None => json!({"applied_to": applied_to, "on": "refund"}),
            };
        }
        match &c.reference {
            Some(r) => {
                if let Some(a) = self.get_mut(r) {
                    *a.scenario_mut() = scenario;
                    json!({"applied_to": r, "attempt_exists": true})
                } else {
                    self.presets.by_ref.insert(r.clone(), scenario);
                    json!({"applied_to": r, "attempt_exists": false})
                }
            }
            None => {
                self.presets.next = Some(scenario);
                json!({"applied_to": "next"})
            }
        }
    }

    pub(crate) fn reset(&mut self) {
        *self = Book::default();
    }

    pub(crate) fn next_counter(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }
}

/// Parses a control body (`ControlNext`) with a readable error.
pub(crate) fn parse_control_next(body: &[u8]) -> Result<ControlNext, Response> {
    let c = serde_json::from_slice::<ControlNext>(body).map_err(|e| {
        control_error(
            StatusCode::BAD_REQUEST,
            &format!("bad control body: {e}; expected {{\"outcome\": \"success\"|\"failure\"|\"cancel\"|\"pending_then_success\"|\"ambiguous\"|\"timeout\"|\"server_error\"|\"tampered_callback\", \"reference\"?: \"...\", \"on\"?: \"status\"|\"initiate\"|\"refund\", \"times\"?: n}}"),
        )
    })?;
    if c.on == Some(FaultOn::Refund)
        && !matches!(
            c.outcome,
            Outcome::Timeout | Outcome::ServerError | Outcome::Failure
        )
    {
        return Err(control_error(
            StatusCode::BAD_REQUEST,
            "with \"on\": \"refund\" the outcome must be \"timeout\", \"server_error\" or \"failure\"",
        ));
    }
    Ok(c)
}

/// A control API error: `{"error": "..."}`.
pub(crate) fn control_error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

/// The answer to a control action: the attempt and the callback the
/// browser would be sent to (if any).
pub(crate) fn control_acted<A: Serialize>(attempt: &A, callback: Option<String>) -> Response {
    axum::Json(json!({"attempt": attempt, "callback_url": callback})).into_response()
}

// ---------------------------------------------------------------------------
// Small helpers shared by the providers

/// Parses an `application/x-www-form-urlencoded` body or query string;
/// the first value of a repeated name wins.
pub(crate) fn parse_form(body: &[u8]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for (k, v) in form_urlencoded::parse(body) {
        out.entry(k.into_owned()).or_insert_with(|| v.into_owned());
    }
    out
}

/// `url` with `pairs` appended to its query (`?` or `&`), before any
/// fragment.
pub(crate) fn with_query(url: &str, pairs: &[(&str, &str)]) -> String {
    let (head, fragment) = match url.split_once('#') {
        Some((h, f)) => (h, Some(f)),
        None => (url, None),
    };
    let mut ser = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        ser.append_pair(k, v);
    }
    let query = ser.finish();
    let sep = if head.contains('?') {
        if head.ends_with('?') || head.ends_with('&') {
            ""
        } else {
            "&"
        }
    } else {
        "?"
    };
    let mut out = format!("{head}{sep}{query}");
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// A rupee amount as eSewa/Fonepay send it (`100`, `100.5`, `100.50`) in
/// paisa: digits with at most one `.` and two decimals, no sign.
pub(crate) fn parse_rupees(s: &str) -> Option<i64> {
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) => (w, f),
        None => (s, ""),
    };
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Trailing zeros past the paisa are harmless ("100.000").
    let frac = frac.trim_end_matches('0');
    if frac.len() > 2 || whole.len() > 15 {
        return None;
    }
    let rupees: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let paisa: i64 = match frac.len() {
        0 => 0,
        1 => frac.parse::<i64>().ok()? * 10,
        _ => frac.parse().ok()?,
    };
    rupees.checked_mul(100)?.checked_add(paisa)
}

/// Paisa rendered the way Java's `Double.toString` renders rupees, as
/// eSewa and Fonepay do: `1000.0`, `110.5`, `100.25`, and `1.0E7` from ten
/// million rupees up.
pub(crate) fn java_double(paisa: i64) -> String {
    let rupees = paisa / 100;
    let frac = paisa % 100;
    let frac_digits = if frac == 0 {
        String::new()
    } else if frac % 10 == 0 {
        (frac / 10).to_string()
    } else {
        format!("{frac:02}")
    };
    if rupees < 10_000_000 {
        let f = if frac_digits.is_empty() {
            "0".to_owned()
        } else {
            frac_digits
        };
        return format!("{rupees}.{f}");
    }
    let int_digits = rupees.to_string();
    let exponent = int_digits.len() - 1;
    let mut mantissa = format!("{}{}", &int_digits[1..], frac_digits);
    while mantissa.ends_with('0') {
        mantissa.pop();
    }
    if mantissa.is_empty() {
        mantissa.push('0');
    }
    format!("{}.{}E{}", &int_digits[..1], mantissa, exponent)
}

/// `n` random characters from `alphabet`.
pub(crate) fn random_string(alphabet: &[u8], n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| {
            let i = rng.random_range(0..alphabet.len());
            char::from(alphabet[i])
        })
        .collect()
}

pub(crate) const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
pub(crate) const UPPER_ALNUM: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
pub(crate) const HEX: &[u8] = b"0123456789abcdef";

/// Nepal time (UTC+05:45).
pub(crate) fn nepal_now() -> chrono::DateTime<chrono::FixedOffset> {
    let offset =
        chrono::FixedOffset::east_opt(5 * 3600 + 45 * 60).unwrap_or_else(|| chrono::Utc.fix());
    chrono::Utc::now().with_timezone(&offset)
}

pub(crate) fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

// ---------------------------------------------------------------------------
// The index page

async fn index(State(st): State<SimState>) -> Response {
    let base = st.base();
    let cfg = st.config();
    let mut body = String::new();
    body.push_str("<h1>Payment provider simulators</h1><p class=muted>Offline eSewa, Khalti and Fonepay for development and tests. No real money moves.</p>");

    body.push_str("<h2>Credentials</h2><ul>");
    for m in &cfg.esewa_merchants {
        body.push_str(&format!(
            "<li>eSewa product_code <code>{}</code>, secret <code>{}</code></li>",
            page::esc(&m.product_code),
            page::esc(&m.secret_key)
        ));
    }
    for k in &cfg.khalti_secret_keys {
        let note = if k == KHALTI_DOCS_SECRET_KEY {
            " (the test key Khalti's docs print: accepted here too)"
        } else {
            ""
        };
        body.push_str(&format!(
            "<li>Khalti <code>Authorization: Key {}</code>{note}</li>",
            page::esc(k)
        ));
    }
    body.push_str("<li>Khalti's API takes JSON or form-encoded bodies; eSewa's form takes its fields in the body or the query string.</li>");
    for m in &cfg.fonepay_merchants {
        body.push_str(&format!(
            "<li>Fonepay merchantCode <code>{}</code>, secret <code>{}</code>, username <code>{}</code>, password <code>{}</code></li>",
            page::esc(&m.merchant_code),
            page::esc(&m.secret_key),
            page::esc(&m.username),
            page::esc(&m.password)
        ));
    }
    body.push_str("</ul>");

    body.push_str(&format!(
        "<h2>Endpoints</h2><ul>\
         <li>eSewa form <code>POST {b}/esewa/api/epay/main/v2/form</code></li>\
         <li>eSewa status <code>GET {b}/esewa/api/epay/transaction/status/</code></li>\
         <li>Khalti API base <code>{b}/khalti/api/v2/</code> (epayment/initiate/, epayment/lookup/)</li>\
         <li>Khalti refund <code>POST {b}/khalti/api/merchant-transaction/&lt;transaction_id&gt;/refund/</code></li>\
         <li>Fonepay API base <code>{b}/fonepay/api</code> (merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrDownload, …GetStatus)</li>\
         <li>Fonepay web redirect <code>{b}/fonepay/api/merchantRequest</code></li>\
         <li>SMS (Sparrow-style) <code>POST {b}/sms/api/v2/sms/</code>; sent messages <code>GET {b}/sms/_control/messages</code></li>\
         <li>Mail (SES stand-in) <code>POST {b}/mail/send</code>; inbox <code>GET {b}/mail/_control/messages</code>; bounce <code>POST {b}/mail/_control/bounce</code></li>\
         </ul>",
        b = page::esc(base)
    ));

    body.push_str("<h2>Attempts</h2>");
    let mut rows = String::new();
    {
        let book = st.esewa();
        for key in book.order.iter().rev().take(20) {
            if let Some(a) = book.attempts.get(key) {
                rows.push_str(&format!(
                    "<tr><td>eSewa</td><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td></tr>",
                    page::esc(&format!("{base}/esewa/wallet/{}", page::path_seg(key))),
                    page::esc(key),
                    page::esc(&a.total_amount),
                    page::esc(&a.status)
                ));
            }
        }
    }
    {
        let book = st.khalti();
        for key in book.order.iter().rev().take(20) {
            if let Some(a) = book.attempts.get(key) {
                rows.push_str(&format!(
                    "<tr><td>Khalti</td><td><a href=\"{}\">{}</a></td><td>{} paisa</td><td>{}</td></tr>",
                    page::esc(&khalti::payment_url(&st, key)),
                    page::esc(&a.purchase_order_id),
                    a.amount,
                    page::esc(&a.status)
                ));
            }
        }
    }
    {
        let book = st.fonepay();
        for key in book.order.iter().rev().take(20) {
            if let Some(a) = book.attempts.get(key) {
                rows.push_str(&format!(
                    "<tr><td>Fonepay {}</td><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td></tr>",
                    page::esc(&a.kind),
                    page::esc(&fonepay::page_url(&st, a)),
                    page::esc(key),
                    page::esc(&a.amount),
                    page::esc(&a.status)
                ));
            }
        }
    }
    if rows.is_empty() {
        body.push_str("<p class=muted>None yet.</p>");
    } else {
        body.push_str(&format!(
            "<table><tr><th>Provider</th><th>Reference</th><th>Amount</th><th>Status</th></tr>{rows}</table>"
        ));
    }
    page::html(
        StatusCode::OK,
        page::layout("Simulators", page::Brand::Neutral, &body),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rupees_parse_and_render() {
        assert_eq!(parse_rupees("100"), Some(10000));
        assert_eq!(parse_rupees("100.5"), Some(10050));
        assert_eq!(parse_rupees("100.05"), Some(10005));
        assert_eq!(parse_rupees("100.0"), Some(10000));
        assert_eq!(parse_rupees("100.000"), Some(10000));
        assert_eq!(parse_rupees("100.001"), None);
        assert_eq!(parse_rupees("-1"), None);
        assert_eq!(parse_rupees("1,000"), None);
        assert_eq!(parse_rupees(""), None);
        assert_eq!(parse_rupees("."), None);
        assert_eq!(java_double(100000), "1000.0");
        assert_eq!(java_double(11050), "110.5");
        assert_eq!(java_double(10025), "100.25");
        assert_eq!(java_double(10005), "100.05");
        assert_eq!(java_double(5), "0.05");
        assert_eq!(java_double(1_000_000_000), "1.0E7");
        assert_eq!(java_double(1_234_567_850), "1.23456785E7");
    }

    #[test]
    fn query_appending() {
        assert_eq!(
            with_query("http://m/s", &[("a", "b c")]),
            "http://m/s?a=b+c"
        );
        assert_eq!(
            with_query("http://m/s?x=1", &[("a", "1")]),
            "http://m/s?x=1&a=1"
        );
        assert_eq!(
            with_query("http://m/s?x=1#f", &[("a", "+")]),
            "http://m/s?x=1&a=%2B#f"
        );
    }
}
