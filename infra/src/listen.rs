//! `dhukuti-admin listen` and `dhukuti-admin trigger`: webhooks on a
//! developer's machine, from a running local gateway, without a public URL.
//!
//! Unlike the other admin commands these talk HTTP to a running gateway
//! with a sandbox key; they never open the store.
//!
//! - [`Api`] registers, lists and deletes endpoints and sends test events
//!   (`/v1/webhooks…`);
//! - [`receiver`] is the HTTP receiver: it verifies each delivery's
//!   signature with the endpoint's signing secret, answers 200 (400 on a
//!   bad signature), can forward a verified delivery to the developer's own
//!   app, and reports one [`Line`] per delivery;
//! - [`listen`] and [`trigger`] are the two commands.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::mode_of_secret;
use shared::domain::outbox::EventType;
use shared::webhooks::signature::{self, SIGNATURE_HEADER};
use tokio::net::TcpListener;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::task::JoinHandle;

/// The gateway `listen` and `trigger` talk to unless `--api` says otherwise.
pub const DEFAULT_API: &str = "http://127.0.0.1:8080";

/// How to start a gateway that accepts local receivers.
const LOCAL_FLAG_HINT: &str = "start the gateway with `cargo run -- --allow-local-webhooks` \
     (or DHUKUTI_WEBHOOKS_ALLOW_LOCAL_HTTP=1 cargo run)";

/// How long a forwarded delivery may take: less than the gateway gives us
/// (10 s), so the gateway hears the app's answer rather than a timeout.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(9);

/// Something the commands print: data on stdout, messages on stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    /// Data (one delivery, or one JSON body): stdout.
    Out(String),
    /// A message for the person at the terminal: stderr.
    Note(String),
}

/// Prints what arrives on `lines` until every sender is gone.
pub fn spawn_printer(mut lines: UnboundedReceiver<Line>) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(line) = lines.recv().await {
            match line {
                // stdout is line-buffered: each line leaves at once.
                Line::Out(text) => println!("{text}"),
                Line::Note(text) => eprintln!("{text}"),
            }
        }
    })
}

// --------------------------------------------------------------------- keys

/// `$DHUKUTI_DATA_DIR`, default `.dhukuti` (where the gateway keeps
/// `demo-keys.json`).
pub fn data_dir_from_env() -> PathBuf {
    std::env::var("DHUKUTI_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(".dhukuti"))
}

/// The key to use: `given`, else the sandbox key in
/// `<data_dir>/demo-keys.json`. Only sandbox secret keys are accepted.
pub fn sandbox_key(given: Option<&str>, data_dir: &Path) -> Result<String, String> {
    let key = match given {
        Some(k) => k.trim().to_owned(),
        None => {
            let path = data_dir.join("demo-keys.json");
            let text = std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "no --key given and cannot read {}: {e}; start the gateway once \
                     (`cargo run`) or pass --key sk_test_…",
                    path.display()
                )
            })?;
            let keys: crate::DemoKeys = serde_json::from_str(&text).map_err(|e| {
                format!(
                    "{} is not the gateway's keys file ({e}); pass --key sk_test_…",
                    path.display()
                )
            })?;
            keys.sandbox
        }
    };
    check_sandbox_key(&key)?;
    Ok(key)
}

/// Refuses anything but a sandbox secret key (`sk_test_…`).
pub fn check_sandbox_key(key: &str) -> Result<(), String> {
    match mode_of_secret(key) {
        Some(Mode::Sandbox) => Ok(()),
        Some(Mode::Live) => Err(
            "refusing a live key (sk_live_…): listen and trigger are for sandbox only; \
             use a sandbox key (sk_test_…)"
                .into(),
        ),
        None => Err("the key is not a Dhukuti secret key (sk_test_…)".into()),
    }
}

/// `a,b` as event types (each known, no repeats).
pub fn parse_event_types(names: &[String]) -> Result<Vec<EventType>, String> {
    let names: Vec<String> = names
        .iter()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    shared::domain::webhooks::parse_events(&names).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------- API

/// A webhook endpoint this tool registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    pub id: String,
    pub url: String,
    /// `whsec_…`, shown only in the registration's answer.
    pub secret: String,
}

/// A test event the gateway accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Triggered {
    pub event_type: &'static str,
    pub event_id: String,
    pub endpoint_id: String,
}

/// The webhooks API of a running gateway, with one key.
#[derive(Clone, Debug)]
pub struct Api {
    client: reqwest::Client,
    base: String,
    key: String,
}

/// An answer that is not a 2xx: its status and the error envelope's parts.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Refusal {
    status: u16,
    code: String,
    param: Option<String>,
    message: String,
}

