//! A Lambda function's cold start, the same for every function: what it
//! builds before serving ([`start`]) either works or fails with one line
//! naming what is wrong (usually an environment variable), and that line
//! reaches the Runtime API's init-error endpoint, so Lambda (and SAM
//! local) show the reason instead of a bare "Runtime exited".
//!
//! `lambda_runtime` reports init errors only for SnapStart hooks; a
//! function whose `main` returns before `lambda_runtime::run` would exit
//! without telling the Runtime API why. Each function's `main` wraps its
//! set-up in [`start`] and returns its error, so the process exits non-zero.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use lambda_runtime_api_client::PooledClient;
use lambda_runtime_api_client::body::Body;

/// Where the Runtime API is (`host:port`), set by Lambda and SAM local.
pub const RUNTIME_API_ENV: &str = "AWS_LAMBDA_RUNTIME_API";
/// The Runtime API's endpoint for a failed start.
pub const INIT_ERROR_PATH: &str = "/2018-06-01/runtime/init/error";
/// The error type Lambda shows for a failed start.
pub const INIT_ERROR_TYPE: &str = "Runtime.InitError";
/// How long reporting may take (the Runtime API is local).
const REPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// A start that failed: its one line, already logged and reported.
pub struct InitFailed(pub String);

impl fmt::Display for InitFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// `main` returning the error prints its Debug: the line itself, not a
// struct around a quoted string.
impl fmt::Debug for InitFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InitFailed {}

/// Runs a function's set-up; on failure, logs one line, reports it to the
/// Runtime API's `/init/error` (when [`RUNTIME_API_ENV`] is set) and
/// returns it for `main` to return (a non-zero exit).
pub async fn start<T, E: fmt::Display>(
    init: impl Future<Output = Result<T, E>>,
) -> Result<T, InitFailed> {
    match init.await {
        Ok(value) => Ok(value),
        Err(e) => {
            let line = one_line(&e.to_string());
            tracing::error!(error = %line, "the function cannot start");
            if let Err(report) = report_init_error(&line).await {
                tracing::error!(error = %report, "cannot report the failed start to the Runtime API");
            }
            Err(InitFailed(line))
        }
    }
}

/// An error's text on one line (Lambda shows the first line of a log
/// record; a multi-line reason would be cut).
pub fn one_line(text: &str) -> String {
    let parts: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    match parts.is_empty() {
        true => "the function cannot start (no reason given)".to_owned(),
        false => parts.join("; "),
    }
}

/// POSTs `message` to the Runtime API's `/init/error` as Lambda expects
/// (`errorType`, `errorMessage`, the `Lambda-Runtime-Function-Error-Type`
/// header). Not on Lambda ([`RUNTIME_API_ENV`] unset): nothing to do.
pub async fn report_init_error(message: &str) -> Result<(), String> {
    let Some(api) = std::env::var(RUNTIME_API_ENV)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
    else {
        return Ok(());
    };
    let base: http::Uri = format!("http://{api}")
        .parse()
        .map_err(|e| format!("{RUNTIME_API_ENV}={api:?} is not host:port: {e}"))?;
    let client = PooledClient::builder().with_endpoint(base).build();
    let body = serde_json::json!({"errorType": INIT_ERROR_TYPE, "errorMessage": message});
    let request = lambda_runtime_api_client::build_request()
        .method(http::Method::POST)
        .uri(INIT_ERROR_PATH)
        .header("lambda-runtime-function-error-type", INIT_ERROR_TYPE)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(REPORT_TIMEOUT, client.call(request))
        .await
        .map_err(|_| format!("no answer from {api} in {REPORT_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    match response.status().is_success() {
        true => Ok(()),
        false => Err(format!("{api} answered {}", response.status())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_one_line() {
        assert_eq!(one_line("a\n  b \n\nc"), "a; b; c");
        assert_eq!(one_line("DHUKUTI_X is bad"), "DHUKUTI_X is bad");
        assert!(one_line(" \n").contains("no reason"));
    }

    #[tokio::test]
    async fn a_failed_start_is_returned_with_its_line() {
        // Without AWS_LAMBDA_RUNTIME_API nothing is posted (tests never set it).
        let out: Result<(), InitFailed> =
            start(async { Err::<(), _>("DHUKUTI_BACKEND=x\nis bad") }).await;
        match out {
            Err(e) => assert_eq!(format!("{e:?}"), "DHUKUTI_BACKEND=x; is bad"),
            Ok(()) => panic!("a failed start returned Ok"),
        }
    }
}
