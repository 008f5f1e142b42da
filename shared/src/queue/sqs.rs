//! [`SqsQueue`]: the queue port on Amazon SQS (standard queues).
//!
//! Requests are checked with the same rules as the in-process twin
//! ([`super::memory`]) before they reach SQS, so a bad request is
//! [`QueueError::Invalid`] on both. Durations go to SQS in whole seconds:
//! a delay and a visibility timeout are rounded up (never shorter than
//! asked), the long-poll wait is rounded to the nearest second and capped at
//! 20 s.
//!
//! Errors: throttling, timeouts, connection failures and 5xx answers are
//! [`QueueError::Unavailable`] (safe to retry later); a receipt handle SQS
//! does not know is [`QueueError::Invalid`]; everything else is
//! [`QueueError::Backend`] with the operation and SQS's message.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
#[cfg(feature = "tools")]
use aws_sdk_sqs::operation::create_queue::CreateQueueError;
#[cfg(feature = "tools")]
use aws_sdk_sqs::operation::delete_message::DeleteMessageError;
#[cfg(feature = "tools")]
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};

use super::memory::validate_send;
#[cfg(feature = "tools")]
use super::memory::{MAX_WAIT, validate_receive};
use super::{Message, Queue, QueueError, QueueName};
use crate::aws::is_transient;

/// How many receives a message gets before SQS moves it to the queue's
/// dead-letter queue.
pub const MAX_RECEIVE_COUNT: u32 = 5;
/// How long the dead-letter queues keep a message: SQS's longest, 14 days.
#[cfg(feature = "tools")]
const DLQ_RETENTION_SECS: u32 = 14 * 24 * 60 * 60;
/// SQS's longest queue name.
#[cfg(feature = "tools")]
const MAX_QUEUE_NAME: usize = 80;

/// The queue port on SQS: one queue URL per [`QueueName`].
#[derive(Clone, Debug)]
pub struct SqsQueue {
    client: SqsClient,
    urls: HashMap<QueueName, String>,
}

/// The SDK client, built already or on the first send. Building one
/// parses the SDK's endpoint partition table and assembles its plugins
/// (about 0.1 ms); a function whose first request sends nothing, such as
/// a dashboard page, should not pay that in its cold start.
#[derive(Clone, Debug)]
enum SqsClient {
    Built(Client),
    OnFirstUse {
        config: Box<aws_sdk_sqs::Config>,
        built: std::sync::OnceLock<Client>,
    },
}

impl SqsQueue {
    /// `urls` maps each queue to its SQS URL (see [`ensure_queues`]); a
    /// queue missing from it fails with [`QueueError::Backend`] when used.
    pub fn new(client: Client, urls: HashMap<QueueName, String>) -> Self {
        Self {
            client: SqsClient::Built(client),
            urls,
        }
    }

    /// As [`SqsQueue::new`], the client built from `config` when first
    /// needed. `config` must be one a client was already built from (the
    /// SDK validates it then, and panics on a bad one): the shared
    /// configuration the store's DynamoDB client was made with.
    pub fn on_first_use(config: aws_sdk_sqs::Config, urls: HashMap<QueueName, String>) -> Self {
        Self {
            client: SqsClient::OnFirstUse {
                config: Box::new(config),
                built: std::sync::OnceLock::new(),
            },
            urls,
        }
    }

    fn client(&self) -> &Client {
        match &self.client {
            SqsClient::Built(client) => client,
            SqsClient::OnFirstUse { config, built } => {
                built.get_or_init(|| Client::from_conf((**config).clone()))
            }
        }
    }

    /// Whether the SDK client exists yet (tests).
    #[cfg(test)]
    fn built(&self) -> bool {
        match &self.client {
            SqsClient::Built(_) => true,
            SqsClient::OnFirstUse { built, .. } => built.get().is_some(),
        }
    }

    fn url(&self, queue: QueueName) -> Result<&str, QueueError> {
        self.urls.get(&queue).map(String::as_str).ok_or_else(|| {
            QueueError::Backend(format!(
                "no SQS queue URL configured for queue {}",
                queue.as_str()
            ))
        })
    }
}