impl Refusal {
    fn of(status: u16, body: &Value) -> Refusal {
        let error = &body["error"];
        let text = |k: &str| error.get(k).and_then(Value::as_str).map(str::to_owned);
        Refusal {
            status,
            code: text("code").unwrap_or_default(),
            param: text("param"),
            message: text("message").unwrap_or_else(|| format!("the gateway answered {status}")),
        }
    }

    fn describe(&self) -> String {
        match self.status {
            401 => format!(
                "the gateway refused the key ({}); is it this gateway's key? \
                 (see demo-keys.json in its data directory)",
                self.message
            ),
            _ if self.code.is_empty() => format!("{} ({})", self.message, self.status),
            _ => format!("{} ({} {})", self.message, self.status, self.code),
        }
    }
}

/// A 429's wait before the request is sent again.
struct Retry(std::time::Duration);

/// How many times a rate-limited request is sent again.
const RATE_LIMITED_TRIES: usize = 3;

impl Api {
    /// The API at `base` (e.g. `http://127.0.0.1:8080`) with `key`.
    pub fn new(base: &str, key: &str) -> Result<Api, String> {
        let base = base.trim().trim_end_matches('/').to_owned();
        let url = reqwest::Url::parse(&base)
            .map_err(|_| format!("--api {base:?} is not a URL like {DEFAULT_API}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(format!("--api {base:?} is not a URL like {DEFAULT_API}"));
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        Ok(Api {
            client,
            base,
            key: key.to_owned(),
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Result<Value, Refusal>, String> {
        // A 429 is refused before anything is done (the key's rate limit),
        // so the same request is sent again after the wait it names (at
        // most a few times): triggering every event type at once is more
        // than a sandbox key's second allows.
        for _ in 0..RATE_LIMITED_TRIES {
            match self.call_once(method.clone(), path, body.clone()).await? {
                Err(Retry(after)) => tokio::time::sleep(after).await,
                Ok(answer) => return Ok(answer),
            }
        }
        match self.call_once(method, path, body).await? {
            Ok(answer) => Ok(answer),
            Err(Retry(_)) => Err(format!("{} kept answering 429 (rate limited)", self.base)),
        }
    }

    async fn call_once(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Result<Result<Value, Refusal>, Retry>, String> {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| {
            if e.is_connect() {
                format!(
                    "cannot reach the gateway at {}: is it running? ({LOCAL_FLAG_HINT})",
                    self.base
                )
            } else {
                format!("request to {} failed: {e}", self.base)
            }
        })?;
        let status = response.status().as_u16();
        if status == 429 {
            let secs = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(1)
                .clamp(1, 5);
            return Ok(Err(Retry(std::time::Duration::from_secs(secs))));
        }
        let text = response
            .text()
            .await
            .map_err(|e| format!("reading the answer of {} failed: {e}", self.base))?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            Ok(Ok(Ok(value)))
        } else {
            Ok(Ok(Err(Refusal::of(status, &value))))
        }
    }

    /// `POST /v1/webhooks`: registers `url` for `events` (empty: every
    /// type). A refused local URL gets the hint about the gateway's flag.
    pub async fn register(&self, url: &str, events: &[EventType]) -> Result<Registered, String> {
        let mut body = json!({ "url": url });
        if !events.is_empty() {
            body["events"] = json!(events.iter().map(|t| t.as_str()).collect::<Vec<_>>());
        }
        let answer = self
            .call(reqwest::Method::POST, "/v1/webhooks", Some(body))
            .await?;
        let created = answer.map_err(|r| registration_error(&r, url))?;
        let text = |k: &str| created.get(k).and_then(Value::as_str).map(str::to_owned);
        match (text("id"), text("signing_secret")) {
            (Some(id), Some(secret)) => Ok(Registered {
                id,
                url: text("url").unwrap_or_else(|| url.to_owned()),
                secret,
            }),
            _ => Err(format!(
                "the gateway at {} answered the registration without an id and signing \
                 secret: {created}",
                self.base
            )),
        }
    }

    /// `DELETE /v1/webhooks/{id}`.
    pub async fn delete(&self, id: &str) -> Result<(), String> {
        self.call(reqwest::Method::DELETE, &format!("/v1/webhooks/{id}"), None)
            .await?
            .map(|_| ())
            .map_err(|r| format!("cannot delete endpoint {id}: {}", r.describe()))
    }

    /// `GET /v1/webhooks`: the endpoints as the API answers them.
    pub async fn endpoints(&self) -> Result<Vec<Value>, String> {
        let list = self
            .call(reqwest::Method::GET, "/v1/webhooks", None)
            .await?
            .map_err(|r| format!("cannot list webhook endpoints: {}", r.describe()))?;
        Ok(list["data"].as_array().cloned().unwrap_or_default())
    }

    /// `POST /v1/webhooks/{id}/test` for type `t`.
    pub async fn send_test(&self, endpoint_id: &str, t: EventType) -> Result<Triggered, String> {
        let event = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/webhooks/{endpoint_id}/test"),
                Some(json!({ "type": t.as_str() })),
            )
            .await?
            .map_err(|r| {
                format!(
                    "the gateway refused a {} test event for {endpoint_id}: {}",
                    t.as_str(),
                    r.describe()
                )
            })?;
        Ok(Triggered {
            event_type: t.as_str(),
            event_id: event["id"].as_str().unwrap_or("?").to_owned(),
            endpoint_id: endpoint_id.to_owned(),
        })
    }
}

/// What to say when the gateway refuses to register `url`.
fn registration_error(r: &Refusal, url: &str) -> String {
    if r.status == 400 && r.param.as_deref() == Some("url") {
        format!(
            "the gateway refused {url} as a webhook URL: {}.\n\
             Local http receivers need a sandbox key and a gateway that allows them: \
             {LOCAL_FLAG_HINT}.",
            r.message
        )
    } else {
        format!("cannot register {url}: {}", r.describe())
    }
}

/// The newest enabled endpoint in a `GET /v1/webhooks` answer's `data`.
pub fn newest_enabled(endpoints: &[Value]) -> Option<String> {
    endpoints
        .iter()
        .filter(|e| e["enabled"].as_bool() == Some(true))
        .filter_map(|e| {
            let id = e["id"].as_str()?;
            let created = e["createdAt"].as_str().unwrap_or_default();
            Some((created, id))
        })
        .max()
        .map(|(_, id)| id.to_owned())
}

/// Which types `trigger <what>` sends: one type, or `all`.
pub fn trigger_types(what: &str) -> Result<Vec<EventType>, String> {
    if what.trim() == "all" {
        return Ok(EventType::ALL.to_vec());
    }
    EventType::parse(what.trim())
        .map(|t| vec![t])
        .ok_or_else(|| {
            format!(
                "{what:?} is not an event type; use `all` or one of {}",
                EventType::ALL.map(|t| t.as_str()).join(", ")
            )
        })
}

/// `trigger`: a test event of each type in `what` to `endpoint` (else the
/// newest enabled endpoint), through the API.
pub async fn trigger(
    api: &Api,
    what: &str,
    endpoint: Option<&str>,
) -> Result<Vec<Triggered>, String> {
    let types = trigger_types(what)?;
    let endpoint = match endpoint {
        Some(id) => id.trim().to_owned(),
        None => newest_enabled(&api.endpoints().await?).ok_or_else(|| {
            format!(
                "no enabled webhook endpoint at {} for this key; start \
                 `dhukuti-admin listen` first, or pass --endpoint we_…",
                api.base()
            )
        })?,
    };
    let mut sent = Vec::new();
    for t in types {
        sent.push(api.send_test(&endpoint, t).await?);
    }
    Ok(sent)
}

// ----------------------------------------------------------------- receiver

/// What the receiver checks deliveries with, and where it forwards them.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    /// Signing secrets (any may match).
    pub secrets: Vec<String>,
    /// POST each verified delivery here too, and answer with its status.
    pub forward_to: Option<String>,
    /// Print each verified event's body as one JSON line instead of a
    /// summary line.
    pub json: bool,
}

/// Whether a delivery's signature verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Bad(String),
}

/// What a forwarded delivery got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forwarded {
    Answered(u16),
    Failed(String),
}

