//! `dhukuti-admin`: onboard and run merchants without a dashboard.
//!
//!     cargo run -p dhukuti --bin dhukuti-admin -- merchant create --name "Himal Traders" \
//!         --email owner@himal.example --plan growth
//!     dhukuti-admin project create --merchant mer_… --name "Main shop"
//!     dhukuti-admin key issue --project proj_… --mode live --scopes all --kind secret
//!     dhukuti-admin project seller --project proj_… --name "Himal Traders" \
//!         --email billing@himal.example --logo-url https://himal.example/logo.png \
//!         --brand-color '#0f766e'
//!     DHUKUTI_CREDENTIALS_KEY=… dhukuti-admin credentials set --project proj_… \
//!         --mode live --provider khalti --secret-key-stdin < khalti.txt
//!     dhukuti-admin payments held
//!     dhukuti-admin payments release pay_… --recheck|--succeed|--fail "why"
//!     dhukuti-admin listen [--events payment.succeeded] [--forward-to URL]
//!     dhukuti-admin trigger payment.succeeded|all [--endpoint we_…]
//!     dhukuti-admin reconcile proj_… khalti 2026-11-28 [--mode live]
//!     dhukuti-admin reconcile proj_… esewa 2026-11-28 --file statement.xlsx
//!
//! Every command takes `--json` for scripts (data on stdout, messages on
//! stderr). Bad input exits 2, a failed operation 1.
//!
//! The store is chosen in one place, [`open_store`]: for now the embedded
//! store at `$DHUKUTI_DATA_DIR/dhukuti.redb` (default `.dhukuti`), which one
//! process at a time may hold, so the local gateway must be stopped first.
//! `listen` and `trigger` are the exception: they talk HTTP to a running
//! gateway (`dhukuti::listen`) and never open the store.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use dhukuti::listen;
use serde::Serialize;
use serde_json::{Value, json};
use shared::app::Backend;
use shared::domain::Tenant;
use shared::domain::account::{
    self, ApiKey, KeyKind, Merchant, NewKey, Pause, Plan, Project, Scope, Seller, Suspension,
};
use shared::domain::credentials::{
    self, ConfiguredProvider, CredentialsError, CredentialsKey, CredentialsKeys,
    ProviderCredentials,
};
use shared::domain::{Mode, Provider};
use shared::ids::{ApiKeyId, EndpointId, MerchantId, PaymentId, ProjectId, TypedId};
use shared::store::embedded::EmbeddedStore;
use shared::store::{Store, StoreError};
use shared::time::{Clock, SystemClock, Timestamp};
use shared::{AppState, Deps};

#[path = "admin/users.rs"]
mod users;

const SECRET_WARNING: &str = "This is the only time this secret is shown: store it now. \
     Dhukuti keeps only its hash and cannot show it again.";

// ---------------------------------------------------------------- arguments

#[derive(Parser, Debug)]
#[command(
    name = "dhukuti-admin",
    version,
    about = "Onboard and run Dhukuti merchants: merchants, projects, API keys, provider credentials; \
             receive and trigger sandbox webhooks from a running gateway.",
    after_help = "Environment:\n  \
        DHUKUTI_DATA_DIR          data directory of the embedded store (default ./.dhukuti)\n  \
        DHUKUTI_BACKEND           store backend (default embedded)\n  \
        DHUKUTI_CREDENTIALS_KEY   master key sealing provider credentials: base64 of 32 bytes, or id:base64\n  \
        DHUKUTI_CREDENTIALS_PREVIOUS_KEYS   older master keys, comma-separated id:base64\n  \
        DHUKUTI_PUBLIC_URL        public base URL of the hosted pages (payments release: link events)\n\n\
        listen and trigger talk HTTP to a running gateway (--api) and take its sandbox key\n\
        from $DHUKUTI_DATA_DIR/demo-keys.json unless --key is given."
)]
struct Cli {
    /// Print the result as JSON on stdout (messages stay on stderr).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create, suspend, reinstate merchants and change their plan.
    #[command(subcommand)]
    Merchant(MerchantCmd),
    /// Create projects and change their settings.
    #[command(subcommand)]
    Project(ProjectCmd),
    /// Issue, list, rotate and revoke API keys.
    #[command(subcommand)]
    Key(KeyCmd),
    /// Store a project's credentials at eSewa, Khalti and Fonepay (encrypted).
    #[command(subcommand)]
    Credentials(CredentialsCmd),
    /// Dashboard users: create, reset a password, disable, list.
    #[command(subcommand)]
    User(users::UserCmd),
    /// Payments held for review: list them, release one as decided.
    #[command(subcommand)]
    Payments(PaymentsCmd),
    /// The filtered payment and refund lists: list and count a project's
    /// older records (once after upgrading; rerunning changes nothing).
    #[command(subcommand)]
    Lists(ListsCmd),
    /// Receive sandbox webhooks here: register a local receiver with a running
    /// gateway, verify and print each delivery; Ctrl-C deletes the endpoint.
    Listen(ListenArgs),
    /// Send test events (one type, or `all`) to a webhook endpoint of a running gateway.
    Trigger(TriggerArgs),
    /// Create the demo merchant, project, keys, dashboard owner and the
    /// simulators' sandbox Fonepay credentials in the configured backend
    /// (once; later runs print the same), and print what a tester needs
    /// (SAM local: infra/README.md).
    Seed(SeedArgs),
    /// Reconcile one provider's Nepal day for a project: Khalti's
    /// transaction list is pulled; eSewa and Fonepay take the statement
    /// file from their merchant portal (--file). Prints the run and its
    /// counts; the same statement again answers the run it made.
    /// `reconcile enroll <project>` lists the project for the daily
    /// Khalti pull.
    Reconcile(ReconcileArgs),
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct ReconcileArgs {
    #[command(subcommand)]
    cmd: Option<ReconcileCmd>,
    /// The project (`proj_…`).
    #[arg(value_name = "PROJECT_ID", required = true)]
    project_id: Option<String>,
    #[arg(value_enum, required = true)]
    provider: Option<ProviderArg>,
    /// The Nepal calendar day, YYYY-MM-DD.
    #[arg(value_name = "YYYY-MM-DD", required = true)]
    date: Option<String>,
    /// The statement file (eSewa, Fonepay): CSV, XLSX or XLS as the
    /// portal exports it.
    #[arg(long, value_name = "PATH")]
    file: Option<std::path::PathBuf>,
    #[arg(long, value_enum, default_value = "sandbox")]
    mode: ModeArg,
}

#[derive(Args, Debug)]
struct SeedArgs {
    /// Where the API answers (for the example commands printed): `sam local
    /// start-api`'s default.
    #[arg(long, default_value = "http://127.0.0.1:3000")]
    api: String,
}

/// Where the running gateway is and which sandbox key to use.
#[derive(Args, Debug)]
struct GatewayArgs {
    /// Base URL of the running gateway.
    #[arg(long, default_value = listen::DEFAULT_API)]
    api: String,
    /// Sandbox secret key (default: "sandbox" in $DHUKUTI_DATA_DIR/demo-keys.json).
    #[arg(long, value_name = "sk_test_…")]
    key: Option<String>,
}

#[derive(Args, Debug)]
struct ListenArgs {
    #[command(flatten)]
    gateway: GatewayArgs,
    /// Comma-separated event types to receive (default: every type).
    #[arg(long, value_delimiter = ',', value_name = "TYPE,…")]
    events: Vec<String>,
    /// Port of the receiver on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Also POST each verified delivery (same body and headers) to this URL
    /// and answer the gateway with its status.
    #[arg(long, value_name = "URL")]
    forward_to: Option<String>,
}

#[derive(Args, Debug)]
struct TriggerArgs {
    /// An event type (e.g. payment.succeeded) or `all`.
    #[arg(value_name = "TYPE|all")]
    what: String,
    #[command(flatten)]
    gateway: GatewayArgs,
    /// The endpoint (default: the newest enabled one).
    #[arg(long, value_name = "we_…")]
    endpoint: Option<String>,
}

#[derive(Subcommand, Debug)]
enum MerchantCmd {
    /// Create a merchant.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long)]
        email: String,
        #[arg(long, value_enum)]
        plan: PlanArg,
    },
    /// Show a merchant.
    Show { merchant_id: String },
    /// Suspend a merchant: every call of its keys answers 403.
    Suspend {
        merchant_id: String,
        /// Why (shown to the merchant in `error.suspension`).
        #[arg(long)]
        reason: String,
    },
    /// Lift a suspension.
    Reinstate { merchant_id: String },
    /// Change a merchant's plan.
    SetPlan {
        merchant_id: String,
        #[arg(long, value_enum)]
        plan: PlanArg,
    },
}

#[derive(Subcommand, Debug)]
enum ProjectCmd {
    /// Create a project of a merchant.
    Create {
        #[arg(long = "merchant", value_name = "MERCHANT_ID")]
        merchant_id: String,
        #[arg(long)]
        name: String,
        /// Enable live one-time invoices (sandbox always has them).
        #[arg(long)]
        live_invoicing: bool,
    },
    /// Show a project.
    Show { project_id: String },
    /// Change a project's settings.
    Set {
        project_id: String,
        /// Enable or disable live one-time invoices.
        #[arg(long, value_name = "true|false")]
        live_invoicing: Option<bool>,
    },
    /// List a project created before the dashboard under its merchant, so
    /// the dashboard's project switch shows it (new projects already are).
    ListUnderMerchant { project_id: String },
    /// Set the seller profile copied onto the project's invoices when they
    /// are finalized (issued invoices keep the seller they were issued with).
    Seller(SellerArgs),
}