/// An SQS client for `endpoint` (moto, LocalStack, ...) in `region`, with
/// static dummy credentials: for tests and local runs only.
pub fn client_for_endpoint(endpoint: &str, region: &str) -> Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(
            "test",
            "test",
            None,
            None,
            "dhukuti-static",
        ))
        .build();
    Client::from_conf(config)
}

/// The SQS queue name of `queue` under `prefix`.
pub fn queue_name(prefix: &str, queue: QueueName) -> String {
    format!("{prefix}-{}", queue.as_str())
}

/// The SQS name of `queue`'s dead-letter queue under `prefix`.
pub fn dead_letter_queue_name(prefix: &str, queue: QueueName) -> String {
    format!("{prefix}-{}-dlq", queue.as_str())
}

/// Creates (or finds) every queue of [`QueueName::ALL`] as `{prefix}-{name}`,
/// each with a dead-letter queue `{prefix}-{name}-dlq` that receives a
/// message after [`MAX_RECEIVE_COUNT`] receives. Idempotent: existing
/// queues are kept and their redrive policy is (re)set. Answers the URLs
/// for [`SqsQueue::new`].
#[cfg(feature = "tools")]
pub async fn ensure_queues(
    client: &Client,
    prefix: &str,
) -> Result<HashMap<QueueName, String>, QueueError> {
    validate_prefix(prefix)?;
    let mut urls = HashMap::new();
    for queue in QueueName::ALL {
        let dlq_url = create_or_update(
            client,
            &dead_letter_queue_name(prefix, queue),
            vec![(
                QueueAttributeName::MessageRetentionPeriod,
                DLQ_RETENTION_SECS.to_string(),
            )],
        )
        .await?;
        let dlq_arn = queue_arn(client, &dlq_url).await?;
        let redrive = serde_json::json!({
            "deadLetterTargetArn": dlq_arn,
            "maxReceiveCount": MAX_RECEIVE_COUNT.to_string(),
        })
        .to_string();
        let url = create_or_update(
            client,
            &queue_name(prefix, queue),
            vec![(QueueAttributeName::RedrivePolicy, redrive)],
        )
        .await?;
        urls.insert(queue, url);
    }
    Ok(urls)
}

#[cfg(feature = "tools")]
fn validate_prefix(prefix: &str) -> Result<(), QueueError> {
    let longest = QueueName::ALL
        .iter()
        .map(|&q| dead_letter_queue_name(prefix, q).len())
        .max()
        .unwrap_or(0);
    let ok = !prefix.is_empty()
        && longest <= MAX_QUEUE_NAME
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(QueueError::Invalid(format!(
            "queue prefix must be letters, digits, '-' or '_' and short enough for \
             '{{prefix}}-webhooks-dlq' to fit {MAX_QUEUE_NAME} characters, got {prefix:?}"
        )))
    }
}

/// Creates queue `name` with `attributes`; when it exists with other
/// attributes, sets them on it. Answers its URL.
#[cfg(feature = "tools")]
async fn create_or_update(
    client: &Client,
    name: &str,
    attributes: Vec<(QueueAttributeName, String)>,
) -> Result<String, QueueError> {
    let mut create = client.create_queue().queue_name(name);
    for (key, value) in &attributes {
        create = create.attributes(key.clone(), value.clone());
    }
    match create.send().await {
        Ok(out) => out.queue_url().map(str::to_owned).ok_or_else(|| {
            QueueError::Backend(format!("CreateQueue {name}: no QueueUrl in the answer"))
        }),
        Err(err) if is_queue_exists(&err) => {
            let url = client
                .get_queue_url()
                .queue_name(name)
                .send()
                .await
                .map_err(|e| sdk_error(&format!("GetQueueUrl {name}"), e))?
                .queue_url()
                .map(str::to_owned)
                .ok_or_else(|| {
                    QueueError::Backend(format!("GetQueueUrl {name}: no QueueUrl in the answer"))
                })?;
            let mut set = client.set_queue_attributes().queue_url(&url);
            for (key, value) in attributes {
                set = set.attributes(key, value);
            }
            set.send()
                .await
                .map_err(|e| sdk_error(&format!("SetQueueAttributes {name}"), e))?;
            Ok(url)
        }
        Err(err) => Err(sdk_error(&format!("CreateQueue {name}"), err)),
    }
}