/// The parts of an event body a line shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub event_type: String,
    pub event_id: String,
    pub object_id: String,
}

/// The type, id and object id of an event body (`-` for what is missing).
pub fn summarize(body: &[u8]) -> Summary {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let text = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    Summary {
        event_type: text(&v["type"]),
        event_id: text(&v["id"]),
        object_id: text(&v["data"]["object"]["id"]),
    }
}

/// One delivery as a line: time, event type, event id, object id, the
/// verdict, and what forwarding got.
pub fn event_line(
    at: DateTime<Utc>,
    body: &[u8],
    verdict: &Verdict,
    forwarded: Option<&Forwarded>,
) -> String {
    let s = summarize(body);
    let mut line = format!(
        "{}  {:<18}  {}  {}  {}",
        at.to_rfc3339_opts(SecondsFormat::Secs, true),
        s.event_type,
        s.event_id,
        s.object_id,
        match verdict {
            Verdict::Ok => "signature ok".to_owned(),
            Verdict::Bad(why) => format!("BAD SIGNATURE ({why})"),
        }
    );
    match forwarded {
        Some(Forwarded::Answered(status)) => line.push_str(&format!("  -> forwarded: {status}")),
        Some(Forwarded::Failed(why)) => line.push_str(&format!("  -> forward failed: {why}")),
        None => {}
    }
    line
}

