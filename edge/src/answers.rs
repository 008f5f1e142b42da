//! Answers several resource groups share.

use crate::ApiError;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, header};
use serde::Serialize;

/// Room for a typical record's JSON (a payment is about 500 bytes), so the
/// body is written into one buffer instead of regrowing from axum's 128.
const ANSWER_CAPACITY: usize = 1024;

/// A JSON answer, as `axum::Json` gives one (`content-type:
/// application/json`), written into one buffer that becomes the body
/// without a copy. A value that does not serialize is a 500 envelope,
/// with the cause logged.
#[derive(Clone, Copy, Debug, Default)]
pub struct Json<T>(pub T);

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        let mut body = Vec::with_capacity(ANSWER_CAPACITY);
        match serde_json::to_writer(&mut body, &self.0) {
            Ok(()) => (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                body,
            )
                .into_response(),
            Err(e) => {
                tracing::error!(error = %e, "an answer did not serialize");
                ApiError::internal().into_response()
            }
        }
    }
}

/// The answer of a delete (a payment link) or a discard (a draft invoice):
/// the record is gone.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Deleted {
    /// Always `true`.
    pub deleted: bool,
    pub id: String,
    pub livemode: bool,
}

impl Deleted {
    pub fn of(id: String, mode: shared::domain::Mode) -> Deleted {
        Deleted {
            deleted: true,
            id,
            livemode: mode.is_live(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::collections::BTreeMap;

    async fn parts(res: Response) -> (u16, Option<String>, Vec<u8>) {
        let status = res.status().as_u16();
        let kind = res
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = res
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .unwrap_or_default();
        (status, kind, body)
    }

    #[tokio::test]
    async fn a_json_answer_is_the_value_serialized_as_axum_would() {
        let value = Deleted::of("plink_1".into(), shared::domain::Mode::Sandbox);
        let ours = parts(Json(value.clone()).into_response()).await;
        let axums = parts(axum::Json(value).into_response()).await;
        assert_eq!(ours, axums);
        assert_eq!(ours.0, 200);
        assert_eq!(ours.1.as_deref(), Some("application/json"));
        let long: Vec<String> = (0..200).map(|i| format!("item {i}")).collect();
        let (_, _, body) = parts(Json(&long).into_response()).await;
        assert_eq!(
            serde_json::from_slice::<Vec<String>>(&body).ok(),
            Some(long)
        );
    }

    #[tokio::test]
    async fn a_value_that_does_not_serialize_is_a_500_envelope() {
        // JSON object keys must be strings.
        let value: BTreeMap<(u8, u8), u8> = BTreeMap::from([((1, 2), 3)]);
        let (status, kind, body) = parts(Json(value).into_response()).await;
        assert_eq!(status, 500);
        assert_eq!(kind.as_deref(), Some("application/json"));
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        assert_eq!(body["error"]["type"], "api_error");
    }
}