#[cfg(feature = "tools")]
fn is_queue_exists(err: &SdkError<CreateQueueError>) -> bool {
    matches!(
        err.as_service_error(),
        Some(CreateQueueError::QueueNameExists(_))
    ) || matches!(err.code(), Some("QueueAlreadyExists" | "QueueNameExists"))
}

#[cfg(feature = "tools")]
async fn queue_arn(client: &Client, url: &str) -> Result<String, QueueError> {
    let out = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| sdk_error(&format!("GetQueueAttributes {url}"), e))?;
    out.attributes()
        .and_then(|attrs| attrs.get(&QueueAttributeName::QueueArn))
        .cloned()
        .ok_or_else(|| {
            QueueError::Backend(format!(
                "GetQueueAttributes {url}: no QueueArn in the answer"
            ))
        })
}

/// Whole seconds, rounded up.
fn ceil_secs(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

/// Whole seconds, rounded to the nearest, at most [`MAX_WAIT`].
#[cfg(feature = "tools")]
fn wait_secs(d: Duration) -> i32 {
    let millis = d.min(MAX_WAIT).as_millis();
    i32::try_from((millis + 500) / 1000).unwrap_or(i32::MAX)
}

#[async_trait]
impl Queue for SqsQueue {
    async fn send(
        &self,
        queue: QueueName,
        body: &str,
        delay: Duration,
    ) -> Result<String, QueueError> {
        validate_send(body, delay)?;
        let out = self
            .client()
            .send_message()
            .queue_url(self.url(queue)?)
            .message_body(body)
            .delay_seconds(ceil_secs(delay))
            .send()
            .await
            .map_err(|e| sdk_error(&format!("SendMessage {}", queue.as_str()), e))?;
        out.message_id()
            .map(str::to_owned)
            .ok_or_else(|| QueueError::Backend("SendMessage: no MessageId in the answer".into()))
    }

    #[cfg(feature = "tools")]
    async fn receive(
        &self,
        queue: QueueName,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<Message>, QueueError> {
        validate_receive(max, visibility)?;
        let out = self
            .client()
            .receive_message()
            .queue_url(self.url(queue)?)
            .max_number_of_messages(i32::try_from(max).unwrap_or(10))
            .wait_time_seconds(wait_secs(wait))
            .visibility_timeout(ceil_secs(visibility))
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .map_err(|e| sdk_error(&format!("ReceiveMessage {}", queue.as_str()), e))?;
        out.messages()
            .iter()
            .map(|m| {
                let missing = |what: &str| {
                    QueueError::Backend(format!("ReceiveMessage: a message without {what}"))
                };
                let receive_count = m
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                    .ok_or_else(|| missing("ApproximateReceiveCount"))?;
                Ok(Message {
                    id: m
                        .message_id()
                        .ok_or_else(|| missing("MessageId"))?
                        .to_owned(),
                    body: m.body().ok_or_else(|| missing("Body"))?.to_owned(),
                    receipt: m
                        .receipt_handle()
                        .ok_or_else(|| missing("ReceiptHandle"))?
                        .to_owned(),
                    receive_count: receive_count.parse().map_err(|_| {
                        QueueError::Backend(format!(
                            "ReceiveMessage: bad ApproximateReceiveCount {receive_count:?}"
                        ))
                    })?,
                })
            })
            .collect()
    }

    #[cfg(feature = "tools")]
    async fn delete(&self, queue: QueueName, receipt: &str) -> Result<(), QueueError> {
        let result = self
            .client()
            .delete_message()
            .queue_url(self.url(queue)?)
            .receipt_handle(receipt)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err)
                if matches!(
                    err.as_service_error(),
                    Some(DeleteMessageError::ReceiptHandleIsInvalid(_))
                ) =>
            {
                Err(QueueError::Invalid(format!(
                    "SQS does not accept this receipt handle: {}",
                    DisplayErrorContext(&err)
                )))
            }
            Err(err) => Err(sdk_error(&format!("DeleteMessage {}", queue.as_str()), err)),
        }
    }

    /// Deployed functions take their messages from Lambda's event source
    /// mapping and never poll; only the local gateway's workers do.
    #[cfg(not(feature = "tools"))]
    async fn receive(
        &self,
        _: QueueName,
        _: usize,
        _: Duration,
        _: Duration,
    ) -> Result<Vec<Message>, QueueError> {
        Err(not_polled())
    }

    #[cfg(not(feature = "tools"))]
    async fn delete(&self, _: QueueName, _: &str) -> Result<(), QueueError> {
        Err(not_polled())
    }
}

