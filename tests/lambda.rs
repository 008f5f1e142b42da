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
use shared::ids::{IdKind, new_id};
use shared::money::{Currency, Paisa};
use shared::time::{Clock, SystemClock};

struct Fixture {
    _tmp: tempfile::TempDir,
    state: AppState,
    key: String,
    payment_id: String,
    session_id: Option<String>,
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
    let Ok((key, _)) = shared::domain::account::issue_api_key(&*store, now, &p, new).await else {
        panic!()
    };
    let mut ids = Vec::new();
    for amount in [700, 900] {
        let payment = Payment {
            id: new_id(IdKind::Payment),
            project_id: p.id.clone(),
            checkout_session_id: new_id(IdKind::CheckoutSession),
            mode: Mode::Live,
            amount: Paisa::new(amount).unwrap_or_default(),
            amount_refunded: Paisa::ZERO,
            currency: Currency::Npr,
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
    };
    Some(Fixture {
        _tmp: tmp,
        state: AppState::new(store, Arc::new(SystemClock), config)
            .with_queue(queue)
            .with_blobs(blobs),
        key,
        payment_id: ids.remove(0),
        session_id: None,
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
    ] {
        assert!(report[field].is_u64(), "{report}");
    }
}

on_both_backends!(
    hosted_function_serves_the_checkout_page_on_the_api_domain,
    scheduler_function_sweeps,
    account_function_answers_an_http_api_event,
    payments_function_lists_with_the_query_string,
    payments_function_retrieves_one,
    lambda_errors_carry_the_gateway_request_id,
    checkout_function_creates_a_session_once_per_idempotency_key,
);