/// The seller profile: the flags given replace those fields (an empty
/// value clears one), the others stay; `--clear` removes the profile.
#[derive(Args, Debug)]
struct SellerArgs {
    #[arg(long = "project", value_name = "PROJECT_ID")]
    project_id: String,
    /// The seller's trading name.
    #[arg(long)]
    name: Option<String>,
    /// The registered (legal) name.
    #[arg(long)]
    legal_name: Option<String>,
    /// The billing email shown on invoices.
    #[arg(long)]
    email: Option<String>,
    /// The logo, an https URL.
    #[arg(long, value_name = "https://…")]
    logo_url: Option<String>,
    /// The brand colour, #RGB or #RRGGBB.
    #[arg(long, value_name = "#RRGGBB")]
    brand_color: Option<String>,
    /// Remove the whole profile: invoices finalized from now on carry no seller.
    #[arg(
        long,
        conflicts_with_all = ["name", "legal_name", "email", "logo_url", "brand_color"]
    )]
    clear: bool,
}

#[derive(Subcommand, Debug)]
enum PaymentsCmd {
    /// List the payments held for review (oldest hold first) with why.
    Held {
        /// At most this many.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: u16,
    },
    /// Take a payment off hold as you decided, after checking with the
    /// provider's merchant portal.
    #[command(group(ArgGroup::new("decision").required(true).args(["recheck", "succeed", "fail"])))]
    Release {
        payment_id: String,
        /// Back to the reconciler, due now (held again if the provider's
        /// answer still does not match).
        #[arg(long)]
        recheck: bool,
        /// The money is there: `success`, with its event.
        #[arg(long)]
        succeed: bool,
        /// No money (or it was returned): `failed`, with this reason.
        #[arg(long, value_name = "REASON")]
        fail: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum ReconcileCmd {
    /// List the project's tenants (both modes) whose own Khalti
    /// credentials were stored before the daily pull existed, so the
    /// daily pull takes them. Idempotent: rerunning changes nothing.
    Enroll { project_id: String },
}

#[derive(Subcommand, Debug)]
enum ListsCmd {
    /// List and count the project's payments and refunds from before the
    /// filtered lists, in both modes, then mark it covered (its totals
    /// then come from counters). Idempotent, safe while traffic runs.
    Migrate { project_id: String },
}

#[derive(Subcommand, Debug)]
enum KeyCmd {
    /// Issue a key; its secret is printed once.
    Issue {
        #[arg(long = "project", value_name = "PROJECT_ID")]
        project_id: String,
        #[arg(long, value_enum)]
        mode: ModeArg,
        /// Comma-separated scopes (e.g. payments:read,payments:write) or
        /// `all`; none for a publishable key.
        #[arg(long, value_parser = parse_scopes)]
        scopes: Option<ScopeList>,
        #[arg(long, value_enum)]
        kind: KindArg,
        #[arg(long, default_value = "")]
        description: String,
        /// Lifetime, e.g. 30d, 12h, 90m, 2w (default: never expires).
        #[arg(long, value_parser = parse_lifetime)]
        expires_in: Option<Span>,
        /// Most this key may create in checkouts per calendar month, in paisa.
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        spend_cap_paisa: Option<i64>,
    },
    /// List a project's keys (never their secrets).
    List {
        #[arg(long = "project", value_name = "PROJECT_ID")]
        project_id: String,
    },
    /// Replace a key by a new one; the old one keeps working during the grace.
    Rotate {
        key_id: String,
        #[arg(long = "project", value_name = "PROJECT_ID")]
        project_id: String,
        /// How long the old key keeps working, e.g. 24h, 7d, 0s.
        #[arg(long, default_value = "24h", value_parser = parse_grace)]
        grace: Span,
        /// Lifetime of the new key (default: never expires).
        #[arg(long, value_parser = parse_lifetime)]
        expires_in: Option<Span>,
    },
    /// Revoke a key at once and for good.
    Revoke {
        key_id: String,
        #[arg(long = "project", value_name = "PROJECT_ID")]
        project_id: String,
    },
}

#[derive(Subcommand, Debug)]
enum CredentialsCmd {
    /// Store (or replace) a project's credentials at one provider, in one mode.
    Set(CredentialsSet),
    /// List the providers a project has credentials for (never the secrets).
    List {
        #[arg(long = "project", value_name = "PROJECT_ID")]
        project_id: String,
        /// Also decrypt each with the configured master key, to verify it.
        #[arg(long)]
        check: bool,
    },
    /// Remove a project's credentials at one provider, in one mode.
    Remove {
        #[arg(long = "project", value_name = "PROJECT_ID")]
        project_id: String,
        #[arg(long, value_enum)]
        mode: ModeArg,
        #[arg(long, value_enum)]
        provider: ProviderArg,
    },
    /// Print a new random master key for DHUKUTI_CREDENTIALS_KEY.
    GenerateKey {
        /// Key id stored beside each ciphertext (for rotating the master key).
        #[arg(long, default_value = credentials::DEFAULT_KEY_ID)]
        id: String,
    },
}

#[derive(Args, Debug)]
#[command(group(
    ArgGroup::new("secret_key_source")
        .args(["secret_key", "secret_key_env", "secret_key_stdin"])
        .required(true)
        .multiple(false)
))]
#[command(group(
    ArgGroup::new("password_source")
        .args(["password", "password_env", "password_stdin"])
        .multiple(false)
))]
struct CredentialsSet {
    #[arg(long = "project", value_name = "PROJECT_ID")]
    project_id: String,
    #[arg(long, value_enum)]
    mode: ModeArg,
    #[arg(long, value_enum)]
    provider: ProviderArg,
    /// eSewa: the product code.
    #[arg(long)]
    product_code: Option<String>,
    /// Fonepay: the merchant code.
    #[arg(long)]
    merchant_code: Option<String>,
    /// Fonepay: the username.
    #[arg(long)]
    username: Option<String>,
    /// The secret key (visible in shell history: prefer the -env or -stdin forms).
    #[arg(long)]
    secret_key: Option<String>,
    /// Read the secret key from this environment variable.
    #[arg(long, value_name = "VAR")]
    secret_key_env: Option<String>,
    /// Read the secret key from the first line of stdin.
    #[arg(long)]
    secret_key_stdin: bool,
    /// Fonepay: the password (visible in shell history: prefer the -env or -stdin forms).
    #[arg(long)]
    password: Option<String>,
    /// Fonepay: read the password from this environment variable.
    #[arg(long, value_name = "VAR")]
    password_env: Option<String>,
    /// Fonepay: read the password from stdin (the line after the secret key
    /// when both come from stdin).
    #[arg(long)]
    password_stdin: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PlanArg {
    Free,
    Growth,
    Pro,
}

impl From<PlanArg> for Plan {
    fn from(p: PlanArg) -> Plan {
        match p {
            PlanArg::Free => Plan::Free,
            PlanArg::Growth => Plan::Growth,
            PlanArg::Pro => Plan::Pro,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ModeArg {
    Sandbox,
    Live,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Sandbox => Mode::Sandbox,
            ModeArg::Live => Mode::Live,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum KindArg {
    Secret,
    Restricted,
    /// `pk_…`: for apps; calls only the mobile endpoints.
    Publishable,
}

impl From<KindArg> for KeyKind {
    fn from(k: KindArg) -> KeyKind {
        match k {
            KindArg::Secret => KeyKind::Secret,
            KindArg::Restricted => KeyKind::Restricted,
            KindArg::Publishable => KeyKind::Publishable,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ProviderArg {
    Esewa,
    Khalti,
    Fonepay,
}

impl From<ProviderArg> for Provider {
    fn from(p: ProviderArg) -> Provider {
        match p {
            ProviderArg::Esewa => Provider::Esewa,
            ProviderArg::Khalti => Provider::Khalti,
            ProviderArg::Fonepay => Provider::Fonepay,
        }
    }
}

/// Validated scopes, in the order given, without repeats.
#[derive(Clone, Debug)]
struct ScopeList(Vec<Scope>);

fn parse_scopes(text: &str) -> Result<ScopeList, String> {
    let valid = || {
        Scope::ALL
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if text.trim() == "all" {
        return Ok(ScopeList(Scope::ALL.to_vec()));
    }
    let mut scopes = Vec::new();
    for part in text.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(format!(
                "empty scope in {text:?}; give a comma-separated list or `all`"
            ));
        }
        let scope = Scope::parse(part)
            .ok_or_else(|| format!("unknown scope {part:?}; valid scopes: all, {}", valid()))?;
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    Ok(ScopeList(scopes))
}

/// A span of time as given on the command line (`30d`).
#[derive(Clone, Debug)]
struct Span {
    duration: chrono::Duration,
}

const MAX_SPAN_DAYS: i64 = 3650;

fn parse_span(text: &str, allow_zero: bool) -> Result<Span, String> {
    let t = text.trim();
    let hint = "e.g. 90s, 15m, 24h, 30d, 2w";
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: i64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration ({hint})"))?;
    let seconds_per = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        "" if n == 0 => 1,
        _ => return Err(format!("{text:?} is not a duration ({hint})")),
    };
    if n == 0 && !allow_zero {
        return Err(format!("{text:?}: the duration must be positive"));
    }
    let seconds = n
        .checked_mul(seconds_per)
        .filter(|s| *s <= MAX_SPAN_DAYS * 86_400)
        .ok_or_else(|| format!("{text:?} is longer than {MAX_SPAN_DAYS} days"))?;
    Ok(Span {
        duration: chrono::Duration::seconds(seconds),
    })
}

fn parse_lifetime(text: &str) -> Result<Span, String> {
    parse_span(text, false)
}

fn parse_grace(text: &str) -> Result<Span, String> {
    parse_span(text, true)
}

// ------------------------------------------------------------------ failure

/// How a command failed: bad input (exit 2) or a failed operation (exit 1).
#[derive(Debug)]
enum Failure {
    Usage(String),
    Failed(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Failed(_) => 1,
        }
    }
    fn message(&self) -> &str {
        match self {
            Failure::Usage(m) | Failure::Failed(m) => m,
        }
    }
}

fn failed(context: &str) -> impl FnOnce(StoreError) -> Failure + '_ {
    move |e| Failure::Failed(format!("{context}: {e}"))
}

fn cred_failed(e: CredentialsError) -> Failure {
    match e {
        CredentialsError::MissingKey
        | CredentialsError::BadKey(_)
        | CredentialsError::Invalid(_) => Failure::Usage(e.to_string()),
        other => Failure::Failed(other.to_string()),
    }
}

/// `raw` as an id of `T`, or a usage failure saying it is not a `what` id.
fn parse_id<T: TypedId>(raw: &str, what: &str) -> Result<T, Failure> {
    T::parse(raw).ok_or_else(|| {
        Failure::Usage(format!(
            "{raw:?} is not a {what} id (expected {}…)",
            T::KIND.prefix()
        ))
    })
}

fn non_empty(value: &str, flag: &str) -> Result<String, Failure> {
    let v = value.trim();
    if v.is_empty() {
        Err(Failure::Usage(format!("{flag} cannot be empty")))
    } else if v.chars().any(char::is_control) {
        Err(Failure::Usage(format!(
            "{flag} cannot contain control characters"
        )))
    } else {
        Ok(v.to_owned())
    }
}

// ------------------------------------------------------------------ seller

/// Longest seller name or legal name (as an invoice's other text fields).
const MAX_SELLER_TEXT: usize = shared::fields::InvoiceText::MAX;
const MAX_LOGO_URL: usize = 2048;

/// A seller text field: trimmed, `""` clears it.
fn seller_text(value: &str, flag: &str) -> Result<Option<String>, Failure> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(None);
    }
    if v.chars().any(char::is_control) {
        return Err(Failure::Usage(format!(
            "{flag} cannot contain control characters"
        )));
    }
    if v.chars().count() > MAX_SELLER_TEXT {
        return Err(Failure::Usage(format!(
            "{flag} must be at most {MAX_SELLER_TEXT} characters"
        )));
    }
    Ok(Some(v.to_owned()))
}

fn seller_email(value: &str) -> Result<Option<String>, Failure> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(None);
    }
    if !account::is_plausible_email(v) {
        return Err(Failure::Usage(format!(
            "--email {v:?} is not an email address"
        )));
    }
    Ok(Some(v.to_owned()))
}

/// An absolute `https` URL with a host and no user name or password.
fn logo_url(value: &str) -> Result<Option<String>, Failure> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(None);
    }
    let bad = |why: &str| Failure::Usage(format!("--logo-url {v:?} {why}"));
    if v.len() > MAX_LOGO_URL {
        return Err(bad(&format!("is longer than {MAX_LOGO_URL} characters")));
    }
    if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("contains spaces or control characters"));
    }
    let url = reqwest::Url::parse(v).map_err(|e| bad(&format!("is not a URL ({e})")))?;
    if url.scheme() != "https" {
        return Err(bad("must be an https URL"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("must not carry a user name or password"));
    }
    Ok(Some(v.to_owned()))
}

