//! Provider credentials in the dashboard: which providers the project has
//! credentials for in this mode, whether each still opens with the master
//! key, a button asking the provider whether they work
//! (`credentials::ask_provider`), and a form per provider to set them.
//! Values go in and are never shown back (the page has no field holding
//! one). Owners and developers; in live mode only owners set them
//! (`dashboard::allows`).

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use edge::html::html;
use http::StatusCode;
use maud::html as markup;
use shared::AppState;
use shared::domain::Provider;
use shared::domain::credentials::{self, Asked, CredentialsError, ProviderCredentials};
use shared::domain::dashboard::Action;
use shared::domain::fees::{self, FeeRateError};

use crate::pages::{layout, status_badge, when};
use shared::providers::probe::Verdict;

use crate::{Page, Signed, fail, nav, query, see_other};

/// Said when this deployment has no credentials master key.
const NO_MASTER_KEY: &str = "This deployment has no credentials master key: nothing can be sealed or opened. Ask your operator.";

/// One field of a provider's form: its name, its label, whether it is a
/// secret (a password field).
type Field = (&'static str, &'static str, bool);

/// The fields of each provider's form.
const FIELDS: [(Provider, &[Field]); 3] = [
    (
        Provider::Esewa,
        &[
            ("product_code", "Product code", false),
            ("secret_key", "Secret key", true),
        ],
    ),
    (Provider::Khalti, &[("secret_key", "Live secret key", true)]),
    (
        Provider::Fonepay,
        &[
            ("merchant_code", "Merchant code", false),
            ("secret_key", "Secret key", true),
            ("username", "Username", false),
            ("password", "Password", true),
        ],
    ),
];

/// The page refusing what needs the credentials master key (503).
async fn no_master_key(state: &AppState, signed: &Signed) -> Page {
    show(
        state,
        signed,
        None,
        Some(NO_MASTER_KEY),
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await
}

async fn show(
    state: &AppState,
    signed: &Signed,
    notice: Option<&str>,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let tenant = &signed.tenant;
    let configured = credentials::configured_in(state, tenant)
        .await
        .map_err(|e| fail(shared::refusal::Refusal::internal(&e)))?;
    // The check: each set opens with the master key (no value shown).
    let mut rows = Vec::new();
    for c in &configured {
        let verdict = match state.providers.keys() {
            None => "no master key configured here".to_owned(),
            Some(_) => match credentials::opened(state, tenant, c.provider).await {
                Ok(Some(_)) => "ok".to_owned(),
                Ok(None) => "removed meanwhile".to_owned(),
                Err(e) => e.to_string(),
            },
        };
        rows.push((c, verdict));
    }
    let rates = fees::configured(state, tenant)
        .await
        .map_err(|e| fail(shared::refusal::Refusal::internal(&e)))?;
    let rate_of = |p: Provider| rates.iter().find(|r| r.provider == p);
    let nav = nav(state, signed, "credentials").await?;
    let may_set = signed.allows(Action::SetCredentials);
    let body = markup! {
        @if let Some(n) = notice { p.notice role="status" { (n) } }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        div.panel {
            @if rows.is_empty() {
                p { "No provider credentials in this mode: payments use Dhukuti's sandbox accounts, or cannot start live." }
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "Provider" } th scope="col" { "Opens with the master key" }
                        th scope="col" { "Sealed with" } th scope="col" { "Set" } th scope="col" { "Do they work?" }
                    } }
                    tbody { @for (c, verdict) in &rows {
                        tr {
                            td { (c.provider.as_str()) }
                            td { (status_badge(if verdict == "ok" { "success" } else { "failed" })) " " (verdict) }
                            td { (c.master_key) }
                            td { (when(c.updated_at)) }
                            td {
                                form method="post" action="/dashboard/credentials/check" {
                                    input type="hidden" name="csrf" value=(nav.csrf);
                                    input type="hidden" name="provider" value=(c.provider.as_str());
                                    button type="submit" { "Ask " (c.provider.display_name()) }
                                }
                            }
                        }
                    } }
                }
            }
        }
        @if !may_set {
            p.panel.muted { "Only an owner can set or replace live credentials; developers can in sandbox." }
        }
        section.panel aria-labelledby="fees-title" {
            h2 id="fees-title" { "Provider fees" }
            p.muted { "What each provider charges you under your contract, used for a payment's fee and net where the provider does not state its fee (eSewa always; Fonepay without its QR notification). Snapshotted on each payment when it succeeds." }
            table {
                thead { tr { th scope="col" { "Provider" } th scope="col" { "Rate (basis points)" } th scope="col" { "Fixed (paisa)" } th scope="col" { "Set" } } }
                tbody { @for provider in Provider::ALL {
                    tr {
                        td { (provider.as_str()) }
                        @if let Some(r) = rate_of(provider) {
                            td { (r.basis_points) } td { (r.fixed.get()) } td { (when(r.updated_at)) }
                        } @else {
                            td { "—" } td { "—" } td { "not configured" }
                        }
                    }
                } }
            }
            @if may_set {
                @for provider in Provider::ALL {
                    form.stack method="post" action="/dashboard/credentials/fees" {
                        input type="hidden" name="csrf" value=(nav.csrf);
                        input type="hidden" name="provider" value=(provider.as_str());
                        label for={ "fee-bps-" (provider.as_str()) } { (provider.as_str()) " rate in basis points (250 = 2.5 %; both empty removes it)" }
                        input id={ "fee-bps-" (provider.as_str()) } name="basis_points" inputmode="numeric" maxlength="5" value=(rate_of(provider).map(|r| r.basis_points.to_string()).unwrap_or_default());
                        label for={ "fee-fixed-" (provider.as_str()) } { (provider.as_str()) " fixed part in paisa" }
                        input id={ "fee-fixed-" (provider.as_str()) } name="fixed" inputmode="numeric" maxlength="7" value=(rate_of(provider).map(|r| r.fixed.get().to_string()).unwrap_or_default());
                        button type="submit" { "Save " (provider.as_str()) " fee" }
                    }
                }
            }
        }
        @for (provider, fields) in FIELDS.iter().filter(|_| may_set) {
            section.panel aria-labelledby={ "set-" (provider.as_str()) } {
                h2 id={ "set-" (provider.as_str()) } { "Set " (provider.as_str()) " credentials" }
                form.stack method="post" action="/dashboard/credentials" autocomplete="off" {
                    input type="hidden" name="csrf" value=(nav.csrf);
                    input type="hidden" name="provider" value=(provider.as_str());
                    @for (name, text, secret) in fields.iter() {
                        label for={ (provider.as_str()) "-" (name) } { (text) }
                        @if *secret {
                            input id={ (provider.as_str()) "-" (name) } name=(name) type="password" required maxlength="200" autocomplete="new-password";
                        } @else {
                            input id={ (provider.as_str()) "-" (name) } name=(name) required maxlength="200";
                        }
                    }
                    button.primary type="submit" { "Save " (provider.as_str()) " credentials" }
                }
            }
        }
    };
    Ok(html(status, layout(&nav, "Provider credentials", body)))
}

