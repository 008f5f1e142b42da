//! A scripted HTTP server on 127.0.0.1:0 for the clients' unit tests: it
//! records every request and answers with the reply set last.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

#[derive(Clone, Debug)]
pub struct Captured {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Captured {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }

    pub fn query_pairs(&self) -> Vec<(String, String)> {
        form_urlencoded::parse(self.query.as_deref().unwrap_or_default().as_bytes())
            .into_owned()
            .collect()
    }
}

#[derive(Clone)]
struct Reply {
    status: u16,
    body: String,
    delay: Duration,
}

struct Inner {
    requests: Mutex<Vec<Captured>>,
    reply: Mutex<Reply>,
}

pub struct Mock {
    pub base: String,
    inner: Arc<Inner>,
}

impl Mock {
    pub async fn start() -> Mock {
        let inner = Arc::new(Inner {
            requests: Mutex::new(Vec::new()),
            reply: Mutex::new(Reply {
                status: 200,
                body: "{}".into(),
                delay: Duration::ZERO,
            }),
        });
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Mock {
            base: format!("http://{addr}"),
            inner,
        }
    }

    /// Answer every following request with `status` and `body`.
    pub fn reply(&self, status: u16, body: impl Into<String>) {
        let mut r = self.inner.reply.lock().expect("lock");
        r.status = status;
        r.body = body.into();
    }

    /// Wait this long before answering.
    pub fn delay(&self, delay: Duration) {
        self.inner.reply.lock().expect("lock").delay = delay;
    }

    pub fn requests(&self) -> Vec<Captured> {
        self.inner.requests.lock().expect("lock").clone()
    }

    pub fn last(&self) -> Captured {
        self.requests().last().cloned().expect("a request")
    }
}

async fn handle(State(inner): State<Arc<Inner>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    inner.requests.lock().expect("lock").push(Captured {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_owned()))
            .collect(),
        body: String::from_utf8_lossy(&bytes).into_owned(),
    });
    let reply = inner.reply.lock().expect("lock").clone();
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let content_type = if reply.body.trim_start().starts_with(['{', '[']) {
        "application/json"
    } else {
        "text/html"
    };
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, reply.body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