/// `#RGB` or `#RRGGBB`, kept in lower case.
fn brand_color(value: &str) -> Result<Option<String>, Failure> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(None);
    }
    let ok = v.strip_prefix('#').is_some_and(|hex| {
        matches!(hex.len(), 3 | 6) && hex.bytes().all(|b| b.is_ascii_hexdigit())
    });
    if !ok {
        return Err(Failure::Usage(format!(
            "--brand-color {v:?} must be #RGB or #RRGGBB (hex digits), e.g. '#0f766e'"
        )));
    }
    Ok(Some(v.to_ascii_lowercase()))
}

/// The seller profile after the edits of `args` on `current`: each flag
/// given replaces its field (an empty value clears it), the others stay.
/// `None` when nothing is left (or `--clear`).
fn edited_seller(current: Option<&Seller>, args: &SellerArgs) -> Result<Option<Seller>, Failure> {
    if args.clear {
        return Ok(None);
    }
    let mut seller = current.cloned().unwrap_or_default();
    if let Some(v) = &args.name {
        seller.name = seller_text(v, "--name")?;
    }
    if let Some(v) = &args.legal_name {
        seller.legal_name = seller_text(v, "--legal-name")?;
    }
    if let Some(v) = &args.email {
        seller.email = seller_email(v)?;
    }
    if let Some(v) = &args.logo_url {
        seller.logo_url = logo_url(v)?;
    }
    if let Some(v) = &args.brand_color {
        seller.brand_color = brand_color(v)?;
    }
    Ok((seller != Seller::default()).then_some(seller))
}

// -------------------------------------------------------------------- store

/// The one place the backend is chosen: `DHUKUTI_BACKEND` (`embedded`, the
/// default, in `DHUKUTI_DATA_DIR`; or `aws` with `DHUKUTI_TABLE` and the
/// standard AWS environment), exactly as the gateway and the functions do.
async fn open_store() -> Result<Arc<dyn Store>, String> {
    let backend = Backend::from_env()?;
    if let Backend::Embedded {
        data_dir,
        cache_mib,
    } = &backend
    {
        let path = data_dir.join("dhukuti.redb");
        return match EmbeddedStore::open_with_cache(&path, cache_mib.saturating_mul(1024 * 1024)) {
            Ok(store) => Ok(Arc::new(store)),
            Err(e) => {
                let text = e.to_string();
                if text.contains("already open") || text.contains("acquire lock") {
                    Err(format!(
                        "{} is in use by another process: stop the local gateway first \
                         (redb is single-process)",
                        path.display()
                    ))
                } else {
                    Err(format!(
                        "cannot open the embedded store {}: {text}",
                        path.display()
                    ))
                }
            }
        };
    }
    // The admin tool only needs the table: no queues or bucket lookups.
    backend.open_store().await
}

async fn store() -> Result<Arc<dyn Store>, Failure> {
    open_store().await.map_err(Failure::Failed)
}

/// The rules' dependencies over `store` (the domain functions the pages
/// call take them).
fn deps_of(store: &Arc<dyn Store>) -> AppState {
    AppState::new(
        store.clone(),
        Arc::new(SystemClock),
        shared::Config::from_env(),
    )
}

async fn merchant(store: &dyn Store, id: &MerchantId) -> Result<Merchant, Failure> {
    account::get_merchant(store, id)
        .await
        .map_err(failed("cannot read the merchant"))?
        .ok_or_else(|| Failure::Failed(format!("merchant {id} not found")))
}

async fn project(deps: &Deps, id: &ProjectId) -> Result<Project, Failure> {
    account::get_project(deps, id)
        .await
        .map_err(failed("cannot read the project"))?
        .ok_or_else(|| Failure::Failed(format!("project {id} not found")))
}

async fn api_key(
    deps: &Deps,
    project_id: &ProjectId,
    key_id: &ApiKeyId,
) -> Result<ApiKey, Failure> {
    account::find_api_key(deps, project_id, key_id)
        .await
        .map_err(failed("cannot read the key"))?
        .ok_or_else(|| {
            Failure::Failed(format!(
                "key {key_id} not found in project {project_id} (or already revoked)"
            ))
        })
}

// ------------------------------------------------------------------- output

/// What a command prints: JSON for `--json`, text lines otherwise.
struct Output {
    json: Value,
    text: Vec<String>,
    /// Printed on stderr after the result.
    notes: Vec<String>,
}

impl Output {
    fn new(json: Value, text: Vec<String>) -> Self {
        Output {
            json,
            text,
            notes: Vec::new(),
        }
    }

    fn note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }
}

fn to_json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn ts(t: Option<Timestamp>) -> String {
    t.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into())
}

fn merchant_lines(m: &Merchant) -> Vec<String> {
    let mut lines = vec![
        format!("merchant  {}", m.id),
        format!("name      {}", m.name),
        format!("email     {}", m.email),
        format!("plan      {}", plan_str(m.plan)),
        format!("created   {}", m.created_at),
    ];
    match &m.suspension {
        Some(s) => lines.push(format!(
            "status    suspended since {} ({})",
            s.suspended_at, s.reason
        )),
        None => lines.push("status    active".into()),
    }
    lines
}

fn plan_str(p: Plan) -> &'static str {
    match p {
        Plan::Free => "free",
        Plan::Growth => "growth",
        Plan::Pro => "pro",
    }
}

