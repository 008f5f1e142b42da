//! The demo merchant the local gateway creates on first start, its keys
//! (kept in `demo-keys.json` so restarts print the same ones) and optional
//! sample payments.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, json};
use shared::AppState;
use shared::domain::Tenant;
use shared::domain::account::{
    self, ApiKey, KeyKind, NewKey, Plan, Project, Scope, hash_secret, shape_of_key,
};
use shared::domain::credentials::{
    CredentialsError, ProviderCredentials, list_configured_providers, put_credentials,
};
use shared::domain::dashboard;
use shared::domain::payments::{self, Payment, PaymentStatus};
use shared::domain::record::{Changes, Record, from_item};
use shared::domain::{Mode, Provider};
use shared::ids::{MerchantId, ProjectId};
use shared::money::{Currency, Paisa};
use shared::store::{Cond, Key, StoreError};

/// `demo-keys.json`: the secrets of the demo keys, for scripts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemoKeys {
    pub sandbox: String,
    pub live: String,
    /// `pk_test_…`: for an app (the mobile endpoints only).
    #[serde(default)]
    pub sandbox_publishable: String,
    /// `pk_live_…`.
    #[serde(default)]
    pub live_publishable: String,
    /// The demo owner's dashboard sign-in (`/dashboard`).
    #[serde(default)]
    pub dashboard_email: String,
    #[serde(default)]
    pub dashboard_password: String,
}

impl DemoKeys {
    fn slot(&mut self, mode: Mode, kind: KeyKind) -> &mut String {
        match (mode, kind) {
            (Mode::Sandbox, KeyKind::Publishable) => &mut self.sandbox_publishable,
            (Mode::Live, KeyKind::Publishable) => &mut self.live_publishable,
            (Mode::Sandbox, _) => &mut self.sandbox,
            (Mode::Live, _) => &mut self.live,
        }
    }
}

/// What the store remembers about the demo merchant.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DemoAccount {
    pub merchant_id: MerchantId,
    pub project_id: ProjectId,
    #[serde(default)]
    pub payments_seeded: bool,
    #[serde(skip)]
    pub keys: DemoKeys,
}

shared::attrs! { DemoAccount {
    MERCHANT_ID: MerchantId = merchant_id,
    PROJECT_ID: ProjectId = project_id,
    PAYMENTS_SEEDED: bool = payments_seeded,
} }

impl Record for DemoAccount {
    fn item_key(&self) -> Key {
        marker_key()
    }
}

/// The demo owner's dashboard email.
pub const DEMO_OWNER: &str = "owner@himalayan-java.example";

fn marker_key() -> Key {
    Key::new("DEMO", "DEMO")
}