#[cfg(not(feature = "tools"))]
fn not_polled() -> QueueError {
    QueueError::Backend(
        "this build does not poll SQS (feature tools): Lambda's event source mapping does".into(),
    )
}

fn sdk_error<E>(op: &str, err: SdkError<E>) -> QueueError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let message = format!("{op}: {}", DisplayErrorContext(&err));
    if is_transient(&err) {
        QueueError::Unavailable(message)
    } else {
        QueueError::Backend(message)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::queue::testkit::{aws_endpoint, unique_prefix};

    async fn make() -> Option<Arc<dyn Queue>> {
        let endpoint = aws_endpoint()?;
        let client = client_for_endpoint(&endpoint, "ap-south-1");
        let urls = ensure_queues(&client, &unique_prefix()).await.unwrap();
        Some(Arc::new(SqsQueue::new(client, urls)))
    }

    /// The shared behaviour suite against `DHUKUTI_TEST_AWS_ENDPOINT`.
    mod conformance {
        use super::make;

        crate::queue_conformance_tests!(
            make,
            strict_stale_receipt = "moto 5.2.5 deletes a message on a stale receipt handle; \
                SQS documents that the request succeeds but the message is not deleted"
        );
    }

    async fn make_on_first_use() -> Option<Arc<dyn Queue>> {
        let endpoint = aws_endpoint()?;
        let client = client_for_endpoint(&endpoint, "ap-south-1");
        let urls = ensure_queues(&client, &unique_prefix()).await.unwrap();
        let queue = SqsQueue::on_first_use(client.config().clone(), urls);
        assert!(!queue.built());
        Some(Arc::new(queue))
    }

    /// The same suite with the client built on the first call.
    mod conformance_on_first_use {
        use super::make_on_first_use;

        crate::queue_conformance_tests!(
            make_on_first_use,
            strict_stale_receipt = "moto 5.2.5 deletes a message on a stale receipt handle; \
                SQS documents that the request succeeds but the message is not deleted"
        );
    }

    #[tokio::test]
    async fn a_queue_on_first_use_builds_its_client_on_the_first_send() {
        let config = client_for_endpoint("http://127.0.0.1:9", "ap-south-1")
            .config()
            .to_builder()
            .retry_config(aws_sdk_sqs::config::retry::RetryConfig::disabled())
            .build();
        let urls = HashMap::from([(
            QueueName::Sms,
            "http://127.0.0.1:9/000000000000/x-sms".to_owned(),
        )]);
        let q = SqsQueue::on_first_use(config, urls);
        assert!(!q.built());
        // Refused before SQS is asked: still no client.
        let refused = q.send(QueueName::Sms, "", Duration::ZERO).await;
        assert!(
            matches!(refused, Err(QueueError::Invalid(_))),
            "{refused:?}"
        );
        assert!(!q.built());
        let err = q.send(QueueName::Sms, "x", Duration::ZERO).await;
        assert!(matches!(err, Err(QueueError::Unavailable(_))), "{err:?}");
        assert!(q.built());
        let clone = q.clone();
        assert!(clone.built());
    }

    #[test]
    fn durations_in_whole_seconds() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1500)), 2);
        assert_eq!(ceil_secs(Duration::from_secs(900)), 900);
        assert_eq!(wait_secs(Duration::from_millis(499)), 0);
        assert_eq!(wait_secs(Duration::from_millis(500)), 1);
        assert_eq!(wait_secs(Duration::from_secs(20)), 20);
        assert_eq!(wait_secs(Duration::from_secs(3600)), 20);
    }

    #[test]
    fn prefixes() {
        assert!(validate_prefix("dhukuti-prod").is_ok());
        assert!(validate_prefix("a_b-1").is_ok());
        for bad in ["", "has space", "dots.no", &"x".repeat(80)] {
            assert!(
                matches!(validate_prefix(bad), Err(QueueError::Invalid(_))),
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn unconfigured_queue_is_a_backend_error() {
        let client = client_for_endpoint("http://127.0.0.1:9", "ap-south-1");
        let q = SqsQueue::new(client, HashMap::new());
        let err = q
            .send(QueueName::Sms, "x", Duration::ZERO)
            .await
            .unwrap_err();
        assert!(matches!(err, QueueError::Backend(_)), "{err:?}");
    }

    #[tokio::test]
    async fn unreachable_endpoint_is_unavailable() {
        // Port 9 (discard) on loopback: nothing listens, the connection is refused.
        let client = client_for_endpoint("http://127.0.0.1:9", "ap-south-1");
        let config = client
            .config()
            .to_builder()
            .retry_config(aws_sdk_sqs::config::retry::RetryConfig::disabled())
            .build();
        let client = Client::from_conf(config);
        let urls = HashMap::from([(
            QueueName::Sms,
            "http://127.0.0.1:9/000000000000/x-sms".to_owned(),
        )]);
        let q = SqsQueue::new(client, urls);
        let err = q
            .send(QueueName::Sms, "x", Duration::ZERO)
            .await
            .unwrap_err();
        assert!(matches!(err, QueueError::Unavailable(_)), "{err:?}");
    }

    #[tokio::test]
    async fn ensure_queues_is_idempotent_and_sets_up_dead_letter_queues() {
        let Some(endpoint) = aws_endpoint() else {
            return;
        };
        let client = client_for_endpoint(&endpoint, "ap-south-1");
        let prefix = unique_prefix();
        let first = ensure_queues(&client, &prefix).await.unwrap();
        let second = ensure_queues(&client, &prefix).await.unwrap();
        assert_eq!(first, second);
        assert_eq!(first.len(), QueueName::ALL.len());
        for queue in QueueName::ALL {
            let url = &first[&queue];
            assert!(url.ends_with(&queue_name(&prefix, queue)), "{url}");
            let attrs = client
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::RedrivePolicy)
                .send()
                .await
                .unwrap();
            let policy = attrs.attributes().unwrap()[&QueueAttributeName::RedrivePolicy].clone();
            let policy: serde_json::Value = serde_json::from_str(&policy).unwrap();
            let dlq_url = client
                .get_queue_url()
                .queue_name(dead_letter_queue_name(&prefix, queue))
                .send()
                .await
                .unwrap()
                .queue_url()
                .unwrap()
                .to_owned();
            let dlq_arn = queue_arn(&client, &dlq_url).await.unwrap();
            assert_eq!(policy["deadLetterTargetArn"], dlq_arn.as_str());
            let max = &policy["maxReceiveCount"];
            assert!(max == 5 || max == "5", "{policy}");
        }
    }

    #[tokio::test]
    async fn ensure_queues_rejects_a_bad_prefix() {
        let client = client_for_endpoint("http://127.0.0.1:9", "ap-south-1");
        let err = ensure_queues(&client, "no spaces").await.unwrap_err();
        assert!(matches!(err, QueueError::Invalid(_)), "{err:?}");
    }
}