/// Checks a delivery's signature header against `secrets` at `now`.
pub fn verify(headers: &HeaderMap, body: &[u8], secrets: &[String], now: i64) -> Verdict {
    let Some(value) = headers.get(SIGNATURE_HEADER) else {
        return Verdict::Bad(format!("no {SIGNATURE_HEADER} header"));
    };
    let Ok(header) = value.to_str() else {
        return Verdict::Bad(format!("{SIGNATURE_HEADER} is not text"));
    };
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    match signature::verify(header, body, &secrets, now) {
        Ok(()) => Verdict::Ok,
        Err(e) => Verdict::Bad(e.to_string()),
    }
}

struct Receiver {
    config: ReceiverConfig,
    client: reqwest::Client,
    out: UnboundedSender<Line>,
}

/// The receiver's routes: every path takes a POSTed delivery.
pub fn receiver(config: ReceiverConfig, out: UnboundedSender<Line>) -> Result<Router, String> {
    if let Some(url) = &config.forward_to {
        check_forward_url(url)?;
    }
    let client = reqwest::Client::builder()
        .timeout(FORWARD_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
    let state = Arc::new(Receiver {
        config,
        client,
        out,
    });
    Ok(Router::new().fallback(receive).with_state(state))
}

/// `--forward-to` must be an absolute http(s) URL.
pub fn check_forward_url(url: &str) -> Result<(), String> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(()),
        _ => Err(format!(
            "--forward-to {url:?} is not an http(s) URL like http://127.0.0.1:3000/webhooks"
        )),
    }
}

/// Headers not passed on when forwarding (hop-by-hop, or recomputed).
fn forwarded_header(name: &header::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "host" | "content-length" | "connection" | "transfer-encoding" | "keep-alive" | "upgrade"
    )
}

async fn receive(
    State(r): State<Arc<Receiver>>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if method != Method::POST {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, "POST")],
            "dhukuti-admin listen: webhooks are POSTed here\n",
        )
            .into_response();
    }
    let at = Utc::now();
    let verdict = verify(&headers, &body, &r.config.secrets, at.timestamp());
    if let Verdict::Bad(why) = &verdict {
        let line = event_line(at, &body, &verdict, None);
        let _ = r.out.send(if r.config.json {
            Line::Note(line)
        } else {
            Line::Out(line)
        });
        return (StatusCode::BAD_REQUEST, format!("bad signature: {why}\n")).into_response();
    }
    let forwarded = match &r.config.forward_to {
        Some(url) => Some(forward(&r.client, url, &headers, body.clone()).await),
        None => None,
    };
    if r.config.json {
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) => {
                let _ = r.out.send(Line::Out(v.to_string()));
            }
            Err(_) => {
                let _ = r.out.send(Line::Note(event_line(
                    at,
                    &body,
                    &verdict,
                    forwarded.as_ref(),
                )));
            }
        }
        if let Some(Forwarded::Failed(why)) = &forwarded {
            let _ = r.out.send(Line::Note(format!("forward failed: {why}")));
        }
    } else {
        let _ = r.out.send(Line::Out(event_line(
            at,
            &body,
            &verdict,
            forwarded.as_ref(),
        )));
    }
    match forwarded {
        None => (StatusCode::OK, "ok\n").into_response(),
        Some(Forwarded::Answered(status)) => StatusCode::from_u16(status)
            .unwrap_or(StatusCode::BAD_GATEWAY)
            .into_response(),
        Some(Forwarded::Failed(why)) => {
            (StatusCode::BAD_GATEWAY, format!("forward failed: {why}\n")).into_response()
        }
    }
}

async fn forward(
    client: &reqwest::Client,
    url: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Forwarded {
    let mut passed = HeaderMap::new();
    for (name, value) in headers.iter().filter(|(n, _)| forwarded_header(n)) {
        passed.append(name.clone(), value.clone());
    }
    match client.post(url).headers(passed).body(body).send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            // Drain the answer so the connection can be reused.
            let _ = response.bytes().await;
            Forwarded::Answered(status)
        }
        Err(e) if e.is_timeout() => {
            Forwarded::Failed(format!("no answer within {} s", FORWARD_TIMEOUT.as_secs()))
        }
        Err(e) if e.is_connect() => Forwarded::Failed(format!("cannot connect to {url}")),
        Err(e) => Forwarded::Failed(e.to_string()),
    }
}