fn project_lines(p: &Project) -> Vec<String> {
    let mut lines = vec![
        format!("project         {}", p.id),
        format!("merchant        {}", p.merchant_id),
        format!("name            {}", p.name),
        format!("live invoicing  {}", p.live_invoicing),
        format!("created         {}", p.created_at),
    ];
    match &p.seller {
        None => lines.push("seller          -".into()),
        Some(s) => {
            let field = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
            lines.extend([
                format!("seller name     {}", field(&s.name)),
                format!("legal name      {}", field(&s.legal_name)),
                format!("seller email    {}", field(&s.email)),
                format!("logo URL        {}", field(&s.logo_url)),
                format!("brand colour    {}", field(&s.brand_color)),
            ]);
        }
    }
    lines
}

/// A key as the CLI shows it: everything but the hash (and never a secret).
#[derive(Serialize)]
struct KeySummary {
    id: String,
    project_id: String,
    prefix: String,
    hint: String,
    mode: Mode,
    kind: KeyKind,
    scopes: Vec<String>,
    description: String,
    created_at: Timestamp,
    expires_at: Option<Timestamp>,
    last_used_at: Option<Timestamp>,
    spend_cap_paisa: Option<i64>,
    pause: Option<Pause>,
    status: &'static str,
}

fn summary(k: &ApiKey, now: Timestamp) -> KeySummary {
    let status = if k.expires_at.is_some_and(|t| t <= now) {
        "expired"
    } else if k.pause.is_some() {
        "paused"
    } else {
        "active"
    };
    KeySummary {
        id: k.id.to_string(),
        project_id: k.project_id.to_string(),
        prefix: k.prefix.clone(),
        hint: k.hint.clone(),
        mode: k.mode,
        kind: k.kind,
        scopes: k.scopes.clone(),
        description: k.description.clone(),
        created_at: k.created_at,
        expires_at: k.expires_at,
        last_used_at: k.last_used_at,
        spend_cap_paisa: k.spend_cap_paisa,
        pause: k.pause.clone(),
        status,
    }
}

fn kind_str(k: KeyKind) -> &'static str {
    match k {
        KeyKind::Secret => "secret",
        KeyKind::Restricted => "restricted",
        KeyKind::Publishable => "publishable",
    }
}

fn scopes_text(scopes: &[String]) -> String {
    let all = Scope::ALL
        .iter()
        .all(|s| scopes.iter().any(|x| x == s.as_str()));
    if all && scopes.len() == Scope::ALL.len() {
        "all".into()
    } else {
        scopes.join(",")
    }
}

fn key_lines(k: &ApiKey, now: Timestamp) -> Vec<String> {
    let s = summary(k, now);
    vec![
        format!("key          {}", s.id),
        format!("project      {}", s.project_id),
        format!("mode         {}", s.mode.as_str()),
        format!("kind         {}", kind_str(s.kind)),
        format!("scopes       {}", scopes_text(&s.scopes)),
        format!("prefix/hint  {}…{}", s.prefix, s.hint),
        format!("description  {}", s.description),
        format!("expires      {}", ts(s.expires_at)),
        format!(
            "spend cap    {}",
            s.spend_cap_paisa
                .map(|c| format!("{c} paisa"))
                .unwrap_or_else(|| "-".into())
        ),
        format!("status       {}", s.status),
    ]
}

fn table(header: &[&str], rows: Vec<Vec<String>>) -> Vec<String> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = vec![line(header.iter().map(|h| h.to_string()).collect())];
    out.extend(rows.into_iter().map(line));
    out
}

// ----------------------------------------------------------------- commands

async fn run(command: Command) -> Result<Output, Failure> {
    let now = SystemClock.now();
    match command {
        Command::Merchant(cmd) => merchant_cmd(cmd, now).await,
        Command::Project(cmd) => project_cmd(cmd, now).await,
        Command::Key(cmd) => key_cmd(cmd, now).await,
        Command::Credentials(cmd) => credentials_cmd(cmd, now).await,
        Command::Payments(cmd) => payments_cmd(cmd, now).await,
        Command::Lists(cmd) => lists_cmd(cmd).await,
        Command::User(cmd) => users::user_cmd(cmd, now).await,
        Command::Trigger(args) => trigger_cmd(args).await,
        Command::Seed(args) => seed_cmd(args).await,
        Command::Reconcile(args) => reconcile_cmd(args, now).await,
        // Runs until Ctrl-C, printing as it goes: see `main`.
        Command::Listen(_) => Err(Failure::Usage("listen runs on its own".into())),
    }
}

// ----------------------------------------------------------- reconcile

/// A run's refusal: bad input (the provider, the day, the file) exits 2,
/// anything else (Khalti unreachable, the store) 1.
fn run_failed(e: shared::domain::reconciliation::runs::RunError) -> Failure {
    use shared::domain::reconciliation::runs::RunError;
    match e {
        RunError::Provider
        | RunError::Day
        | RunError::File(_)
        | RunError::Field(..)
        | RunError::Account { .. } => {
            let refusal = shared::refusal::Refusal::from(e);
            let field = refusal.field.as_deref().unwrap_or("input");
            Failure::Usage(format!("{field}: {}", refusal.message))
        }
        other => Failure::Failed(format!("the run failed: {other}")),
    }
}

/// `reconcile enroll <project>`: the daily pull's list back-filled.
async fn enroll_cmd(project_id: &str, now: Timestamp) -> Result<Output, Failure> {
    use shared::domain::reconciliation::enroll;
    let id = parse_id::<ProjectId>(project_id, "project")?;
    let store = store().await?;
    let deps = deps_of(&store);
    project(&deps, &id).await?;
    let done = enroll::project(&*store, &id, now)
        .await
        .map_err(cred_failed)?;
    let text = vec![format!(
        "project {id}: listed {} for the daily Khalti pull (already {})",
        done.listed, done.already
    )];
    Ok(Output::new(to_json(&done), text))
}

async fn reconcile_cmd(args: ReconcileArgs, now: Timestamp) -> Result<Output, Failure> {
    use shared::domain::reconciliation::runs::{self, RunRequest, RunView};
    use shared::domain::reconciliation::statements::MAX_BYTES;
    if let Some(ReconcileCmd::Enroll { project_id }) = &args.cmd {
        return enroll_cmd(project_id, now).await;
    }
    let (Some(project_arg), Some(provider_arg), Some(date)) =
        (&args.project_id, args.provider, &args.date)
    else {
        return Err(Failure::Usage(
            "give PROJECT_ID PROVIDER YYYY-MM-DD, or `enroll PROJECT_ID`".into(),
        ));
    };
    let project_id = parse_id::<ProjectId>(project_arg, "project")?;
    let provider = Provider::from(provider_arg);
    runs::parse_day(date).map_err(run_failed)?;
    let file = match (provider, &args.file) {
        (Provider::Khalti, Some(_)) => {
            return Err(Failure::Usage(
                "--file: Khalti's statement is pulled from Khalti: give no file".into(),
            ));
        }
        (Provider::Khalti, None) => None,
        (_, None) => {
            return Err(Failure::Usage(format!(
                "--file is required: the {} statement file from the merchant portal \
                 (CSV, XLSX or XLS)",
                provider.display_name()
            )));
        }
        (_, Some(path)) => {
            let shown = path.display();
            let len = std::fs::metadata(path)
                .map_err(|e| Failure::Usage(format!("--file {shown}: {e}")))?
                .len();
            if len > MAX_BYTES as u64 {
                return Err(Failure::Usage(format!(
                    "--file {shown}: the file is over the limit of {MAX_BYTES} bytes"
                )));
            }
            Some(std::fs::read(path).map_err(|e| Failure::Usage(format!("--file {shown}: {e}")))?)
        }
    };
    // The master key opens the project's sealed credentials (its
    // merchant account, Khalti's key); without one only the sandbox
    // accounts of the environment work.
    let keys = match CredentialsKeys::from_env() {
        Ok(k) => Some(k),
        Err(CredentialsError::MissingKey) => None,
        Err(e) => return Err(cred_failed(e)),
    };
    let providers = shared::providers::hub::ProviderHub::from_env(keys).map_err(Failure::Usage)?;
    let store = store().await?;
    let state = deps_of(&store).with_providers(providers);
    project(&state, &project_id).await?;
    let tenant = Tenant::new(project_id, args.mode.into());
    let run = match &file {
        Some(bytes) => runs::start_file(&state, &tenant, provider.as_str(), date, bytes, now).await,
        None => {
            let req = RunRequest {
                provider: provider.as_str(),
                date,
                upload_id: None,
            };
            runs::start(&state, &tenant, &req, now).await
        }
    }
    .map_err(run_failed)?;
    let view = RunView::of(&run);
    let mut text = vec![
        format!("run        {}", run.id),
        format!("provider   {}", provider.as_str()),
        format!("date       {}", run.day),
        format!("source     {}", to_json(&run.source).as_str().unwrap_or("")),
        format!("status     {}", to_json(&run.status).as_str().unwrap_or("")),
        format!("lines      {}", run.lines),
        format!("ours       {} paisa", run.ours_total.get()),
        format!("theirs     {} paisa", run.theirs_total.get()),
    ];
    let counts = table(
        &["CLASSIFICATION", "FINDINGS"],
        shared::domain::reconciliation::matching::Classification::ALL
            .iter()
            .map(|c| vec![c.as_str().to_owned(), view.counts.of(*c).to_string()])
            .collect(),
    );
    text.extend(counts);
    let out = Output::new(to_json(&view), text);
    Ok(if run.created_at == now {
        out
    } else {
        out.note(format!(
            "this statement was run before: that run, unchanged (created {})",
            run.created_at.to_rfc3339()
        ))
    })
}