pub async fn page(State(state): State<AppState>, signed: Signed, RawQuery(raw): RawQuery) -> Page {
    signed.require(Action::ReadCredentials)?;
    let q = query(&raw);
    let notice = q
        .get("saved")
        .and_then(|p| Provider::parse(p))
        .map(|p| {
            format!(
                "{} credentials saved and sealed; they are never shown again.",
                p.as_str()
            )
        })
        .or_else(|| {
            q.get("fee")
                .and_then(|p| Provider::parse(p))
                .map(|p| format!("{} fee saved.", p.as_str()))
        });
    show(&state, &signed, notice.as_deref(), None, StatusCode::OK).await
}

/// Asks the provider whether the project's credentials there work, and
/// shows its verdict (never a value).
pub async fn check(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::ReadCredentials, &body)?;
    let Some(provider) = f.get("provider").and_then(|p| Provider::parse(p)) else {
        return show(
            &state,
            &signed,
            None,
            Some("Choose a provider"),
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
    };
    if state.providers.keys().is_none() {
        return no_master_key(&state, &signed).await;
    }
    let asked = credentials::ask_provider(&state, &signed.tenant, provider)
        .await
        .map_err(|e| fail(shared::refusal::Refusal::internal(&e)))?;
    let name = provider.display_name();
    let verdict = match asked {
        Asked::NoneStored => {
            let why = format!("No {name} credentials of this project in this mode to ask about.");
            return show(
                &state,
                &signed,
                None,
                Some(&why),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await;
        }
        Asked::Throttled { retry_after } => {
            let why = format!(
                "Too many checks for this project lately: ask again in {} minutes.",
                (retry_after + 59) / 60
            );
            return show(
                &state,
                &signed,
                None,
                Some(&why),
                StatusCode::TOO_MANY_REQUESTS,
            )
            .await;
        }
        Asked::Verdict(v) => v,
    };
    crate::audit(
        &state,
        &signed,
        "credentials.check",
        provider.as_str(),
        verdict.word(),
    )
    .await?;
    let said = verdict.message();
    match verdict {
        Verdict::Refused(_) => show(&state, &signed, None, Some(said), StatusCode::OK).await,
        _ => show(&state, &signed, Some(said), None, StatusCode::OK).await,
    }
}

pub async fn set(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::SetCredentials, &body)?;
    let value = |name: &str| f.get(name).map(|v| v.trim().to_owned()).unwrap_or_default();
    let creds = match f.get("provider").and_then(|p| Provider::parse(p)) {
        Some(Provider::Esewa) => ProviderCredentials::Esewa {
            product_code: value("product_code"),
            secret_key: value("secret_key"),
        },
        Some(Provider::Khalti) => ProviderCredentials::Khalti {
            secret_key: value("secret_key"),
        },
        Some(Provider::Fonepay) => ProviderCredentials::Fonepay {
            merchant_code: value("merchant_code"),
            secret_key: value("secret_key"),
            username: value("username"),
            password: value("password"),
        },
        None => {
            return show(
                &state,
                &signed,
                None,
                Some("Choose a provider"),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await;
        }
    };
    let provider = creds.provider();
    if state.providers.keys().is_none() {
        return no_master_key(&state, &signed).await;
    }
    // Which provider and mode, never a value; written with the credentials.
    let audit = signed.audit_op(
        &state,
        "credentials.set",
        provider.as_str(),
        signed.session.mode.as_str(),
    )?;
    let saved = credentials::set(&state, &signed.tenant, &creds, audit).await;
    match saved {
        Ok(_) => Ok(see_other(&format!(
            "/dashboard/credentials?saved={}",
            provider.as_str()
        ))),
        Err(CredentialsError::Invalid(why)) => {
            show(
                &state,
                &signed,
                None,
                Some(&format!("Not saved: {why}")),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await
        }
        Err(e) => Err(fail(shared::refusal::Refusal::internal(&e))),
    }
}

/// Sets (or, both fields empty, removes) the project's fee rate at one
/// provider in this mode (`domain::fees`): whole basis points and paisa.
pub async fn set_fee(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::SetCredentials, &body)?;
    let refuse = |why: String| {
        let state = state.clone();
        let signed = &signed;
        async move {
            show(
                &state,
                signed,
                None,
                Some(&why),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await
        }
    };
    let Some(provider) = f.get("provider").and_then(|p| Provider::parse(p)) else {
        return refuse("Choose a provider".into()).await;
    };
    let field = |name: &str| f.get(name).map(|v| v.trim().to_owned()).unwrap_or_default();
    let (bps, fixed) = (field("basis_points"), field("fixed"));
    if bps.is_empty() && fixed.is_empty() {
        let audit = signed.audit_op(
            &state,
            "fees.clear",
            provider.as_str(),
            signed.session.mode.as_str(),
        )?;
        fees::unconfigure(&state, &signed.tenant, provider, audit)
            .await
            .map_err(|e| fail(shared::refusal::Refusal::internal(&e)))?;
        return Ok(see_other(&format!(
            "/dashboard/credentials?fee={}",
            provider.as_str()
        )));
    }
    let whole = |v: &str| {
        if v.is_empty() {
            Some(0)
        } else if v.bytes().all(|b| b.is_ascii_digit()) && v.len() <= 9 {
            v.parse::<i64>().ok()
        } else {
            None
        }
    };
    let (Some(bps), Some(fixed)) = (whole(&bps), whole(&fixed)) else {
        return refuse(
            "Not saved: the rate and the fixed part are whole numbers (basis points, paisa)".into(),
        )
        .await;
    };
    let detail = format!("{} {bps} bps + {fixed} paisa", signed.session.mode.as_str());
    let audit = signed.audit_op(&state, "fees.set", provider.as_str(), &detail)?;
    match fees::configure(&state, &signed.tenant, provider, bps, fixed, audit).await {
        Ok(_) => Ok(see_other(&format!(
            "/dashboard/credentials?fee={}",
            provider.as_str()
        ))),
        Err(FeeRateError::Store(e)) => Err(fail(shared::refusal::Refusal::internal(&e))),
        Err(e) => refuse(format!("Not saved: {e}")).await,
    }
}
