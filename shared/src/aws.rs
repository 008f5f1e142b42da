//! What the AWS backends share, whichever of them a function is built with:
//! the SDK configuration and the reading of their errors (the SDKs' error
//! types are one type, from `aws-smithy-runtime-api`).

use std::time::Duration;

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_sdk_dynamodb::config::BehaviorVersion;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_types::SdkConfig;
use aws_types::region::Region;
use aws_types::sdk_config::{RetryConfig, TimeoutConfig};

/// How long a connection to an AWS endpoint may take (`aws-config`'s
/// default).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(3100);

/// The SDK configuration of this process, from the environment only: the
/// region (`AWS_REGION`, else `AWS_DEFAULT_REGION`), the credentials
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`) and
/// `endpoint` when given (moto, DynamoDB Local).
///
/// Lambda puts the function role's credentials and region in exactly these
/// variables, so this is what `aws-config`'s default chain resolves there,
/// without it: no profile files, no STS or IMDS clients built at start, a
/// tenth of a function's binary and a third of its cold start (issue 21,
/// BENCHMARKS.md §3). Elsewhere (the local gateway, `dhukuti-admin` against
/// AWS), export a profile's credentials first, for example with `aws
/// configure export-credentials --format env`. Retries (standard, 3
/// attempts) and the connect timeout are `aws-config`'s defaults.
pub fn sdk_config(endpoint: Option<&str>) -> Result<SdkConfig, String> {
    sdk_config_from(|name| std::env::var(name).ok(), endpoint)
}

/// [`sdk_config`] reading variables through `lookup`. Errors name the
/// missing variables, never a value.
pub fn sdk_config_from(
    lookup: impl Fn(&str) -> Option<String>,
    endpoint: Option<&str>,
) -> Result<SdkConfig, String> {
    let var = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
    let region = var("AWS_REGION")
        .or_else(|| var("AWS_DEFAULT_REGION"))
        .ok_or("no AWS region: set AWS_REGION")?;
    let (Some(key), Some(secret)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) else {
        return Err(
            "no AWS credentials in the environment: set AWS_ACCESS_KEY_ID and \
                    AWS_SECRET_ACCESS_KEY (Lambda sets them, with AWS_SESSION_TOKEN)"
                .into(),
        );
    };
    let credentials = Credentials::new(
        key.trim(),
        secret.trim(),
        var("AWS_SESSION_TOKEN").map(|t| t.trim().to_owned()),
        None,
        "environment",
    );
    let mut config = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.trim().to_owned()))
        .credentials_provider(SharedCredentialsProvider::new(credentials))
        .retry_config(RetryConfig::standard())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .build(),
        );
    if let Some(endpoint) = endpoint {
        config = config.endpoint_url(endpoint);
    }
    Ok(config.build())
}

/// Error codes AWS services use for "slow down" and "try again".
const TRANSIENT_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "AWS.SimpleQueueService.RequestThrottled",
    "KmsThrottled",
    "SlowDown",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "ProvisionedThroughputExceededException",
    "RequestTimeout",
    "RequestTimeoutException",
    "ServiceUnavailable",
    "InternalError",
    "InternalFailure",
];

/// Whether an AWS SDK error is worth retrying later: a timeout, a failure to
/// reach the service, throttling, or a 5xx/429 answer. Shared by the SQS
/// and S3 backends (every SDK uses the same error type).
pub fn is_transient<E: ProvideErrorMetadata>(err: &SdkError<E>) -> bool {
    match err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => true,
        SdkError::ServiceError(_) | SdkError::ResponseError(_) => {
            let status = err.raw_response().map(|r| r.status().as_u16());
            matches!(status, Some(429 | 500..=599))
                || err
                    .code()
                    .is_some_and(|code| TRANSIENT_CODES.contains(&code))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_credential_types::provider::ProvideCredentials;

    fn lookup(vars: &[(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        let vars = vars.to_vec();
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[tokio::test]
    async fn the_sdk_configuration_is_the_lambda_environment() {
        let config = match sdk_config_from(
            lookup(&[
                ("AWS_REGION", "ap-south-1"),
                ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
                ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI"),
                ("AWS_SESSION_TOKEN", "IQoJb3JpZ2lu"),
            ]),
            Some("http://127.0.0.1:5000"),
        ) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(config.region().map(|r| r.as_ref()), Some("ap-south-1"));
        assert_eq!(config.endpoint_url(), Some("http://127.0.0.1:5000"));
        assert_eq!(config.retry_config().map(|r| r.max_attempts()), Some(3));
        assert_eq!(
            config.timeout_config().and_then(|t| t.connect_timeout()),
            Some(CONNECT_TIMEOUT)
        );
        let provider = match config.credentials_provider() {
            Some(p) => p,
            None => panic!("no credentials provider"),
        };
        let creds = match provider.provide_credentials().await {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(creds.access_key_id(), "AKIDEXAMPLE");
        assert_eq!(creds.secret_access_key(), "wJalrXUtnFEMI");
        assert_eq!(creds.session_token(), Some("IQoJb3JpZ2lu"));
    }

    #[test]
    fn a_missing_region_or_credential_is_named_and_no_value_shown() {
        let no_region = sdk_config_from(
            lookup(&[
                ("AWS_ACCESS_KEY_ID", "AKID"),
                ("AWS_SECRET_ACCESS_KEY", "s3cr3t"),
            ]),
            None,
        );
        assert_eq!(
            no_region.err().as_deref(),
            Some("no AWS region: set AWS_REGION")
        );
        let fallback = sdk_config_from(
            lookup(&[
                ("AWS_DEFAULT_REGION", "us-east-1"),
                ("AWS_ACCESS_KEY_ID", "AKID"),
                ("AWS_SECRET_ACCESS_KEY", "s3cr3t"),
            ]),
            None,
        );
        assert_eq!(
            fallback
                .ok()
                .and_then(|c| c.region().map(|r| r.to_string())),
            Some("us-east-1".to_owned())
        );
        let no_secret = sdk_config_from(
            lookup(&[
                ("AWS_REGION", "ap-south-1"),
                ("AWS_ACCESS_KEY_ID", "AKIDSECRETLESS"),
            ]),
            None,
        );
        match no_secret {
            Ok(_) => panic!("configured without a secret key"),
            Err(e) => {
                assert!(e.contains("AWS_SECRET_ACCESS_KEY"), "{e}");
                assert!(!e.contains("AKIDSECRETLESS"), "{e}");
            }
        }
    }
}
