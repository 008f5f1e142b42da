//! The Lambda edge: real API Gateway HTTP API (payload v2) events through
//! each function's Lambda handler (`lambda_http`'s adapter over the
//! function's router), exactly as `lambda_http::run` drives it in AWS.

use std::sync::Arc;

use dhukuti_tests::{Which, fresh_backend, on_both_backends};
use lambda_http::lambda_runtime::{Context, LambdaEvent};
use lambda_http::request::LambdaRequest;
use lambda_http::{Adapter, Service};
use serde_json::Value;
use shared::AppState;
use shared::Config;
use shared::domain::account::{KeyKind, NewKey, Plan, Scope};
use shared::domain::payments::{Payment, PaymentStatus};
use shared::domain::{Mode, Provider};
use shared::money::{Currency, Paisa};
use shared::time::{Clock, SystemClock};

struct Fixture {
    _tmp: tempfile::TempDir,
    state: AppState,
    key: String,
    project_id: String,
    payment_id: String,
    session_id: Option<String>,
    invoice_id: Option<String>,
}

async fn fixture(which: Which) -> Option<Fixture> {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backend = fresh_backend(which, tmp.path())?;
    let (store, queue, blobs) = backend.open(true).await.unwrap_or_else(|e| panic!("{e}"));
    let now = SystemClock.now();
    let Ok(m) = shared::domain::account::create_merchant(
        &*store,
        now,
        "Lambda Shop",
        "owner@lambda.example",
        Plan::Pro,
    )
    .await
    else {
        panic!()
    };
    let Ok(p) = shared::domain::account::create_project(&*store, now, &m, "Shop", false).await
    else {
        panic!()
    };
    let new = NewKey {
        mode: Mode::Live,
        kind: KeyKind::Secret,
        scopes: Scope::ALL.to_vec(),
        description: "lambda".into(),
        expires_at: None,
        spend_cap_paisa: Some(1_000_000),
    };
    let deps = AppState::new(
        store.clone(),
        Arc::new(SystemClock),
        Config {
            public_base_url: "https://pay.dhukuti.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    );
    let Ok((key, _)) = shared::domain::account::issue_api_key(&deps, now, &p, new).await else {
        panic!()
    };
    let mut ids = Vec::new();
    for amount in [700, 900] {
        let payment = Payment {
            id: shared::ids::PaymentId::new(),
            project_id: p.id.clone(),
            checkout_session_id: shared::ids::SessionId::new(),
            mode: Mode::Live,
            amount: Paisa::new(amount).unwrap_or_default(),
            amount_refunded: Paisa::ZERO,
            currency: Currency::Npr,
            amount_reserved: Default::default(),
            gsi2pk: None,
            gsi2sk: None,
            provider: Provider::Esewa,
            status: PaymentStatus::Success,
            provider_ref: Some("000AE01".into()),
            failure_reason: None,
            metadata: Default::default(),
            customer_name: None,
            customer_email: None,
            customer_phone: None,
            created_at: now,
            updated_at: now,
            double_payment_of: None,
            scanned_at: None,
            attempt: Default::default(),
            checks: Default::default(),
        };
        assert!(
            shared::domain::payments::insert(&*store, &payment)
                .await
                .is_ok()
        );
        ids.push(payment.id);
    }
    let config = Config {
        public_base_url: "https://pay.dhukuti.example".into(),
        events_base_url: None,
        dashboard_base_url: None,
    };
    Some(Fixture {
        _tmp: tmp,
        state: AppState::new(store, Arc::new(SystemClock), config)
            .with_queue(queue)
            .with_blobs(blobs),
        key,
        project_id: p.id.to_string(),
        payment_id: ids.remove(0).into(),
        session_id: None,
        invoice_id: None,
    })
}

/// Feeds the event file through the function's Lambda handler and returns
/// the API Gateway response as JSON (`statusCode`, `headers`, `body`).
async fn invoke(router: axum::Router, event_file: &str, f: &Fixture) -> Value {
    let path = format!("{}/events/{event_file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let text = text
        .replace("__KEY__", &f.key)
        .replace("__PAYMENT_ID__", &f.payment_id)
        .replace(
            "__SESSION_ID__",
            f.session_id.as_deref().unwrap_or("cs_none"),
        )
        .replace(
            "__INVOICE_ID__",
            f.invoice_id.as_deref().unwrap_or("oinv_none"),
        );
    let request: LambdaRequest =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut handler = Adapter::from(router);
    let response = match handler
        .call(LambdaEvent::new(request, Context::default()))
        .await
    {
        Ok(r) => r,
        Err(e) => panic!("handler failed: {e:?}"),
    };
    serde_json::to_value(&response).unwrap_or(Value::Null)
}

fn body_of(res: &Value) -> Value {
    let body = res["body"].as_str().unwrap_or("null");
    assert_eq!(res["isBase64Encoded"], false);
    serde_json::from_str(body).unwrap_or(Value::Null)
}

/// The invoice PDF leaves the function base64-encoded (binary through API
/// Gateway), and decodes to a PDF.
async fn invoices_function_answers_the_pdf_as_binary(which: Which) {
    use base64::Engine;
    use shared::domain::invoices;
    let Some(mut f) = fixture(which).await else {
        return;
    };
    let body: invoices::CreateInvoice = match serde_json::from_value(serde_json::json!({
        "lines": [{"description": "Tea", "quantity": "2", "unitAmount": 50_000}],
        "dueAt": "2026-12-31T18:15:00+05:45",
    })) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    let draft = match invoices::new_draft(
        &shared::domain::Tenant::new(f.project_id.as_str(), Mode::Live),
        body,
        SystemClock.now(),
    ) {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    let item = shared::domain::record::Record::to_item(&draft).unwrap_or_else(|e| panic!("{e}"));
    f.state
        .store
        .put(item, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let issued = invoices::finalize(
        &f.state,
        &shared::domain::Tenant::new(f.project_id.as_str(), Mode::Live),
        &draft.id,
        1,
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(issued.invoice_number.as_deref(), Some("PI-000001"));
    f.invoice_id = Some(draft.id.to_string());
    let res = invoke(::invoices::router(f.state.clone()), "invoice-pdf.json", &f).await;
    assert_eq!(res["statusCode"], 200, "{res}");
    assert_eq!(res["headers"]["content-type"], "application/pdf");
    assert_eq!(res["isBase64Encoded"], true);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(res["body"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(bytes.starts_with(b"%PDF-"), "not a PDF");
}

async fn account_function_answers_an_http_api_event(which: Which) {
    let Some(f) = fixture(which).await else {
        return;
    };
    let res = invoke(::account::router(f.state.clone()), "account-get.json", &f).await;
    assert_eq!(res["statusCode"], 200, "{res}");
    assert_eq!(res["headers"]["x-request-id"], "Bx1aAjZ5BcwEMVA=");
    assert_eq!(res["headers"]["content-type"], "application/json");
    let body = body_of(&res);
    assert_eq!(body["merchant"]["name"], "Lambda Shop");
    assert_eq!(body["project"]["mode"], "live");
    assert_eq!(body["api_key"]["spend_cap_paisa"], 1_000_000);
    assert_eq!(body["plan"], "pro");
}

async fn payments_function_lists_with_the_query_string(which: Which) {
    let Some(f) = fixture(which).await else {
        return;
    };
    let res = invoke(
        ::payments::router(f.state.clone()),
        "payments-list.json",
        &f,
    )
    .await;
    assert_eq!(res["statusCode"], 200, "{res}");
    assert_eq!(res["headers"]["x-request-id"], "Bx1aBhS8hcwEJ2Q=");
    let body = body_of(&res);
    assert_eq!(
        body["meta"],
        serde_json::json!({"total": 2, "limit": 1, "offset": 0})
    );
    assert_eq!(body["data"][0]["amount"], 900, "newest first");
}

async fn payments_function_retrieves_one(which: Which) {
    let Some(f) = fixture(which).await else {
        return;
    };
    let res = invoke(::payments::router(f.state.clone()), "payment-get.json", &f).await;
    assert_eq!(res["statusCode"], 200, "{res}");
    let body = body_of(&res);
    assert_eq!(body["id"], f.payment_id.as_str());
    assert_eq!(body["livemode"], true);
}

async fn lambda_errors_carry_the_gateway_request_id(which: Which) {
    let Some(f) = fixture(which).await else {
        return;
    };
    let res = invoke(
        ::payments::router(f.state.clone()),
        "payment-get-no-key.json",
        &f,
    )
    .await;
    assert_eq!(res["statusCode"], 401, "{res}");
    assert_eq!(res["headers"]["x-request-id"], "Bx1aDhTbhcwEJyg=");
    let body = body_of(&res);
    assert_eq!(body["error"]["code"], "api_key_invalid");
    assert_eq!(body["error"]["request_id"], "Bx1aDhTbhcwEJyg=");
}

async fn checkout_function_creates_a_session_once_per_idempotency_key(which: Which) {
    let Some(f) = fixture(which).await else {
        return;
    };
    let res = invoke(
        ::checkout::router(f.state.clone()),
        "checkout-create.json",
        &f,
    )
    .await;
    assert_eq!(res["statusCode"], 201, "{res}");
    assert_eq!(res["headers"]["x-request-id"], "Bx1aEkQmBcwEMRt=");
    let body = body_of(&res);
    let id = body["id"].as_str().unwrap_or_default();
    assert!(id.starts_with("cs_"), "{body}");
    assert_eq!(body["livemode"], true);
    assert_eq!(body["flow"], "hosted");
    assert_eq!(
        body["checkout_url"],
        format!("https://pay.dhukuti.example/c/{id}").as_str()
    );
    // API Gateway retries the same event: the first answer comes back.
    let again = invoke(
        ::checkout::router(f.state.clone()),
        "checkout-create.json",
        &f,
    )
    .await;
    assert_eq!(again["statusCode"], 201, "{again}");
    assert_eq!(again["headers"]["idempotent-replayed"], "true");
    assert_eq!(body_of(&again)["id"], id);
}

/// Deployed without `PublicBaseUrl`, the session's `checkout_url` is on
/// the API's own domain, and the hosted function serves the page there.
async fn hosted_function_serves_the_checkout_page_on_the_api_domain(which: Which) {
    let Some(mut f) = fixture(which).await else {
        return;
    };
    f.state.config = Arc::new(Config {
        public_base_url: String::new(),
        events_base_url: None,
        dashboard_base_url: None,
    });
    let res = invoke(
        ::checkout::router(f.state.clone()),
        "checkout-create.json",
        &f,
    )
    .await;
    assert_eq!(res["statusCode"], 201, "{res}");
    let body = body_of(&res);
    let id = body["id"].as_str().unwrap_or_default().to_owned();
    assert_eq!(
        body["checkout_url"],
        format!("https://abc123def4.execute-api.ap-south-1.amazonaws.com/c/{id}").as_str()
    );
    f.session_id = Some(id.clone());
    let page = invoke(::hosted::router(f.state.clone()), "hosted-page.json", &f).await;
    assert_eq!(page["statusCode"], 200, "{page}");
    assert_eq!(page["headers"]["content-type"], "text/html; charset=utf-8");
    assert_eq!(page["headers"]["x-frame-options"], "DENY");
    assert_eq!(page["headers"]["x-request-id"], "Bx1aHqPaBcwEMa1=");
    let html = page["body"].as_str().unwrap_or_default();
    assert!(html.contains("Lambda Shop"), "{html}");
    assert!(html.contains("NPR 1,500.00"), "{html}");
    assert!(html.contains(&format!("action=\"/c/{id}/pay\"")), "{html}");
    // Live, with no credentials stored: nothing to pick, said plainly.
    assert!(html.contains("cannot take payments"), "{html}");
    assert!(!html.contains("sk_live_"), "no secret in the page");
}

/// The scheduler's handler runs a sweep against the store.
async fn scheduler_function_sweeps(which: Which) {
    let Some(f) = fixture(which).await else {
        return;
    };
    let event = serde_json::json!({
        "version": "0", "id": "a1b2", "detail-type": "Scheduled Event",
        "source": "aws.events", "account": "123456789012",
        "time": "2026-11-22T04:00:00Z", "region": "ap-south-1",
        "resources": ["arn:aws:events:ap-south-1:123456789012:rule/sweep"], "detail": {}
    });
    let report = match ::scheduler::handle(&f.state, event).await {
        Ok(r) => r,
        Err(e) => panic!("sweep failed: {e}"),
    };
    for field in [
        "sessions_expired",
        "payments_checked",
        "payments_settled",
        "errors",
        "events_fanned_out",
        "deliveries_queued",
        "deliveries_requeued",
        "subscriptions_advanced",
        "billing_invoices_issued",
        "billing_errors",
    ] {
        assert!(report[field].is_u64(), "{report}");
    }
}

// ---- webhooks: the stream fan-out and the queue dispatcher ----

/// A DynamoDB Streams event as Lambda hands it to the fan-out (after the
/// event source's filter, which a test cannot apply, so records it would
/// drop are here too): the INSERT of outbox event `__EVENT_ID__`, the
/// INSERT of a delivery in the same partition, and the REMOVE of an
/// expired event.
const OUTBOX_STREAM_EVENT: &str = r#"{
  "Records": [
    {
      "eventID": "7de3041dd709b024af6f29e4fa13d34c",
      "eventName": "INSERT",
      "eventVersion": "1.1",
      "eventSource": "aws:dynamodb",
      "awsRegion": "ap-south-1",
      "dynamodb": {
        "ApproximateCreationDateTime": 1763800000,
        "Keys": {"pk": {"S": "EVT#__EVENT_ID__"}, "sk": {"S": "EVT"}},
        "NewImage": {
          "pk": {"S": "EVT#__EVENT_ID__"},
          "sk": {"S": "EVT"},
          "id": {"S": "__EVENT_ID__"},
          "type": {"S": "payment.succeeded"},
          "project_id": {"S": "__PROJECT_ID__"},
          "mode": {"S": "sandbox"},
          "created_at": {"S": "2026-11-22T04:00:00Z"},
          "object": {"M": {"id": {"S": "pay_x"}, "status": {"S": "success"}}},
          "dispatched": {"BOOL": false},
          "gsi1pk": {"S": "PROJ#__PROJECT_ID__#sandbox#EVT"},
          "gsi1sk": {"S": "__EVENT_ID__"},
          "gsi2pk": {"S": "OUTBOX#1"},
          "gsi2sk": {"S": "__EVENT_ID__"}
        },
        "SequenceNumber": "111100000000041234567801",
        "SizeBytes": 412,
        "StreamViewType": "NEW_AND_OLD_IMAGES"
      },
      "eventSourceARN": "arn:aws:dynamodb:ap-south-1:123456789012:table/dhukuti-Table-1ABC/stream/2026-11-22T00:00:00.000"
    },
    {
      "eventID": "a1b9a6a0a1f3f0b7fd1e0c2a9e6a8b11",
      "eventName": "INSERT",
      "eventVersion": "1.1",
      "eventSource": "aws:dynamodb",
      "awsRegion": "ap-south-1",
      "dynamodb": {
        "ApproximateCreationDateTime": 1763800001,
        "Keys": {"pk": {"S": "EVT#__EVENT_ID__"}, "sk": {"S": "WHD#we_01JZZZZZZZZZZZZZZZZZZZZZZZ"}},
        "NewImage": {
          "pk": {"S": "EVT#__EVENT_ID__"},
          "sk": {"S": "WHD#we_01JZZZZZZZZZZZZZZZZZZZZZZZ"},
          "status": {"S": "pending"},
          "attempts": {"N": "0"}
        },
        "SequenceNumber": "111100000000041234567802",
        "SizeBytes": 190,
        "StreamViewType": "NEW_AND_OLD_IMAGES"
      },
      "eventSourceARN": "arn:aws:dynamodb:ap-south-1:123456789012:table/dhukuti-Table-1ABC/stream/2026-11-22T00:00:00.000"
    },
    {
      "eventID": "c0ffee00c0ffee00c0ffee00c0ffee00",
      "eventName": "REMOVE",
      "eventVersion": "1.1",
      "eventSource": "aws:dynamodb",
      "awsRegion": "ap-south-1",
      "userIdentity": {"type": "Service", "principalId": "dynamodb.amazonaws.com"},
      "dynamodb": {
        "ApproximateCreationDateTime": 1763800002,
        "Keys": {"pk": {"S": "EVT#evt_01JAAAAAAAAAAAAAAAAAAAAAAA"}, "sk": {"S": "EVT"}},
        "OldImage": {
          "pk": {"S": "EVT#evt_01JAAAAAAAAAAAAAAAAAAAAAAA"},
          "sk": {"S": "EVT"},
          "dispatched": {"BOOL": true}
        },
        "SequenceNumber": "111100000000041234567803",
        "SizeBytes": 120,
        "StreamViewType": "NEW_AND_OLD_IMAGES"
      },
      "eventSourceARN": "arn:aws:dynamodb:ap-south-1:123456789012:table/dhukuti-Table-1ABC/stream/2026-11-22T00:00:00.000"
    }
  ]
}"#;

/// One SQS record as Lambda hands it to the dispatcher; `messageId` and
/// `body` are filled in from the queued message.
const WEBHOOK_SQS_RECORD: &str = r#"{
  "messageId": "",
  "receiptHandle": "AQEBzWwaftRI0KuVm4tP+/7q1rGgNqicHq6d8ZnJ+aRVZ0kLdJX9Ke1aH1V2UoZTmNqMwyaRpA==",
  "body": "",
  "attributes": {
    "ApproximateReceiveCount": "1",
    "SentTimestamp": "1763800003000",
    "SenderId": "AROAEXAMPLEID:dhukuti-WebhookFanoutFunction",
    "ApproximateFirstReceiveTimestamp": "1763800003010"
  },
  "messageAttributes": {},
  "md5OfBody": "098f6bcd4621d373cade4e832627b4f6",
  "eventSource": "aws:sqs",
  "eventSourceARN": "arn:aws:sqs:ap-south-1:123456789012:dhukuti-WebhookQueue-1ABC",
  "awsRegion": "ap-south-1"
}"#;

/// What a webhook receiver got: the signature header and the raw body.
type Received = Arc<std::sync::Mutex<Vec<(String, Vec<u8>)>>>;

/// A receiver on a loopback port answering `status` to every POST /hooks;
/// answers its URL and what it got.
async fn receiver(status: u16) -> (String, Received) {
    use shared::webhooks::signature::SIGNATURE_HEADER;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let got: Received = Arc::default();
    let seen = got.clone();
    let app = axum::Router::new().route(
        "/hooks",
        axum::routing::post(move |headers: http::HeaderMap, body: axum::body::Bytes| {
            let seen = seen.clone();
            async move {
                let signature = headers
                    .get(SIGNATURE_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((signature, body.to_vec()));
                http::StatusCode::from_u16(status)
                    .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR)
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://127.0.0.1:{}/hooks", addr.port()), got)
}

fn received(got: &Received) -> Vec<(String, Vec<u8>)> {
    got.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The fixture's state able to seal signing secrets (a generated master
/// key) and to deliver to loopback receivers (sandbox only), with `retries`
/// as the retry schedule.
fn webhook_state(f: &Fixture, retries: Vec<std::time::Duration>) -> AppState {
    use shared::domain::credentials::{CredentialsKey, CredentialsKeys};
    use shared::domain::webhooks::WebhookSettings;
    use shared::providers::{ProviderConfig, ProviderHub, SandboxAccounts};
    let key = CredentialsKey::generate("k1").unwrap_or_else(|e| panic!("{e}"));
    let hub = ProviderHub::new(
        &ProviderConfig::sandbox(),
        &ProviderConfig::live(),
        Some(CredentialsKeys::single(key)),
        SandboxAccounts::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    f.state
        .clone()
        .with_providers(hub)
        .with_webhooks(WebhookSettings {
            allow_local_http: true,
            schedule: retries,
            ..WebhookSettings::default()
        })
}

/// Registers a sandbox endpoint; answers it and its signing secret.
async fn endpoint(
    state: &AppState,
    f: &Fixture,
    url: &str,
    events: Option<&[&str]>,
) -> (shared::domain::webhooks::Endpoint, String) {
    let body = shared::domain::webhooks::CreateEndpoint {
        url: url.to_owned(),
        events: events.map(|e| e.iter().map(|s| (*s).to_owned()).collect()),
        enabled: None,
    };
    match shared::domain::webhooks::create(
        state,
        &shared::domain::Tenant::new(f.project_id.as_str(), Mode::Sandbox),
        body,
        None,
    )
    .await
    {
        Ok((endpoint, Some(secret))) => (endpoint, secret),
        Ok((endpoint, None)) => panic!("{} came without its secret", endpoint.id),
        Err(e) => panic!("endpoint: {e}"),
    }
}

/// Records a sandbox `payment.succeeded` event in the outbox, as a state
/// change would.
async fn outbox_event(state: &AppState, f: &Fixture) -> shared::domain::outbox::Event {
    use shared::domain::outbox::{Event, EventType};
    let event = Event::new(
        EventType::PaymentSucceeded,
        &shared::domain::Tenant::new(shared::ids::ProjectId::stored(&f.project_id), Mode::Sandbox),
        serde_json::json!({"id": f.payment_id, "object": "payment", "status": "success"}),
        state.clock.now(),
    );
    let put = event.put_ops().unwrap_or_else(|e| panic!("{e}"));
    if let Err(e) = state.store.transact(put).await {
        panic!("{e}")
    }
    event
}

/// The stream event announcing `event` through the fan-out's handler;
/// answers the partial batch response as JSON.
async fn fan_out_stream(state: &AppState, f: &Fixture, event_id: &str) -> Value {
    let text = OUTBOX_STREAM_EVENT
        .replace("__EVENT_ID__", event_id)
        .replace("__PROJECT_ID__", &f.project_id);
    let event = serde_json::from_str(&text).unwrap_or_else(|e| panic!("stream event: {e}"));
    let response = ::webhook_fanout::handle(state, event).await;
    serde_json::to_value(&response).unwrap_or(Value::Null)
}

/// The messages on the webhooks queue now (hidden for a minute once
/// taken, as the Lambda poller would).
async fn queued(state: &AppState, wait: std::time::Duration) -> Vec<shared::queue::Message> {
    let got = state
        .queue
        .receive(
            shared::queue::QueueName::Webhooks,
            10,
            wait,
            std::time::Duration::from_secs(60),
        )
        .await;
    got.unwrap_or_else(|e| panic!("receive: {e}"))
}

/// `messages` as one SQS event through the dispatcher's handler; answers
/// the partial batch response as JSON.
async fn dispatch(state: &AppState, messages: &[shared::queue::Message]) -> Value {
    let records: Vec<Value> = messages
        .iter()
        .map(|m| {
            let mut record: Value = serde_json::from_str(WEBHOOK_SQS_RECORD).unwrap_or(Value::Null);
            record["messageId"] = m.id.clone().into();
            record["body"] = m.body.clone().into();
            record
        })
        .collect();
    let event = serde_json::from_value(serde_json::json!({ "Records": records }))
        .unwrap_or_else(|e| panic!("sqs event: {e}"));
    let client = state.webhooks.client().unwrap_or_else(|e| panic!("{e}"));
    let response = ::webhook_dispatcher::handle(state, &client, event).await;
    serde_json::to_value(&response).unwrap_or(Value::Null)
}

async fn delivery_of(
    state: &AppState,
    event_id: &shared::ids::EventId,
    endpoint_id: &shared::ids::EndpointId,
) -> Option<shared::domain::webhooks::Delivery> {
    shared::domain::webhooks::delivery(&*state.store, event_id, endpoint_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The whole pipeline: an outbox insert on the stream becomes one
/// delivery for the one endpoint that wants it and one queued attempt;
/// that message through the dispatcher makes one signed POST, logged as a
/// success. Replays of the stream record or of the message do nothing more.
async fn webhook_fanout_and_dispatcher_deliver_an_outbox_event(which: Which) {
    let Some(f) = fixture(which).await else {
        return;
    };
    let state = webhook_state(&f, vec![std::time::Duration::from_secs(60)]);
    let (url, got) = receiver(200).await;
    let (wanted, secret) = endpoint(&state, &f, &url, None).await;
    let (other, _) = endpoint(&state, &f, &url, Some(&["refund.succeeded"])).await;
    let event = outbox_event(&state, &f).await;

    let answer = fan_out_stream(&state, &f, &event.id).await;
    assert_eq!(answer, serde_json::json!({"batchItemFailures": []}));
    let Some(d) = delivery_of(&state, &event.id, &wanted.id).await else {
        panic!("no delivery for the endpoint that wants the event")
    };
    assert_eq!((d.attempts, d.status.as_str()), (0, "pending"));
    assert!(delivery_of(&state, &event.id, &other.id).await.is_none());
    let stored = shared::domain::outbox::get(&state, &event.id).await;
    assert!(
        matches!(stored, Ok(Some(ref e)) if e.dispatched),
        "{stored:?}"
    );
    let messages = queued(&state, std::time::Duration::from_secs(2)).await;
    assert_eq!(messages.len(), 1, "{messages:?}");
    let body: Value = serde_json::from_str(&messages[0].body).unwrap_or(Value::Null);
    assert_eq!(
        body,
        serde_json::json!({"event_id": event.id, "endpoint_id": wanted.id, "attempt": 0})
    );

    // The stream delivers the record again: nothing new is queued.
    assert_eq!(
        fan_out_stream(&state, &f, &event.id).await,
        serde_json::json!({"batchItemFailures": []})
    );
    assert!(queued(&state, std::time::Duration::ZERO).await.is_empty());

    let answer = dispatch(&state, &messages).await;
    assert_eq!(answer, serde_json::json!({"batchItemFailures": []}));
    let posts = received(&got);
    assert_eq!(posts.len(), 1);
    let (signature, raw) = &posts[0];
    let now = SystemClock.now().unix_seconds();
    let verified = shared::webhooks::signature::verify(signature, raw, &[secret.as_str()], now);
    assert_eq!(verified, Ok(()), "{signature}");
    let sent: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
    assert_eq!(sent["id"], event.id.as_str());
    assert_eq!(sent["type"], "payment.succeeded");
    assert_eq!(sent["livemode"], false);
    assert_eq!(sent["data"]["object"]["id"], f.payment_id.as_str());
    let Some(d) = delivery_of(&state, &event.id, &wanted.id).await else {
        panic!("the delivery is gone")
    };
    assert_eq!(
        (d.attempts, d.status.as_str(), d.response_status),
        (1, "success", Some(200))
    );

    // The same message again (at-least-once): no second POST.
    assert_eq!(
        dispatch(&state, &messages).await,
        serde_json::json!({"batchItemFailures": []})
    );
    assert_eq!(received(&got).len(), 1);
    assert!(queued(&state, std::time::Duration::ZERO).await.is_empty());
}

/// A receiver that keeps failing: each attempt is logged and the next one
/// queued as a new message (the batch reports no failure), until the
/// schedule runs out and the delivery fails for good.
async fn webhook_dispatcher_retries_then_gives_up(which: Which) {
    let Some(f) = fixture(which).await else {
        return;
    };
    // One retry, at once, so the test does not wait.
    let state = webhook_state(&f, vec![std::time::Duration::ZERO]);
    let (url, got) = receiver(503).await;
    let (wanted, _) = endpoint(&state, &f, &url, None).await;
    let event = outbox_event(&state, &f).await;
    assert_eq!(
        fan_out_stream(&state, &f, &event.id).await,
        serde_json::json!({"batchItemFailures": []})
    );

    let first = queued(&state, std::time::Duration::from_secs(2)).await;
    assert_eq!(first.len(), 1);
    assert_eq!(
        dispatch(&state, &first).await,
        serde_json::json!({"batchItemFailures": []})
    );
    let Some(d) = delivery_of(&state, &event.id, &wanted.id).await else {
        panic!("no delivery")
    };
    assert_eq!(
        (d.attempts, d.status.as_str(), d.response_status),
        (1, "retrying", Some(503))
    );

    let second = queued(&state, std::time::Duration::from_secs(2)).await;
    assert_eq!(second.len(), 1, "the retry is a new message");
    let body: Value = serde_json::from_str(&second[0].body).unwrap_or(Value::Null);
    assert_eq!(body["attempt"], 1);
    assert_eq!(
        dispatch(&state, &second).await,
        serde_json::json!({"batchItemFailures": []})
    );
    let Some(d) = delivery_of(&state, &event.id, &wanted.id).await else {
        panic!("no delivery")
    };
    assert_eq!((d.attempts, d.status.as_str()), (2, "failed"));
    assert_eq!(received(&got).len(), 2);
    assert!(queued(&state, std::time::Duration::ZERO).await.is_empty());
}

/// An HTTP API (v2) event for `method path` from `source_ip`, as API
/// Gateway sends it (`hosted-page.json` with its method, path, address,
/// headers and body replaced).
fn http_event(
    method: &str,
    path: &str,
    source_ip: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> LambdaRequest {
    let file = format!("{}/events/hosted-page.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut event: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    event["rawPath"] = path.into();
    event["requestContext"]["http"]["method"] = method.into();
    event["requestContext"]["http"]["path"] = path.into();
    event["requestContext"]["http"]["sourceIp"] = source_ip.into();
    event["headers"]["x-forwarded-for"] = source_ip.into();
    for (k, v) in headers {
        event["headers"][*k] = (*v).into();
    }
    if let Some(b) = body {
        event["body"] = b.into();
    }
    serde_json::from_value(event).unwrap_or_else(|e| panic!("{e}"))
}

async fn call(router: axum::Router, request: LambdaRequest) -> Value {
    let mut handler = Adapter::from(router);
    match handler
        .call(LambdaEvent::new(request, Context::default()))
        .await
    {
        Ok(r) => serde_json::to_value(&r).unwrap_or(Value::Null),
        Err(e) => panic!("handler failed: {e:?}"),
    }
}

/// Issue 37, 5: sessions opened from one payment link count per IPv6 /56
/// and /48 of the client API Gateway reports (`sourceIp`), so one
/// allocation, each /64 of it counted apart as an address, cannot take
/// all of a link's opens; everyone else still opens it.
async fn hosted_function_bounds_link_opens_per_ipv6_allocation(which: Which) {
    let Some(f) = fixture(which).await else {
        return;
    };
    let bearer = format!("Bearer {}", f.key);
    let create = http_event(
        "POST",
        "/v1/payment-links",
        "203.0.113.7",
        &[
            ("authorization", bearer.as_str()),
            ("content-type", "application/json"),
            ("accept", "application/json"),
        ],
        Some(r#"{"title": "Tuition", "amount": 150000}"#),
    );
    let res = call(::payment_links::router(f.state.clone()), create).await;
    assert_eq!(res["statusCode"], 201, "{res}");
    let link = body_of(&res)["id"].as_str().unwrap_or_default().to_owned();
    // Per link 10 a minute; per /56 3, per /48 5. The clock stands still:
    // a minute rolling over mid-count (a slow run on moto) would refill
    // every budget and let more through than the limits say.
    f.state.public_limits().set(1000, 1000, 1000, 10, 1000);
    f.state.public_limits().set_more(1000, 1000, 3, 5);
    let state = f
        .state
        .clone()
        .with_clock(Arc::new(shared::time::ManualClock::new(SystemClock.now())));
    let open = |ip: &str| {
        http_event(
            "POST",
            &format!("/l/{link}"),
            ip,
            &[("content-type", "application/x-www-form-urlencoded")],
            Some(""),
        )
    };
    let mut codes = Vec::new();
    // Eight /56s of one /48, four /64s each: every client new to the
    // per-address limits.
    for site in 0..8u32 {
        for net in 0..4u32 {
            let ip = format!("2400:1a00:b040:{:x}::1", site * 256 + net);
            let res = call(::hosted::router(state.clone()), open(&ip)).await;
            codes.push(res["statusCode"].as_u64().unwrap_or(0));
        }
    }
    let opened = codes.iter().filter(|c| **c == 303).count();
    let refused = codes.iter().filter(|c| **c == 429).count();
    assert_eq!((opened, refused), (5, 27), "{codes:?}");
    // An IPv4 customer and another allocation still open the link.
    for ip in ["198.51.100.20", "2400:1a00:b041::1"] {
        let res = call(::hosted::router(state.clone()), open(ip)).await;
        assert_eq!(res["statusCode"], 303, "{ip}: {res}");
    }
}

/// Waits, if the current minute ends within 10 s, for the next one: the
/// public limits count in windows of a minute of the system clock.
async fn within_one_minute_window() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let into = now.as_millis() % 60_000;
    if into > 50_000 {
        let left = u64::try_from(60_000 - into).unwrap_or(0);
        tokio::time::sleep(std::time::Duration::from_millis(left + 200)).await;
    }
}

/// Issue 37, 12: behind the edge stack (`infra/edge.yaml`) every request
/// comes from one of CloudFront's addresses; the client's own is in
/// `CloudFront-Viewer-Address`, trusted only beside the distribution's
/// origin secret. A client writing the header itself changes nothing: its
/// requests count against the address it connects from. Through the
/// distribution each customer counts apart, so one flooding client is
/// refused while another customer still opens the link.
async fn hosted_function_trusts_the_viewer_address_only_with_the_origin_secret(which: Which) {
    let Some(f) = fixture(which).await else {
        return;
    };
    let bearer = format!("Bearer {}", f.key);
    let create = http_event(
        "POST",
        "/v1/payment-links",
        "203.0.113.7",
        &[
            ("authorization", bearer.as_str()),
            ("content-type", "application/json"),
            ("accept", "application/json"),
        ],
        Some(r#"{"title": "Tuition", "amount": 150000}"#),
    );
    let res = call(::payment_links::router(f.state.clone()), create).await;
    assert_eq!(res["statusCode"], 201, "{res}");
    let link = body_of(&res)["id"].as_str().unwrap_or_default().to_owned();
    let secret = "edge-origin-secret-0123456789";
    let state = f.state.clone().with_origin_secret(secret);
    // Three requests a minute per client address, all in one window.
    state.public_limits().set(3, 1000, 1000, 1000, 1000);
    within_one_minute_window().await;
    let edge_ip = "130.176.10.1"; // one of CloudFront's
    let page = |from: &str, headers: &[(&str, &str)]| {
        http_event("GET", &format!("/l/{link}"), from, headers, None)
    };
    let status = |res: Value| res["statusCode"].as_u64().unwrap_or(0);
    // A client at 192.0.2.66 claims a fresh address on every request,
    // without the secret (or with a guess): all count against 192.0.2.66.
    let mut codes = Vec::new();
    for n in 0..6 {
        let claimed = format!("198.51.100.{n}:4430");
        let guess = [
            ("cloudfront-viewer-address", claimed.as_str()),
            ("x-dhukuti-origin-secret", "guess"),
        ];
        let headers = if n % 2 == 0 { &guess[..1] } else { &guess[..] };
        let res = call(::hosted::router(state.clone()), page("192.0.2.66", headers)).await;
        codes.push(status(res));
    }
    assert_eq!(codes, [200, 200, 200, 429, 429, 429]);
    // Through the distribution: the flooding viewer is refused after its
    // three, from the same CloudFront address an honest customer uses.
    let through = |viewer: &'static str| {
        page(
            edge_ip,
            &[
                ("cloudfront-viewer-address", viewer),
                ("x-dhukuti-origin-secret", secret),
            ],
        )
    };
    let mut codes = Vec::new();
    for _ in 0..5 {
        let res = call(
            ::hosted::router(state.clone()),
            through("2001:db8:1::66:51234"),
        )
        .await;
        codes.push(status(res));
    }
    assert_eq!(codes, [200, 200, 200, 429, 429]);
    for viewer in ["203.0.113.77:61000", "[2001:db8:2::1]:443"] {
        let res = call(::hosted::router(state.clone()), through(viewer)).await;
        assert_eq!(res["statusCode"], 200, "{viewer}: {res}");
    }
    // The flooding viewer's budget is its own, not CloudFront's address's.
    let res = call(::hosted::router(state.clone()), page(edge_ip, &[])).await;
    assert_eq!(res["statusCode"], 200, "{res}");
}

/// Issue 37, 12: the event stream function's URL is public. Behind the
/// edge stack it serves only requests carrying the distribution's origin
/// secret, so nobody holds one of its few reserved instances, or names
/// a client address, around the WAF; without the edge, as before.
async fn events_function_serves_only_the_edge_when_one_is_configured(which: Which) {
    let Some(mut f) = fixture(which).await else {
        return;
    };
    let res = invoke(
        ::checkout::router(f.state.clone()),
        "checkout-create.json",
        &f,
    )
    .await;
    assert_eq!(res["statusCode"], 201, "{res}");
    let id = body_of(&res)["id"].as_str().unwrap_or_default().to_owned();
    f.session_id = Some(id.clone());
    let path = format!("/c/{id}/events");
    let stream = |headers: &[(&str, &str)]| http_event("GET", &path, "192.0.2.80", headers, None);
    let quick = std::time::Duration::from_millis(50);
    let status = |res: &Value| res["statusCode"].as_u64().unwrap_or(0);
    // No edge: every client is served, as before (a checkout session has
    // no stream, only a Direct-QR or mobile one: the answer is 404).
    let res = call(::hosted::events_router(f.state.clone(), quick), stream(&[])).await;
    assert_eq!(status(&res), 404, "{res}");
    let secret = "edge-origin-secret-0123456789";
    let behind = f.state.clone().with_origin_secret(secret);
    let spoof = ("cloudfront-viewer-address", "198.51.100.9:443");
    for headers in [
        &[][..],
        &[spoof][..],
        &[spoof, ("x-dhukuti-origin-secret", "edge-origin-secret")][..],
    ] {
        let res = call(
            ::hosted::events_router(behind.clone(), quick),
            stream(headers),
        )
        .await;
        assert_eq!(status(&res), 403, "{headers:?}: {res}");
        assert_eq!(
            body_of(&res)["error"],
            "event streams are served through the gateway's own domain",
            "{res}"
        );
    }
    let through = [spoof, ("x-dhukuti-origin-secret", secret)];
    let res = call(
        ::hosted::events_router(behind.clone(), quick),
        stream(&through),
    )
    .await;
    assert_eq!(status(&res), 404, "{res}");
    assert_eq!(
        body_of(&res)["error"],
        "no such Direct-QR or mobile session",
        "{res}"
    );
}

on_both_backends!(
    events_function_serves_only_the_edge_when_one_is_configured,
    hosted_function_trusts_the_viewer_address_only_with_the_origin_secret,
    invoices_function_answers_the_pdf_as_binary,
    hosted_function_bounds_link_opens_per_ipv6_allocation,
    webhook_fanout_and_dispatcher_deliver_an_outbox_event,
    webhook_dispatcher_retries_then_gives_up,
    hosted_function_serves_the_checkout_page_on_the_api_domain,
    scheduler_function_sweeps,
    account_function_answers_an_http_api_event,
    payments_function_lists_with_the_query_string,
    payments_function_retrieves_one,
    lambda_errors_carry_the_gateway_request_id,
    checkout_function_creates_a_session_once_per_idempotency_key,
);