/// Creates the demo merchant, project and keys on first start; later
/// starts reuse them. Keys whose secrets were lost (file deleted) are
/// replaced by new ones.
pub async fn bootstrap(state: &AppState, keys_file: &Path) -> Result<DemoAccount, String> {
    let store = &*state.store;
    let now = state.clock.now();
    let err = |e: StoreError| format!("demo setup failed: {e}");

    let mut demo: DemoAccount = match store.get(&marker_key()).await.map_err(err)? {
        Some(item) => from_item(item).map_err(err)?,
        None => {
            let merchant = account::create_merchant(
                store,
                now,
                "Himalayan Java Demo",
                "owner@himalayan-java.example",
                Plan::Growth,
            )
            .await
            .map_err(err)?;
            let project = account::create_project(store, now, &merchant, "Demo shop", true)
                .await
                .map_err(err)?;
            // Invoices show who bills (the operator sets this in production).
            account::set_seller(
                store,
                &project.id,
                Some(&account::Seller {
                    name: Some("Himalayan Java".into()),
                    legal_name: Some("Himalayan Java Coffee Pvt. Ltd.".into()),
                    email: Some("billing@himalayan-java.example".into()),
                    logo_url: None,
                    brand_color: Some("#7c2d12".into()),
                }),
            )
            .await
            .map_err(err)?;
            let demo = DemoAccount {
                merchant_id: merchant.id,
                project_id: project.id,
                payments_seeded: false,
                keys: DemoKeys::default(),
            };
            let item = demo.to_item().map_err(err)?;
            store.put(item, Some(Cond::NotExists)).await.map_err(err)?;
            demo
        }
    };

    let saved: Option<DemoKeys> = std::fs::read_to_string(keys_file)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok());
    let mut keys = DemoKeys::default();
    let mut changed = false;
    let kinds = [
        (Mode::Sandbox, KeyKind::Secret),
        (Mode::Live, KeyKind::Secret),
        (Mode::Sandbox, KeyKind::Publishable),
        (Mode::Live, KeyKind::Publishable),
    ];
    for (mode, kind) in kinds {
        let remembered = saved.clone().map(|mut k| k.slot(mode, kind).clone());
        let publishable = kind == KeyKind::Publishable;
        let usable = match remembered {
            Some(secret) if shape_of_key(&secret) == Some((mode, publishable)) => {
                let known = store
                    .get(&ApiKey::key_for_hash(&hash_secret(&secret)))
                    .await
                    .map_err(err)?;
                known.map(|_| secret)
            }
            _ => None,
        };
        let secret = match usable {
            Some(secret) => secret,
            None => {
                changed = true;
                issue_demo_key(state, &demo.project_id, mode, kind)
                    .await
                    .map_err(err)?
            }
        };
        *keys.slot(mode, kind) = secret;
    }
    // The dashboard's demo owner: the remembered password if it still
    // signs in, else a new one (a reset, if the user exists).
    let project = account::get_project(state, &demo.project_id)
        .await
        .map_err(err)?
        .ok_or_else(|| format!("demo project {} is missing", demo.project_id))?;
    account::list_under_merchant(store, &project)
        .await
        .map_err(err)?;
    let remembered = saved
        .as_ref()
        .filter(|k| k.dashboard_email == DEMO_OWNER && !k.dashboard_password.is_empty());
    let user_err = |e: dashboard::DashboardError| format!("demo dashboard user: {e}");
    let existing = dashboard::find_user_by_email(store, DEMO_OWNER)
        .await
        .map_err(user_err)?;
    let still_signs_in = match (&existing, remembered) {
        (Some(user), Some(k)) => {
            dashboard::verify_password(&k.dashboard_password, &user.password_hash).await
        }
        _ => false,
    };
    keys.dashboard_email = DEMO_OWNER.to_owned();
    keys.dashboard_password = match (still_signs_in, remembered, existing) {
        (true, Some(k), _) => k.dashboard_password.clone(),
        (_, _, existing) => {
            changed = true;
            let password = dashboard::new_form_token();
            match existing {
                Some(_) => {
                    dashboard::reset_password(store, DEMO_OWNER, &password)
                        .await
                        .map_err(user_err)?;
                }
                None => {
                    dashboard::create_user(
                        state,
                        now,
                        &demo.merchant_id,
                        DEMO_OWNER,
                        dashboard::Role::Owner,
                        &password,
                    )
                    .await
                    .map_err(user_err)?;
                }
            }
            password
        }
    };
    if changed || saved.is_none() {
        write_keys_file(keys_file, &keys)?;
    }
    demo.keys = keys;
    Ok(demo)
}

async fn issue_demo_key(
    state: &AppState,
    project_id: &ProjectId,
    mode: Mode,
    kind: KeyKind,
) -> Result<String, StoreError> {
    let store = &*state.store;
    let project: Project = match store.get(&Project::key(project_id)).await? {
        Some(item) => from_item(item)?,
        None => {
            return Err(StoreError::Backend(format!(
                "demo project {project_id} is missing"
            )));
        }
    };
    let scopes = match kind {
        KeyKind::Publishable => Vec::new(),
        _ => Scope::ALL.to_vec(),
    };
    let new = NewKey {
        mode,
        kind,
        scopes,
        description: format!("Local demo key ({}, {kind:?})", mode.as_str()),
        expires_at: None,
        spend_cap_paisa: None,
    };
    let (secret, _) = account::issue_api_key(state, state.clock.now(), &project, new).await?;
    Ok(secret)
}