// ---------------------------------------------------------------- seed

async fn seed_cmd(args: SeedArgs) -> Result<Output, Failure> {
    let data_dir = listen::data_dir_from_env();
    let seeded = dhukuti::sam_local::seed(&data_dir)
        .await
        .map_err(Failure::Failed)?;
    let keys = &seeded.keys;
    let api = args.api.trim_end_matches('/');
    let keys_file = data_dir.join("demo-keys.json");
    let json = json!({
        "merchant": seeded.merchant_id,
        "project": seeded.project_id,
        "sandboxKey": keys.sandbox,
        "liveKey": keys.live,
        "sandboxPublishableKey": keys.sandbox_publishable,
        "livePublishableKey": keys.live_publishable,
        "dashboardEmail": keys.dashboard_email,
        "dashboardPassword": keys.dashboard_password,
        "fonepayCredentials": seeded.fonepay,
        "keysFile": keys_file.display().to_string(),
    });
    let text = vec![
        format!("merchant        {}", seeded.merchant_id),
        format!("project         {}", seeded.project_id),
        format!("sandbox key     {}", keys.sandbox),
        format!("live key        {}", keys.live),
        format!("publishable     {}", keys.sandbox_publishable),
        format!(
            "dashboard       {api}/dashboard  ({} / {})",
            keys.dashboard_email, keys.dashboard_password
        ),
        format!("keys file       {}", keys_file.display()),
        String::new(),
        "Try:".to_owned(),
        format!(
            "  curl -s {api}/v1/account -H 'Authorization: Bearer {}'",
            keys.sandbox
        ),
    ];
    let mut notes = vec![format!(
        "The keys are kept in {} (owner-only): the next seed prints the same ones.",
        keys_file.display()
    )];
    if !seeded.fonepay {
        notes.push(format!(
            "No credentials master key ({} or {}): no Fonepay credentials were stored; \
             eSewa and Khalti pay in sandbox without any.",
            credentials::KEY_ENV,
            credentials::KEY_SECRET_ENV
        ));
    }
    Ok(Output { json, text, notes })
}

// ------------------------------------------------------ webhooks over HTTP

fn gateway_key(gateway: &GatewayArgs) -> Result<String, Failure> {
    listen::sandbox_key(gateway.key.as_deref(), &listen::data_dir_from_env())
        .map_err(Failure::Usage)
}

async fn trigger_cmd(args: TriggerArgs) -> Result<Output, Failure> {
    listen::trigger_types(&args.what).map_err(Failure::Usage)?;
    if let Some(id) = &args.endpoint {
        parse_id::<EndpointId>(id, "webhook endpoint")?;
    }
    let key = gateway_key(&args.gateway)?;
    let api = listen::Api::new(&args.gateway.api, &key).map_err(Failure::Usage)?;
    let sent = listen::trigger(&api, &args.what, args.endpoint.as_deref())
        .await
        .map_err(Failure::Failed)?;
    let json = sent
        .iter()
        .map(|s| json!({"type": s.event_type, "id": s.event_id, "endpoint": s.endpoint_id}))
        .collect();
    let text = sent
        .iter()
        .map(|s| {
            format!(
                "sent {:<18} {}  to {}",
                s.event_type, s.event_id, s.endpoint_id
            )
        })
        .collect();
    Ok(Output::new(Value::Array(json), text))
}