// ------------------------------------------------------------------- listen

/// What `listen` was asked.
#[derive(Clone, Debug)]
pub struct ListenOptions {
    pub api: String,
    /// A sandbox key ([`sandbox_key`]).
    pub key: String,
    /// Empty: every type.
    pub events: Vec<EventType>,
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    pub forward_to: Option<String>,
    pub json: bool,
}

/// `listen`: starts the receiver on 127.0.0.1, registers it as an endpoint,
/// reports each delivery on `out` until `stop` completes, then deletes the
/// endpoint. Answers the endpoint it registered (deleted by then).
pub async fn listen(
    opts: ListenOptions,
    out: UnboundedSender<Line>,
    stop: impl Future<Output = ()>,
) -> Result<Registered, String> {
    check_sandbox_key(&opts.key)?;
    if let Some(url) = &opts.forward_to {
        check_forward_url(url)?;
    }
    let api = Api::new(&opts.api, &opts.key)?;
    // Bound before registering, so the URL names a port that is ours;
    // connections wait in the backlog until the secret is known.
    let listener = TcpListener::bind(("127.0.0.1", opts.port))
        .await
        .map_err(|e| format!("cannot listen on 127.0.0.1:{}: {e}", opts.port))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let url = format!("http://127.0.0.1:{port}/");
    let registered = api.register(&url, &opts.events).await?;
    let router = match receiver(
        ReceiverConfig {
            secrets: vec![registered.secret.clone()],
            forward_to: opts.forward_to.clone(),
            json: opts.json,
        },
        out.clone(),
    ) {
        Ok(r) => r,
        Err(e) => {
            let _ = api.delete(&registered.id).await;
            return Err(e);
        }
    };
    let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = shutdown_rx.await;
            })
            .await
    });
    for line in ready_lines(&registered, &opts) {
        let _ = out.send(Line::Note(line));
    }
    let failed = tokio::select! {
        _ = stop => None,
        ended = &mut server => Some(match ended {
            Ok(Ok(())) => "the receiver stopped".to_owned(),
            Ok(Err(e)) => format!("the receiver failed: {e}"),
            Err(e) => format!("the receiver failed: {e}"),
        }),
    };
    let _ = shutdown.send(());
    if failed.is_none() {
        // In-flight deliveries (a forward takes at most FORWARD_TIMEOUT).
        let _ = tokio::time::timeout(FORWARD_TIMEOUT + Duration::from_secs(1), &mut server).await;
    }
    match api.delete(&registered.id).await {
        Ok(()) => {
            let _ = out.send(Line::Note(format!(
                "Deleted webhook endpoint {}.",
                registered.id
            )));
        }
        Err(e) => {
            let _ = out.send(Line::Note(format!(
                "Could not delete webhook endpoint {} ({e}); delete it with\n  \
                 curl -X DELETE {}/v1/webhooks/{} -H 'Authorization: Bearer sk_test_…'",
                registered.id,
                api.base(),
                registered.id
            )));
        }
    }
    match failed {
        Some(why) => Err(why),
        None => Ok(registered),
    }
}