fn write_keys_file(path: &Path, keys: &DemoKeys) -> Result<(), String> {
    let text = serde_json::to_string_pretty(keys).map_err(|e| e.to_string())?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text + "\n")
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600));
    }
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Seeds sample payments in both modes, once. Returns how many it wrote.
pub async fn seed_payments(state: &AppState, demo: &DemoAccount) -> Result<usize, StoreError> {
    if demo.payments_seeded {
        return Ok(0);
    }
    let store = &*state.store;
    let now = state.clock.now();
    let samples: [(Provider, i64, PaymentStatus, Option<&str>); 8] = [
        (Provider::Esewa, 150_000, PaymentStatus::Success, None),
        (Provider::Khalti, 45_000, PaymentStatus::Success, None),
        (
            Provider::Fonepay,
            80_000,
            PaymentStatus::Failed,
            Some("Customer did not complete the QR payment"),
        ),
        (Provider::Khalti, 12_000, PaymentStatus::Pending, None),
        (Provider::Esewa, 250_000, PaymentStatus::Refunded, None),
        (
            Provider::Khalti,
            99_900,
            PaymentStatus::Cancelled,
            Some("Customer cancelled at the provider"),
        ),
        (Provider::Esewa, 30_000, PaymentStatus::Processing, None),
        (Provider::Fonepay, 60_000, PaymentStatus::Success, None),
    ];
    let customers = [
        ("Sita Sharma", "sita@example.com", "9841000001"),
        ("Bikash Gurung", "bikash@example.com", "9801000002"),
        ("Anjali Thapa", "anjali@example.com", "9761000003"),
    ];
    let mut written = 0;
    for mode in [Mode::Sandbox, Mode::Live] {
        for (i, (provider, amount, status, reason)) in samples.iter().enumerate() {
            let created = now.plus(chrono::Duration::minutes(i as i64 - samples.len() as i64));
            let (name, email, phone) = customers[i % customers.len()];
            let mut metadata = Map::new();
            metadata.insert("order_id".into(), json!(format!("ORD-{}", 1001 + i)));
            let paid = matches!(status, PaymentStatus::Success | PaymentStatus::Refunded);
            let payment = Payment {
                id: shared::ids::PaymentId::new(),
                project_id: demo.project_id.clone(),
                checkout_session_id: shared::ids::SessionId::new(),
                mode,
                amount: Paisa::new(*amount).unwrap_or_default(),
                amount_refunded: if *status == PaymentStatus::Refunded {
                    Paisa::new(*amount).unwrap_or_default()
                } else {
                    Paisa::ZERO
                },
                amount_reserved: Paisa::ZERO,
                currency: Currency::Npr,
                provider: *provider,
                status: *status,
                provider_ref: paid
                    .then(|| format!("{}-DEMO-{}", provider.as_str().to_uppercase(), 5000 + i)),
                failure_reason: reason.map(str::to_owned),
                metadata,
                customer_name: Some(name.into()),
                customer_email: Some(email.into()),
                customer_phone: Some(phone.into()),
                created_at: created,
                updated_at: created,
                double_payment_of: None,
                scanned_at: None,
                attempt: Default::default(),
                checks: Default::default(),
                gsi2pk: None,
                gsi2sk: None,
            };
            payments::insert(store, &payment).await?;
            written += 1;
        }
    }
    store
        .update(
            &marker_key(),
            Changes::new()
                .set(DemoAccount::PAYMENTS_SEEDED, &true)
                .into(),
            Some(Cond::Exists),
        )
        .await?;
    Ok(written)
}

/// The Fonepay merchant the simulator knows (Fonepay's published demo
/// credentials). Fonepay has no sandbox: a sandbox project needs real
/// credentials, so the demo project gets these, which only the simulator
/// accepts.
pub fn simulator_fonepay_credentials() -> ProviderCredentials {
    ProviderCredentials::Fonepay {
        merchant_code: "NBQM".into(),
        secret_key: "a7e3512f5032480a83137793cb2021dc".into(),
        username: "9861101076".into(),
        password: "admin123456".into(),
    }
}

/// Gives the demo project sandbox fonepay credentials (the simulator's)
/// unless it has some, so a newcomer can pay with all three providers.
pub async fn ensure_fonepay_credentials(
    state: &AppState,
    demo: &DemoAccount,
) -> Result<(), String> {
    let Some(keys) = state.providers.keys() else {
        return Ok(());
    };
    let err = |e: CredentialsError| format!("demo fonepay credentials: {e}");
    let configured = list_configured_providers(&*state.store, &demo.project_id)
        .await
        .map_err(err)?;
    if configured
        .iter()
        .any(|c| c.provider == Provider::Fonepay && c.mode == Mode::Sandbox)
    {
        return Ok(());
    }
    put_credentials(
        &*state.store,
        keys,
        state.clock.now(),
        &Tenant::new(demo.project_id.clone(), Mode::Sandbox),
        &simulator_fonepay_credentials(),
    )
    .await
    .map_err(err)?;
    Ok(())
}