/// `listen`: until Ctrl-C; deliveries on stdout, messages on stderr.
async fn listen_cmd(args: ListenArgs, json: bool) -> Result<(), Failure> {
    let events = listen::parse_event_types(&args.events).map_err(Failure::Usage)?;
    if let Some(url) = &args.forward_to {
        listen::check_forward_url(url).map_err(Failure::Usage)?;
    }
    let key = gateway_key(&args.gateway)?;
    let opts = listen::ListenOptions {
        api: args.gateway.api,
        key,
        events,
        port: args.port,
        forward_to: args.forward_to,
        json,
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let printer = listen::spawn_printer(rx);
    let result = listen::listen(opts, tx, listen::interrupted()).await;
    // Every sender is gone once `listen` returns: the printer drains and ends.
    let _ = printer.await;
    result.map(|_| ()).map_err(Failure::Failed)
}

async fn lists_cmd(cmd: ListsCmd) -> Result<Output, Failure> {
    use shared::domain::{Tenant, lists_migration};
    let store = store().await?;
    let ListsCmd::Migrate { project_id } = cmd;
    let id: ProjectId = parse_id(&project_id, "project id")?;
    let deps = deps_of(&store);
    project(&deps, &id).await?;
    let mut json = serde_json::Map::new();
    let mut text = Vec::new();
    for mode in [Mode::Sandbox, Mode::Live] {
        let done = lists_migration::migrate(&*store, &Tenant::new(id.clone(), mode))
            .await
            .map_err(failed("cannot migrate the lists"))?;
        let side = |m: &shared::domain::listing::Migrated| json!({"listed": m.listed, "already": m.already, "retried": m.retried});
        json.insert(
            mode.as_str().to_owned(),
            json!({
                "payments": side(&done.payments),
                "refunds": side(&done.refunds),
                "sessions": side(&done.sessions),
                "links": side(&done.links),
                "invoices": side(&done.invoices),
                "deliveries": side(&done.deliveries),
                "sms": side(&done.sms),
                "customers": side(&done.customers),
                "subscriptions": side(&done.subscriptions),
                "billingInvoices": side(&done.billing_invoices),
                "reports": side(&done.reports),
                "reconRuns": side(&done.recon_runs),
                "sessionsByStatus": side(&done.sessions_by_status),
                "linksByActive": side(&done.links_by_active),
                "invoicesByStatus": side(&done.invoices_by_status),
                "subscriptionsByFilter": side(&done.subscriptions_by_filter),
                "billingInvoicesByFilter": side(&done.billing_invoices_by_filter),
            }),
        );
        let lists = [
            ("payments", &done.payments),
            ("refunds", &done.refunds),
            ("sessions", &done.sessions),
            ("links", &done.links),
            ("invoices", &done.invoices),
            ("deliveries", &done.deliveries),
            ("sms", &done.sms),
            ("customers", &done.customers),
            ("subscriptions", &done.subscriptions),
            ("billing invoices", &done.billing_invoices),
            ("reports", &done.reports),
            ("reconciliation runs", &done.recon_runs),
            ("sessions by status", &done.sessions_by_status),
            ("links by active", &done.links_by_active),
            ("invoices by status", &done.invoices_by_status),
            ("subscriptions by filter", &done.subscriptions_by_filter),
            (
                "billing invoices by filter",
                &done.billing_invoices_by_filter,
            ),
        ];
        let parts: Vec<String> = lists
            .iter()
            .map(|(name, m)| format!("{name} listed {} (already {})", m.listed, m.already))
            .collect();
        text.push(format!("{:<8} {}", mode.as_str(), parts.join(", ")));
    }
    text.push(format!("project {id}: covered"));
    Ok(Output::new(Value::Object(json), text))
}

async fn payments_cmd(cmd: PaymentsCmd, now: Timestamp) -> Result<Output, Failure> {
    use shared::domain::attempts::{self, Release, ReleaseError};
    let store = store().await?;
    match cmd {
        PaymentsCmd::Held { limit } => {
            let held = attempts::held(&*store, usize::from(limit))
                .await
                .map_err(failed("cannot list the held payments"))?;
            let rows: Vec<Vec<String>> = held
                .iter()
                .map(|p| {
                    vec![
                        p.id.to_string(),
                        p.project_id.to_string(),
                        p.mode.as_str().to_owned(),
                        p.provider.as_str().to_owned(),
                        p.amount.get().to_string(),
                        p.attempt.reference.clone().unwrap_or_default(),
                        p.updated_at.to_rfc3339(),
                        p.checks.review.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            let json = Value::Array(
                held.iter()
                    .map(|p| {
                        json!({
                            "id": p.id, "project_id": p.project_id, "mode": p.mode.as_str(),
                            "provider": p.provider.as_str(), "amount_paisa": p.amount.get(),
                            "reference": p.attempt.reference, "held_since": p.updated_at.to_rfc3339(),
                            "reason": p.checks.review,
                        })
                    })
                    .collect(),
            );
            let text = if rows.is_empty() {
                vec!["no payment is held for review".to_owned()]
            } else {
                table(
                    &[
                        "ID",
                        "PROJECT",
                        "MODE",
                        "PROVIDER",
                        "PAISA",
                        "REFERENCE",
                        "HELD SINCE",
                        "REASON",
                    ],
                    rows,
                )
            };
            Ok(Output::new(json, text))
        }
        PaymentsCmd::Release {
            payment_id,
            recheck,
            succeed,
            fail,
        } => {
            let payment_id = parse_id::<PaymentId>(&payment_id, "payment")?;
            let decision = match (recheck, succeed, fail) {
                (true, false, None) => Release::Recheck,
                (false, true, None) => Release::Succeed,
                (false, false, Some(why)) => Release::Fail(non_empty(&why, "--fail")?),
                _ => {
                    return Err(Failure::Usage(
                        "give exactly one of --recheck, --succeed, --fail".into(),
                    ));
                }
            };
            // DHUKUTI_PUBLIC_URL, as the gateway's: a link's event names
            // the link's public page.
            let state =
                shared::AppState::new(store, Arc::new(SystemClock), shared::Config::from_env());
            let p = attempts::release(&state, &payment_id, decision, now)
                .await
                .map_err(|e| match e {
                    ReleaseError::NotFound => {
                        Failure::Failed(format!("payment {payment_id} not found"))
                    }
                    ReleaseError::NotHeld => {
                        Failure::Failed(format!("payment {payment_id} is not held for review"))
                    }
                    ReleaseError::NotApplied(_) => {
                        Failure::Failed(format!("payment {payment_id}: {e}"))
                    }
                    ReleaseError::Store(e) => {
                        Failure::Failed(format!("cannot release the payment: {e}"))
                    }
                })?;
            let status = to_json(&p.status);
            let word = status.as_str().unwrap_or("").to_owned();
            Ok(Output::new(
                json!({"id": p.id, "status": status, "review": p.checks.review}),
                vec![format!("payment {} released: {word}", p.id)],
            ))
        }
    }
}

async fn merchant_cmd(cmd: MerchantCmd, now: Timestamp) -> Result<Output, Failure> {
    match cmd {
        MerchantCmd::Create { name, email, plan } => {
            let name = non_empty(&name, "--name")?;
            let email = email.trim().to_owned();
            if !account::is_plausible_email(&email) {
                return Err(Failure::Usage(format!(
                    "--email {email:?} is not an email address"
                )));
            }
            let store = store().await?;
            let m = account::create_merchant(&*store, now, &name, &email, plan.into())
                .await
                .map_err(failed("cannot create the merchant"))?;
            Ok(Output::new(to_json(&m), merchant_lines(&m)))
        }
        MerchantCmd::Show { merchant_id } => {
            let merchant_id = parse_id::<MerchantId>(&merchant_id, "merchant")?;
            let store = store().await?;
            let m = merchant(&*store, &merchant_id).await?;
            Ok(Output::new(to_json(&m), merchant_lines(&m)))
        }
        MerchantCmd::Suspend {
            merchant_id,
            reason,
        } => {
            let merchant_id = parse_id::<MerchantId>(&merchant_id, "merchant")?;
            let reason = non_empty(&reason, "--reason")?;
            let store = store().await?;
            merchant(&*store, &merchant_id).await?;
            let suspension = Suspension {
                suspended_at: now,
                reason,
            };
            account::suspend_merchant(&*store, &merchant_id, suspension)
                .await
                .map_err(failed("cannot suspend the merchant"))?;
            let m = merchant(&*store, &merchant_id).await?;
            let mut text = merchant_lines(&m);
            text.push(
                "Every call of this merchant's keys now answers 403 account_suspended.".into(),
            );
            Ok(Output::new(to_json(&m), text))
        }
        MerchantCmd::Reinstate { merchant_id } => {
            let merchant_id = parse_id::<MerchantId>(&merchant_id, "merchant")?;
            let store = store().await?;
            merchant(&*store, &merchant_id).await?;
            let m = account::reinstate_merchant(&*store, &merchant_id)
                .await
                .map_err(failed("cannot reinstate the merchant"))?;
            Ok(Output::new(to_json(&m), merchant_lines(&m)))
        }
        MerchantCmd::SetPlan { merchant_id, plan } => {
            let merchant_id = parse_id::<MerchantId>(&merchant_id, "merchant")?;
            let store = store().await?;
            merchant(&*store, &merchant_id).await?;
            let m = account::set_plan(&*store, &merchant_id, plan.into())
                .await
                .map_err(failed("cannot change the plan"))?;
            Ok(Output::new(to_json(&m), merchant_lines(&m)))
        }
    }
}

async fn project_cmd(cmd: ProjectCmd, now: Timestamp) -> Result<Output, Failure> {
    match cmd {
        ProjectCmd::ListUnderMerchant { project_id } => {
            let project_id = parse_id::<ProjectId>(&project_id, "project")?;
            let store = store().await?;
            let p = project(&deps_of(&store), &project_id).await?;
            account::list_under_merchant(&*store, &p)
                .await
                .map_err(failed("cannot list the project under its merchant"))?;
            Ok(Output::new(to_json(&p), project_lines(&p)))
        }
        ProjectCmd::Create {
            merchant_id,
            name,
            live_invoicing,
        } => {
            let merchant_id = parse_id::<MerchantId>(&merchant_id, "merchant")?;
            let name = non_empty(&name, "--name")?;
            let store = store().await?;
            let m = merchant(&*store, &merchant_id).await?;
            let p = account::create_project(&*store, now, &m, &name, live_invoicing)
                .await
                .map_err(failed("cannot create the project"))?;
            // Its publishable keys, one per mode, come with it (for its
            // apps; shown here only, like every key).
            let mut json = to_json(&p);
            let mut text = project_lines(&p);
            for mode in [Mode::Sandbox, Mode::Live] {
                let new = NewKey {
                    mode,
                    kind: KeyKind::Publishable,
                    scopes: Vec::new(),
                    description: format!("Publishable ({})", mode.as_str()),
                    expires_at: None,
                    spend_cap_paisa: None,
                };
                let (secret, _) = account::issue_api_key(&deps_of(&store), now, &p, new)
                    .await
                    .map_err(failed("cannot issue the publishable key"))?;
                let field = format!("publishable_key_{}", mode.as_str());
                if let Some(o) = json.as_object_mut() {
                    o.insert(field.clone(), json!(secret));
                }
                text.push(format!("{field:<13}{secret}"));
            }
            Ok(Output::new(json, text))
        }
        ProjectCmd::Show { project_id } => {
            let project_id = parse_id::<ProjectId>(&project_id, "project")?;
            let store = store().await?;
            let p = project(&deps_of(&store), &project_id).await?;
            Ok(Output::new(to_json(&p), project_lines(&p)))
        }
        ProjectCmd::Set {
            project_id,
            live_invoicing,
        } => {
            let project_id = parse_id::<ProjectId>(&project_id, "project")?;
            let Some(enabled) = live_invoicing else {
                return Err(Failure::Usage(
                    "nothing to change: give --live-invoicing true|false".into(),
                ));
            };
            let store = store().await?;
            project(&deps_of(&store), &project_id).await?;
            let p = account::set_live_invoicing(&*store, &project_id, enabled)
                .await
                .map_err(failed("cannot change the project"))?;
            Ok(Output::new(to_json(&p), project_lines(&p)))
        }
        ProjectCmd::Seller(args) => {
            let project_id = parse_id::<ProjectId>(&args.project_id, "project")?;
            let nothing = !args.clear
                && args.name.is_none()
                && args.legal_name.is_none()
                && args.email.is_none()
                && args.logo_url.is_none()
                && args.brand_color.is_none();
            if nothing {
                return Err(Failure::Usage(
                    "nothing to change: give --name, --legal-name, --email, --logo-url, \
                     --brand-color or --clear"
                        .into(),
                ));
            }
            // Every value is checked before the store is opened.
            edited_seller(None, &args)?;
            let store = store().await?;
            let current = project(&deps_of(&store), &project_id).await?;
            let seller = edited_seller(current.seller.as_ref(), &args)?;
            let p = account::set_seller(&*store, &project_id, seller.as_ref())
                .await
                .map_err(failed("cannot change the seller profile"))?;
            let note = match &p.seller {
                Some(_) => {
                    "Invoices finalized from now on carry this seller; issued ones keep theirs."
                }
                None => {
                    "The project has no seller profile: invoices finalized from now on carry none."
                }
            };
            Ok(Output::new(to_json(&p), project_lines(&p)).note(note))
        }
    }
}

async fn key_cmd(cmd: KeyCmd, now: Timestamp) -> Result<Output, Failure> {
    match cmd {
        KeyCmd::Issue {
            project_id,
            mode,
            scopes,
            kind,
            description,
            expires_in,
            spend_cap_paisa,
        } => {
            let project_id = parse_id::<ProjectId>(&project_id, "project")?;
            if description.chars().any(char::is_control) || description.len() > 500 {
                return Err(Failure::Usage(
                    "--description must be at most 500 characters without control characters"
                        .into(),
                ));
            }
            let scopes = match (kind, scopes) {
                (KindArg::Publishable, None) => Vec::new(),
                (KindArg::Publishable, Some(_)) => {
                    return Err(Failure::Usage(
                        "a publishable key has no scopes: leave out --scopes".into(),
                    ));
                }
                (_, Some(s)) => s.0,
                (_, None) => {
                    return Err(Failure::Usage(
                        "--scopes is required for a secret or restricted key".into(),
                    ));
                }
            };
            let store = store().await?;
            let p = project(&deps_of(&store), &project_id).await?;
            let new = NewKey {
                mode: mode.into(),
                kind: kind.into(),
                scopes,
                description: description.trim().to_owned(),
                expires_at: expires_in.map(|s| now.plus(s.duration)),
                spend_cap_paisa,
            };
            let (secret, key) = account::issue_api_key(&deps_of(&store), now, &p, new)
                .await
                .map_err(failed("cannot issue the key"))?;
            let json = json!({
                "secret": secret,
                "warning": SECRET_WARNING,
                "key": to_json(&summary(&key, now)),
            });
            let mut text = key_lines(&key, now);
            text.push(String::new());
            text.push(format!("secret       {secret}"));
            Ok(Output::new(json, text).note(SECRET_WARNING))
        }
        KeyCmd::List { project_id } => {
            let project_id = parse_id::<ProjectId>(&project_id, "project")?;
            let store = store().await?;
            project(&deps_of(&store), &project_id).await?;
            let keys = account::list_api_keys(&deps_of(&store), &project_id)
                .await
                .map_err(failed("cannot list the keys"))?;
            let summaries: Vec<KeySummary> = keys.iter().map(|k| summary(k, now)).collect();
            let rows = summaries
                .iter()
                .map(|s| {
                    vec![
                        s.id.clone(),
                        s.prefix.clone(),
                        s.hint.clone(),
                        s.mode.as_str().to_owned(),
                        kind_str(s.kind).to_owned(),
                        scopes_text(&s.scopes),
                        ts(s.expires_at),
                        s.status.to_owned(),
                        s.description.clone(),
                    ]
                })
                .collect();
            let text = if summaries.is_empty() {
                vec![format!("project {project_id} has no keys")]
            } else {
                table(
                    &[
                        "ID",
                        "PREFIX",
                        "HINT",
                        "MODE",
                        "KIND",
                        "SCOPES",
                        "EXPIRES",
                        "STATUS",
                        "DESCRIPTION",
                    ],
                    rows,
                )
            };
            Ok(Output::new(to_json(&summaries), text))
        }
        KeyCmd::Rotate {
            key_id,
            project_id,
            grace,
            expires_in,
        } => {
            let key_id = parse_id::<ApiKeyId>(&key_id, "key")?;
            let project_id = parse_id::<ProjectId>(&project_id, "project")?;
            let store = store().await?;
            let old = api_key(&deps_of(&store), &project_id, &key_id).await?;
            let expires_at = expires_in.map(|s| now.plus(s.duration));
            let r =
                account::rotate_api_key(&deps_of(&store), now, &old, grace.duration, expires_at)
                    .await
                    .map_err(|e| match e {
                        StoreError::Invalid(m) => Failure::Failed(m),
                        e if e.is_condition_failure() => Failure::Failed(format!(
                            "key {key_id} was revoked or changed meanwhile; nothing was rotated"
                        )),
                        e => Failure::Failed(format!("cannot rotate the key: {e}")),
                    })?;
            let json = json!({
                "secret": r.secret,
                "warning": SECRET_WARNING,
                "new_key": to_json(&summary(&r.new_key, now)),
                "old_key": to_json(&summary(&r.old_key, now)),
            });
            let mut text = key_lines(&r.new_key, now);
            text.push(String::new());
            text.push(format!("secret       {}", r.secret));
            text.push(String::new());
            text.push(format!(
                "The old key {} keeps working until {}.",
                r.old_key.id,
                ts(r.old_key.expires_at)
            ));
            Ok(Output::new(json, text).note(SECRET_WARNING))
        }
        KeyCmd::Revoke { key_id, project_id } => {
            let key_id = parse_id::<ApiKeyId>(&key_id, "key")?;
            let project_id = parse_id::<ProjectId>(&project_id, "project")?;
            let store = store().await?;
            let key = api_key(&deps_of(&store), &project_id, &key_id).await?;
            account::revoke_api_key(&deps_of(&store), &key)
                .await
                .map_err(|e| match e {
                    StoreError::ConditionFailed => {
                        Failure::Failed(format!("key {key_id} was already revoked"))
                    }
                    e => Failure::Failed(format!("cannot revoke the key: {e}")),
                })?;
            Ok(Output::new(
                json!({"revoked": key_id, "project_id": project_id}),
                vec![format!(
                    "Revoked {key_id} ({}…{}): calls with it now answer 401.",
                    key.prefix, key.hint
                )],
            ))
        }
    }
}

/// Reads stdin once, lazily, and hands out its lines in order.
struct Stdin {
    lines: Option<std::vec::IntoIter<String>>,
}

impl Stdin {
    fn next_line(&mut self, what: &str) -> Result<String, Failure> {
        if self.lines.is_none() {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| Failure::Usage(format!("cannot read {what} from stdin: {e}")))?;
            let lines: Vec<String> = text
                .lines()
                .map(|l| l.trim_end_matches('\r').to_owned())
                .collect();
            self.lines = Some(lines.into_iter());
        }
        match self.lines.as_mut().and_then(Iterator::next) {
            Some(line) if !line.is_empty() => Ok(line),
            _ => Err(Failure::Usage(format!("stdin holds no {what}"))),
        }
    }
}

fn secret_value(
    what: &str,
    flag: &str,
    value: Option<String>,
    env: Option<String>,
    from_stdin: bool,
    stdin: &mut Stdin,
) -> Result<Option<String>, Failure> {
    if let Some(v) = value {
        eprintln!(
            "note: {flag} on the command line may be kept in shell history; \
             {flag}-env or {flag}-stdin avoid that"
        );
        return Ok(Some(v));
    }
    if let Some(var) = env {
        return match std::env::var(&var) {
            Ok(v) if !v.is_empty() => Ok(Some(v)),
            _ => Err(Failure::Usage(format!(
                "{flag}-env: environment variable {var} is not set or empty"
            ))),
        };
    }
    if from_stdin {
        return stdin.next_line(what).map(Some);
    }
    Ok(None)
}

fn provider_credentials(args: CredentialsSet) -> Result<ProviderCredentials, Failure> {
    let provider: Provider = args.provider.into();
    let name = provider.as_str();
    let mut stdin = Stdin { lines: None };
    let secret_key = secret_value(
        "secret key",
        "--secret-key",
        args.secret_key,
        args.secret_key_env,
        args.secret_key_stdin,
        &mut stdin,
    )?
    .ok_or_else(|| Failure::Usage("a secret key is required".into()))?;
    let password = secret_value(
        "password",
        "--password",
        args.password,
        args.password_env,
        args.password_stdin,
        &mut stdin,
    )?;
    let not_for = |flag: &str, given: bool| {
        if given {
            Err(Failure::Usage(format!("{flag} does not apply to {name}")))
        } else {
            Ok(())
        }
    };
    let required = |flag: &str, v: Option<String>| {
        v.ok_or_else(|| Failure::Usage(format!("{name} needs {flag}")))
    };
    let creds = match provider {
        Provider::Esewa => {
            not_for("--merchant-code", args.merchant_code.is_some())?;
            not_for("--username", args.username.is_some())?;
            not_for("--password", password.is_some())?;
            ProviderCredentials::Esewa {
                product_code: required("--product-code", args.product_code)?,
                secret_key,
            }
        }
        Provider::Khalti => {
            not_for("--product-code", args.product_code.is_some())?;
            not_for("--merchant-code", args.merchant_code.is_some())?;
            not_for("--username", args.username.is_some())?;
            not_for("--password", password.is_some())?;
            ProviderCredentials::Khalti { secret_key }
        }
        Provider::Fonepay => {
            not_for("--product-code", args.product_code.is_some())?;
            ProviderCredentials::Fonepay {
                merchant_code: required("--merchant-code", args.merchant_code)?,
                secret_key,
                username: required("--username", args.username)?,
                password: required("--password (or --password-env/--password-stdin)", password)?,
            }
        }
    };
    creds.validate().map_err(cred_failed)?;
    Ok(creds)
}

fn configured_lines(c: &ConfiguredProvider) -> Vec<String> {
    vec![format!(
        "{} credentials of project {} ({}) stored, sealed with key '{}' at {}",
        c.provider.as_str(),
        c.project_id,
        c.mode.as_str(),
        c.master_key,
        c.updated_at
    )]
}

async fn credentials_cmd(cmd: CredentialsCmd, now: Timestamp) -> Result<Output, Failure> {
    match cmd {
        CredentialsCmd::Set(args) => {
            let project_id = parse_id::<ProjectId>(&args.project_id, "project")?;
            let mode: Mode = args.mode.into();
            // The master key first: no secret is read for nothing.
            let keys = CredentialsKeys::from_env().map_err(cred_failed)?;
            let creds = provider_credentials(args)?;
            let store = store().await?;
            let c = credentials::put_credentials(
                &*store,
                &keys,
                now,
                &Tenant::new(project_id.clone(), mode),
                &creds,
            )
            .await
            .map_err(cred_failed)?;
            Ok(Output::new(to_json(&c), configured_lines(&c)))
        }
        CredentialsCmd::List { project_id, check } => {
            let project_id = parse_id::<ProjectId>(&project_id, "project")?;
            let keys = if check {
                Some(CredentialsKeys::from_env().map_err(cred_failed)?)
            } else {
                None
            };
            let store = store().await?;
            project(&deps_of(&store), &project_id).await?;
            let listed = credentials::list_configured_providers(&*store, &project_id)
                .await
                .map_err(cred_failed)?;
            let mut json_rows = Vec::new();
            let mut rows = Vec::new();
            let mut broken = 0;
            for c in &listed {
                let mut row = to_json(c);
                let mut cells = vec![
                    c.mode.as_str().to_owned(),
                    c.provider.as_str().to_owned(),
                    c.master_key.clone(),
                    c.updated_at.to_rfc3339(),
                ];
                if let Some(keys) = &keys {
                    let verdict = match credentials::get_credentials(
                        &*store,
                        keys,
                        &Tenant::new(project_id.clone(), c.mode),
                        c.provider,
                    )
                    .await
                    {
                        Ok(Some(_)) => "ok".to_owned(),
                        Ok(None) => "removed meanwhile".to_owned(),
                        Err(e) => {
                            broken += 1;
                            e.to_string()
                        }
                    };
                    if let Value::Object(map) = &mut row {
                        map.insert("check".into(), Value::from(verdict.clone()));
                    }
                    cells.push(verdict);
                }
                json_rows.push(row);
                rows.push(cells);
            }
            if broken > 0 {
                return Err(Failure::Failed(format!(
                    "{broken} of {} stored credentials do not decrypt with the configured key:\n{}",
                    listed.len(),
                    rows.iter()
                        .map(|r| r.join("  "))
                        .collect::<Vec<_>>()
                        .join("\n")
                )));
            }
            let mut header = vec!["MODE", "PROVIDER", "KEY ID", "UPDATED"];
            if keys.is_some() {
                header.push("CHECK");
            }
            let text = if listed.is_empty() {
                vec![format!(
                    "project {project_id} has no provider credentials yet"
                )]
            } else {
                table(&header, rows)
            };
            Ok(Output::new(Value::Array(json_rows), text))
        }
        CredentialsCmd::Remove {
            project_id,
            mode,
            provider,
        } => {
            let project_id = parse_id::<ProjectId>(&project_id, "project")?;
            let (mode, provider): (Mode, Provider) = (mode.into(), provider.into());
            let store = store().await?;
            let removed = credentials::delete_credentials(
                &*store,
                &Tenant::new(project_id.clone(), mode),
                provider,
            )
            .await
            .map_err(cred_failed)?;
            if !removed {
                return Err(Failure::Failed(format!(
                    "project {project_id} has no {} credentials in {} mode",
                    provider.as_str(),
                    mode.as_str()
                )));
            }
            Ok(Output::new(
                json!({"removed": true, "project_id": project_id, "mode": mode, "provider": provider}),
                vec![format!(
                    "Removed the {} credentials of {project_id} ({}).",
                    provider.as_str(),
                    mode.as_str()
                )],
            ))
        }
        CredentialsCmd::GenerateKey { id } => {
            let key = CredentialsKey::generate(&id).map_err(cred_failed)?;
            let value = key.export();
            Ok(Output::new(
                json!({"key_id": key.id(), "value": value, "env": credentials::KEY_ENV}),
                vec![value],
            )
            .note(format!(
                "Keep this master key secret and backed up: without it the stored provider \
                 credentials cannot be read. Set it as {}.",
                credentials::KEY_ENV
            )))
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dhukuti-admin: error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Command::Listen(args) = cli.command {
        return match runtime.block_on(listen_cmd(args, cli.json)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(f) => {
                eprintln!("dhukuti-admin: error: {}", f.message());
                ExitCode::from(f.code())
            }
        };
    }
    match runtime.block_on(run(cli.command)) {
        Ok(out) => {
            if cli.json {
                match serde_json::to_string_pretty(&out.json) {
                    Ok(text) => println!("{text}"),
                    Err(e) => {
                        eprintln!("dhukuti-admin: error: cannot print JSON: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                for line in out.text {
                    println!("{line}");
                }
            }
            // The result first, then what to keep in mind about it.
            let _ = std::io::stdout().flush();
            for note in out.notes {
                eprintln!("{note}");
            }
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("dhukuti-admin: error: {}", f.message());
            ExitCode::from(f.code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_parse() {
        let secs = |t: &str, zero: bool| parse_span(t, zero).map(|s| s.duration.num_seconds());
        assert_eq!(secs("30d", false), Ok(30 * 86_400));
        assert_eq!(secs("24h", false), Ok(86_400));
        assert_eq!(secs("90m", false), Ok(5400));
        assert_eq!(secs("45s", false), Ok(45));
        assert_eq!(secs("2w", false), Ok(14 * 86_400));
        assert_eq!(secs("0", true), Ok(0));
        assert_eq!(secs("0s", true), Ok(0));
        for bad in [
            "",
            "d",
            "30",
            "30x",
            "-1d",
            "1.5h",
            "3651d",
            "99999999999999999999d",
        ] {
            assert!(parse_span(bad, false).is_err(), "{bad}");
        }
        assert!(parse_span("0s", false).is_err());
    }

    #[test]
    fn scopes_parse() {
        assert_eq!(parse_scopes("all").map(|s| s.0.len()), Ok(Scope::ALL.len()));
        let two = parse_scopes("payments:read, payments:write,payments:read");
        assert_eq!(
            two.map(|s| s.0),
            Ok(vec![Scope::PaymentsRead, Scope::PaymentsWrite])
        );
        assert!(parse_scopes("payments:read,,x").is_err());
        let e = parse_scopes("payments:delete").err().unwrap_or_default();
        assert!(
            e.contains("payments:delete") && e.contains("account:read"),
            "{e}"
        );
    }

    fn seller_args(args: &[&str]) -> Result<SellerArgs, clap::Error> {
        let mut argv = vec!["dhukuti-admin", "project", "seller"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Project(ProjectCmd::Seller(a)) => Ok(a),
            other => panic!("{other:?}"),
        }
    }

    fn usage(r: Result<Option<Seller>, Failure>) -> String {
        match r {
            Err(Failure::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    const PROJECT: &str = "proj_01jd0000000000000000000000";

    #[test]
    fn seller_flags_parse_validate_and_merge() {
        let a = seller_args(&[
            "--project",
            PROJECT,
            "--name",
            " Himal Traders ",
            "--legal-name",
            "Himal Traders Pvt. Ltd.",
            "--email",
            "billing@himal.example",
            "--logo-url",
            "https://himal.example/logo.png",
            "--brand-color",
            "#0F766E",
        ])
        .unwrap();
        assert_eq!(a.project_id, PROJECT);
        let full = edited_seller(None, &a).unwrap().unwrap();
        assert_eq!(
            full,
            Seller {
                name: Some("Himal Traders".into()),
                legal_name: Some("Himal Traders Pvt. Ltd.".into()),
                email: Some("billing@himal.example".into()),
                logo_url: Some("https://himal.example/logo.png".into()),
                brand_color: Some("#0f766e".into()),
            }
        );
        // Only the flags given change; "" clears one field.
        let a = seller_args(&[
            "--project",
            PROJECT,
            "--brand-color",
            "#abc",
            "--logo-url",
            "",
        ])
        .unwrap();
        let edited = edited_seller(Some(&full), &a).unwrap().unwrap();
        assert_eq!(edited.brand_color.as_deref(), Some("#abc"));
        assert_eq!(edited.logo_url, None);
        assert_eq!(edited.name, full.name);
        assert_eq!(edited.email, full.email);
        // Nothing left is no profile.
        let only_name = Seller {
            name: Some("A".into()),
            ..Seller::default()
        };
        let a = seller_args(&["--project", PROJECT, "--name", ""]).unwrap();
        assert_eq!(edited_seller(Some(&only_name), &a).unwrap(), None);
        // --clear removes it, and takes no other field.
        let a = seller_args(&["--project", PROJECT, "--clear"]).unwrap();
        assert_eq!(edited_seller(Some(&full), &a).unwrap(), None);
        let e = seller_args(&["--project", PROJECT, "--clear", "--name", "A"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn bad_seller_values_are_usage_errors() {
        let check = |flag: &str, value: &str| {
            let a = seller_args(&["--project", PROJECT, flag, value]).unwrap();
            usage(edited_seller(None, &a))
        };
        for bad in ["not-an-email", "a@b", "a @b.example", "@b.example"] {
            let m = check("--email", bad);
            assert!(
                m.contains("--email") && m.contains("not an email"),
                "{bad}: {m}"
            );
        }
        for bad in [
            "http://himal.example/logo.png",
            "ftp://himal.example/logo.png",
            "himal.example/logo.png",
            "https://",
            "https://user:pw@himal.example/logo.png",
            "https://himal.example/a logo.png",
        ] {
            let m = check("--logo-url", bad);
            assert!(m.contains("--logo-url"), "{bad}: {m}");
        }
        let long = format!("https://himal.example/{}", "a".repeat(MAX_LOGO_URL));
        assert!(check("--logo-url", &long).contains("longer"));
        for bad in ["0f766e", "#0f766", "#0f766e0", "#ggg", "#12", "red", "#"] {
            let m = check("--brand-color", bad);
            assert!(m.contains("#RGB or #RRGGBB"), "{bad}: {m}");
        }
        assert!(check("--name", "A\u{7}B").contains("control characters"));
        let long = "x".repeat(MAX_SELLER_TEXT + 1);
        assert!(check("--legal-name", &long).contains("at most"));
        // Good ones pass.
        for (flag, good) in [
            ("--brand-color", "#0f766e"),
            ("--brand-color", "#FFF"),
            (
                "--logo-url",
                "https://cdn.himal.example:8443/brand/logo.svg?v=2",
            ),
            ("--email", "billing+invoices@himal.example"),
        ] {
            let a = seller_args(&["--project", PROJECT, flag, good]).unwrap();
            assert!(edited_seller(None, &a).is_ok(), "{flag} {good}");
        }
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