/// What `listen` says once it is ready.
fn ready_lines(registered: &Registered, opts: &ListenOptions) -> Vec<String> {
    let events = if opts.events.is_empty() {
        "every event type".to_owned()
    } else {
        opts.events
            .iter()
            .map(|t| t.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut lines = vec![format!(
        "Ready: webhook endpoint {} at {} receives {events} from {}.",
        registered.id,
        registered.url,
        opts.api.trim_end_matches('/')
    )];
    lines.push(format!(
        "Signing secret {} (verify with it; deleted with the endpoint).",
        registered.secret
    ));
    if let Some(url) = &opts.forward_to {
        lines.push(format!(
            "Forwarding verified deliveries to {url}; the gateway gets its status."
        ));
    }
    let api = opts.api.trim_end_matches('/');
    let api_flag = if api == DEFAULT_API {
        String::new()
    } else {
        format!(" --api {api}")
    };
    lines.push(format!(
        "Send one: cargo run -p dhukuti --bin dhukuti-admin -- trigger payment.succeeded{api_flag}   \
         (Ctrl-C stops and deletes the endpoint)"
    ));
    lines
}

/// Ctrl-C, or SIGTERM on unix (the gateway's own shutdown signal).
pub async fn interrupted() {
    crate::shutdown_signal().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::webhooks::signature::{TIMESTAMP_HEADER, sign};
    use tokio::sync::mpsc;

    const SECRET: &str = "whsec_0123456789abcdef0123456789abcdef0123456789abcdef0123456789ab";

    fn body() -> Vec<u8> {
        serde_json::to_vec(&json!({
            "id": "evt_01jdtest",
            "type": "payment.succeeded",
            "created": 1_795_400_000,
            "livemode": false,
            "data": {"object": {"id": "pay_01jdtest", "status": "success"}},
        }))
        .unwrap()
    }

    async fn serve(router: Router) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        format!("http://{addr}/")
    }

    async fn started(
        forward_to: Option<String>,
        json: bool,
    ) -> (String, mpsc::UnboundedReceiver<Line>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let router = receiver(
            ReceiverConfig {
                secrets: vec![SECRET.into()],
                forward_to,
                json,
            },
            tx,
        )
        .unwrap();
        (serve(router).await, rx)
    }

    async fn post(url: &str, signature: Option<&str>, body: Vec<u8>) -> u16 {
        let mut req = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .body(body);
        if let Some(s) = signature {
            // The timestamp header repeats the signature's `t`, as the
            // gateway sends it (not the clock now: a second may have
            // turned since the test signed).
            let t = s
                .split(',')
                .find_map(|part| part.trim().strip_prefix("t="))
                .unwrap_or_default()
                .to_owned();
            req = req.header(SIGNATURE_HEADER, s).header(TIMESTAMP_HEADER, t);
        }
        req.send().await.unwrap().status().as_u16()
    }

    #[tokio::test]
    async fn a_signed_delivery_is_accepted_and_a_forged_one_refused() {
        let (url, mut lines) = started(None, false).await;
        let now = Utc::now().timestamp();

        let good = sign(SECRET, now, &body());
        assert_eq!(post(&url, Some(&good), body()).await, 200);
        let Some(Line::Out(line)) = lines.recv().await else {
            panic!("no line")
        };
        assert!(line.contains("  payment.succeeded "), "{line}");
        assert!(
            line.contains("  evt_01jdtest  pay_01jdtest  signature ok"),
            "{line}"
        );

        // Signed with another secret; then the right one over another body.
        let forged = sign("whsec_other", now, &body());
        assert_eq!(post(&url, Some(&forged), body()).await, 400);
        let tampered = sign(SECRET, now, b"{}");
        assert_eq!(post(&url, Some(&tampered), body()).await, 400);
        // Too old, and no header at all.
        let stale = sign(SECRET, now - 301, &body());
        assert_eq!(post(&url, Some(&stale), body()).await, 400);
        assert_eq!(post(&url, None, body()).await, 400);
        for why in [
            "no signature matches",
            "no signature matches",
            "s away from now",
            "no X-Service-Signature header",
        ] {
            let Some(Line::Out(line)) = lines.recv().await else {
                panic!("no line")
            };
            assert!(
                line.contains("evt_01jdtest  pay_01jdtest  BAD SIGNATURE"),
                "{line}"
            );
            assert!(line.contains(why), "{line} / {why}");
        }

        let get = reqwest::get(&url).await.unwrap();
        assert_eq!(get.status().as_u16(), 405);
    }

    #[tokio::test]
    async fn json_mode_prints_each_verified_body_as_one_line() {
        let (url, mut lines) = started(None, true).await;
        let now = Utc::now().timestamp();
        assert_eq!(
            post(&url, Some(&sign(SECRET, now, &body())), body()).await,
            200
        );
        let Some(Line::Out(line)) = lines.recv().await else {
            panic!("no line")
        };
        assert!(!line.contains('\n'));
        let parsed: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed, serde_json::from_slice::<Value>(&body()).unwrap());
        // A forged one is a message, never data.
        assert_eq!(
            post(&url, Some(&sign("x", now, &body())), body()).await,
            400
        );
        assert!(matches!(lines.recv().await, Some(Line::Note(l)) if l.contains("BAD SIGNATURE")));
    }

    #[tokio::test]
    async fn verified_deliveries_are_forwarded_with_their_headers_and_status() {
        type Seen = Arc<std::sync::Mutex<Vec<(HeaderMap, Bytes)>>>;
        let seen: Seen = Arc::default();
        let app = {
            let seen = seen.clone();
            Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push((headers, body));
                    StatusCode::ACCEPTED
                }
            })
        };
        let app_url = format!("{}hooks", serve(app).await);
        let (url, mut lines) = started(Some(app_url), false).await;
        let now = Utc::now().timestamp();
        let good = sign(SECRET, now, &body());
        assert_eq!(post(&url, Some(&good), body()).await, 202);
        let Some(Line::Out(line)) = lines.recv().await else {
            panic!("no line")
        };
        assert!(line.ends_with("signature ok  -> forwarded: 202"), "{line}");
        {
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 1);
            let (headers, got) = &seen[0];
            assert_eq!(got.as_ref(), body().as_slice());
            assert_eq!(headers[SIGNATURE_HEADER], good.as_str());
            assert_eq!(headers[TIMESTAMP_HEADER], now.to_string().as_str());
            assert_eq!(headers["content-type"], "application/json");
        }
        // A forged delivery is not passed on.
        assert_eq!(
            post(&url, Some(&sign("x", now, &body())), body()).await,
            400
        );
        assert_eq!(seen.lock().unwrap().len(), 1);

        // An app that is not running: 502, and the line says why.
        let (url, mut lines) = started(Some("http://127.0.0.1:9/".into()), false).await;
        assert_eq!(post(&url, Some(&good), body()).await, 502);
        let Some(Line::Out(line)) = lines.recv().await else {
            panic!("no line")
        };
        assert!(line.contains("forward failed"), "{line}");
    }

    #[test]
    fn lines_show_what_is_missing_as_a_dash() {
        let at = DateTime::parse_from_rfc3339("2026-11-22T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            event_line(at, b"not json", &Verdict::Bad("no t".into()), None),
            "2026-11-22T10:00:00Z  -                   -  -  BAD SIGNATURE (no t)"
        );
        assert_eq!(
            event_line(
                at,
                &body(),
                &Verdict::Ok,
                Some(&Forwarded::Failed("cannot connect".into()))
            ),
            "2026-11-22T10:00:00Z  payment.succeeded   evt_01jdtest  pay_01jdtest  signature ok  \
             -> forward failed: cannot connect"
        );
    }

    #[test]
    fn keys_come_from_the_keys_file_and_live_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = sandbox_key(None, dir.path()).unwrap_err();
        assert!(missing.contains("demo-keys.json"), "{missing}");
        let sandbox = format!("sk_test_{}", "a".repeat(32));
        let live = format!("sk_live_{}", "b".repeat(32));
        std::fs::write(
            dir.path().join("demo-keys.json"),
            json!({"sandbox": sandbox, "live": live}).to_string(),
        )
        .unwrap();
        assert_eq!(sandbox_key(None, dir.path()), Ok(sandbox.clone()));
        let other = format!("sk_test_{}", "c".repeat(32));
        assert_eq!(sandbox_key(Some(&other), dir.path()), Ok(other));
        let refused = sandbox_key(Some(&live), dir.path()).unwrap_err();
        assert!(refused.contains("live key"), "{refused}");
        assert!(sandbox_key(Some("pk_nonsense"), dir.path()).is_err());
    }

    #[test]
    fn event_types_and_trigger_targets_parse() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_event_types(&names(&[
                "payment.failed",
                " payment.failed",
                "refund.succeeded"
            ])),
            Ok(vec![EventType::PaymentFailed, EventType::RefundSucceeded])
        );
        assert!(parse_event_types(&names(&["payment.success"])).is_err());
        assert_eq!(
            trigger_types("all").map(|t| t.len()),
            Ok(EventType::ALL.len())
        );
        assert_eq!(
            trigger_types("invoice.paid"),
            Ok(vec![EventType::InvoicePaid])
        );
        assert!(
            trigger_types("invoice")
                .unwrap_err()
                .contains("payment.succeeded")
        );
        let list = vec![
            json!({"id": "we_1", "enabled": true, "createdAt": "2026-11-22T10:00:00.000Z"}),
            json!({"id": "we_3", "enabled": false, "createdAt": "2026-11-22T12:00:00.000Z"}),
            json!({"id": "we_2", "enabled": true, "createdAt": "2026-11-22T11:00:00.000Z"}),
        ];
        assert_eq!(newest_enabled(&list).as_deref(), Some("we_2"));
        assert_eq!(newest_enabled(&list[1..2]), None);
    }

    #[test]
    fn a_refused_local_url_explains_the_flag() {
        let r = Refusal::of(
            400,
            &json!({"error": {"message": "webhook URLs must use https", "code": "validation_failed", "param": "url"}}),
        );
        let text = registration_error(&r, "http://127.0.0.1:4000/");
        assert!(text.contains("--allow-local-webhooks"), "{text}");
        assert!(text.contains("must use https"), "{text}");
        let other = Refusal::of(401, &json!({"error": {"message": "bad key"}}));
        assert!(!registration_error(&other, "u").contains("--allow-local-webhooks"));
    }

    /// The whole loop on a real gateway: register, trigger each type,
    /// receive and verify, delete on stop.
    #[tokio::test]
    async fn listen_and_trigger_against_a_running_gateway() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn shared::store::Store> =
            Arc::new(shared::store::embedded::EmbeddedStore::in_memory().unwrap());
        let settings = crate::Settings {
            addr: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().to_path_buf(),
            backend: shared::app::Backend::embedded(dir.path()),
            init: false,
            demo_payments: false,
            public_url: None,
            dashboard_url: None,
            sweep_every: None,
            provider_timeout: None,
            webhooks: shared::domain::webhooks::WebhookSettings {
                allow_local_http: true,
                ..Default::default()
            },
            webhook_poll: Some(Duration::from_millis(20)),
        };
        let running = crate::start_with_store(settings, store).await.unwrap();
        let key = sandbox_key(None, dir.path()).unwrap();
        let api = Api::new(&running.base_url, &key).unwrap();

        let (tx, mut lines) = mpsc::unbounded_channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let opts = ListenOptions {
            api: running.base_url.clone(),
            key: key.clone(),
            events: vec![],
            port: 0,
            forward_to: None,
            json: false,
        };
        let listening = tokio::spawn(listen(opts, tx, async {
            let _ = stopped.await;
        }));
        let ready = tokio::time::timeout(Duration::from_secs(10), lines.recv())
            .await
            .unwrap();
        let Some(Line::Note(ready)) = ready else {
            panic!("no ready line: {ready:?}")
        };
        assert!(ready.starts_with("Ready: webhook endpoint we_"), "{ready}");

        let sent = trigger(&api, "all", None).await.unwrap();
        assert_eq!(sent.len(), EventType::ALL.len());
        let mut got = Vec::new();
        while got.len() < sent.len() {
            let line = tokio::time::timeout(Duration::from_secs(10), lines.recv())
                .await
                .unwrap();
            if let Some(Line::Out(l)) = line {
                assert!(l.ends_with("signature ok"), "{l}");
                got.push(l);
            }
        }
        for s in &sent {
            assert!(
                got.iter()
                    .any(|l| l.contains(&format!("  {}  ", s.event_id)) && l.contains(s.event_type)),
                "{s:?} in {got:?}"
            );
        }

        let _ = stop.send(());
        let registered = listening.await.unwrap().unwrap();
        assert_eq!(sent[0].endpoint_id, registered.id);
        assert!(api.endpoints().await.unwrap().is_empty());
        // Nothing to trigger once it is gone.
        assert!(
            trigger(&api, "payment.failed", None)
                .await
                .unwrap_err()
                .contains("no enabled webhook endpoint")
        );
        // A live key is refused before anything is sent.
        let live = ListenOptions {
            api: running.base_url.clone(),
            key: running.keys.live.clone(),
            events: vec![],
            port: 0,
            forward_to: None,
            json: false,
        };
        let (tx, _rx) = mpsc::unbounded_channel();
        assert!(
            listen(live, tx, async {})
                .await
                .unwrap_err()
                .contains("live key")
        );
        running.stop().await.unwrap();
    }

    #[tokio::test]
    async fn a_gateway_without_the_flag_gets_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn shared::store::Store> =
            Arc::new(shared::store::embedded::EmbeddedStore::in_memory().unwrap());
        let settings = crate::Settings {
            addr: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().to_path_buf(),
            backend: shared::app::Backend::embedded(dir.path()),
            init: false,
            demo_payments: false,
            public_url: None,
            dashboard_url: None,
            sweep_every: None,
            provider_timeout: None,
            webhooks: Default::default(),
            webhook_poll: None,
        };
        let running = crate::start_with_store(settings, store).await.unwrap();
        let opts = ListenOptions {
            api: running.base_url.clone(),
            key: sandbox_key(None, dir.path()).unwrap(),
            events: vec![EventType::PaymentSucceeded],
            port: 0,
            forward_to: None,
            json: false,
        };
        let (tx, _rx) = mpsc::unbounded_channel();
        let err = listen(opts, tx, async {}).await.unwrap_err();
        assert!(err.contains("--allow-local-webhooks"), "{err}");
        running.stop().await.unwrap();

        // And no gateway at all.
        let opts = ListenOptions {
            api: "http://127.0.0.1:9".into(),
            key: format!("sk_test_{}", "a".repeat(32)),
            events: vec![],
            port: 0,
            forward_to: None,
            json: false,
        };
        let (tx, _rx) = mpsc::unbounded_channel();
        let err = listen(opts, tx, async {}).await.unwrap_err();
        assert!(err.contains("cannot reach the gateway"), "{err}");
    }
}
