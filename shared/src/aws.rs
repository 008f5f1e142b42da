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
    match trust_from(var)? {
        Trust::Amazon => config = config.http_client(amazon_trust_client()?),
        Trust::System => {}
    }
    Ok(config.build())
}

/// Whom the SDK clients' TLS trusts (`DHUKUTI_AWS_TRUST`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trust {
    /// `amazon`, the default: the five roots every AWS endpoint chains to
    /// ([`AMAZON_ROOTS_PEM`]), and no other.
    Amazon,
    /// `system`: the platform's roots, as the SDK has them by default (an
    /// HTTPS endpoint of one's own, LocalStack, a proxy that inspects TLS,
    /// the China partitions).
    System,
}

/// The roots of every AWS service endpoint, as Amazon Trust Services
/// publishes them: Amazon Root CA 1 to 4 and Starfield Services Root
/// Certificate Authority - G2 (valid to 2037-2040).
///
/// Trusting only these means a certificate from any other authority cannot
/// stand in for DynamoDB, SQS, S3 or Secrets Manager, and the start does
/// not read and parse the platform's 140-odd roots: that was a third of a
/// function's cold start (issue 21, BENCHMARKS.md §3).
pub const AMAZON_ROOTS_PEM: &[u8] = include_bytes!("../certs/amazon-trust-services.pem");

fn trust_from(var: impl Fn(&str) -> Option<String>) -> Result<Trust, String> {
    match var("DHUKUTI_AWS_TRUST").as_deref().map(str::trim) {
        None => Ok(Trust::Amazon),
        Some(v) if v.eq_ignore_ascii_case("amazon") => Ok(Trust::Amazon),
        Some(v) if v.eq_ignore_ascii_case("system") => Ok(Trust::System),
        Some(_) => Err("DHUKUTI_AWS_TRUST must be `amazon` or `system`".into()),
    }
}

/// The SDK's own HTTPS client (hyper, rustls on aws-lc, proxies from the
/// environment, as its default client), trusting [`AMAZON_ROOTS_PEM`] only.
fn amazon_trust_client() -> Result<aws_types::sdk_config::SharedHttpClient, String> {
    use aws_smithy_http_client::proxy::ProxyConfig;
    use aws_smithy_http_client::tls::rustls_provider::CryptoMode;
    use aws_smithy_http_client::tls::{Provider, TlsContext, TrustStore};
    use aws_smithy_http_client::{Builder, ConnectorBuilder};
    let tls = TlsContext::builder()
        .with_trust_store(TrustStore::empty().with_pem_certificate(AMAZON_ROOTS_PEM))
        .build()
        .map_err(|e| format!("the AWS roots: {e}"))?;
    Ok(
        Builder::new().build_with_connector_fn(move |settings, components| {
            let mut connector = ConnectorBuilder::default()
                .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
                .tls_context(tls.clone());
            connector.set_connector_settings(settings.cloned());
            if let Some(components) = components {
                connector.set_sleep_impl(components.sleep_impl());
            }
            connector.set_proxy_config(Some(ProxyConfig::from_env()));
            connector.build()
        }),
    )
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

    const LAMBDA: &[(&str, &str)] = &[
        ("AWS_REGION", "ap-south-1"),
        ("AWS_ACCESS_KEY_ID", "AKID"),
        ("AWS_SECRET_ACCESS_KEY", "s3cr3t"),
    ];

    fn amazon_roots() -> Vec<rustls::pki_types::CertificateDer<'static>> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        match CertificateDer::pem_slice_iter(AMAZON_ROOTS_PEM).collect::<Result<Vec<_>, _>>() {
            Ok(certs) => certs,
            Err(e) => panic!("shared/certs/amazon-trust-services.pem: {e:?}"),
        }
    }

    /// The SHA-256 fingerprints Amazon Trust Services publishes
    /// (https://www.amazontrust.com/repository/).
    #[test]
    fn the_pinned_roots_are_the_five_amazon_publishes() {
        use sha2::{Digest, Sha256};
        let published = [
            "8ecde6884f3d87b1125ba31ac3fcb13d7016de7f57cc904fe1cb97c6ae98196e",
            "1ba5b2aa8c65401a82960118f80bec4f62304d83cec4713a19c39c011ea46db4",
            "18ce6cfe7bf14e60b2e347b8dfe868cb31d02ebb3ada271569f50343b46db3a4",
            "e35d28419ed02025cfa69038cd623962458da5c695fbdea3c22b0bfb25897092",
            "568d6905a2c88708a4b3025190edcfedb1974a606a13c6e5290fcb2ae63edab5",
        ];
        let certs = amazon_roots();
        let fingerprints: Vec<String> = certs
            .iter()
            .map(|c| hex::encode(Sha256::digest(c.as_ref())))
            .collect();
        assert_eq!(fingerprints, published);
        // As the SDK's client adds them (it panics on one it cannot parse).
        let mut store = rustls::RootCertStore::empty();
        for cert in certs {
            assert!(store.add(cert).is_ok());
        }
        assert_eq!(store.len(), 5);
    }

    /// Pinning narrows the platform's trust, never widens it: each root is
    /// one the platform (Mozilla's store on Debian) already trusts.
    #[test]
    fn each_pinned_root_is_one_the_platform_trusts() {
        let platform = rustls_native_certs::load_native_certs().certs;
        assert!(!platform.is_empty(), "no platform roots to compare with");
        for cert in amazon_roots() {
            assert!(platform.contains(&cert), "{cert:?} is not a platform root");
        }
    }

    #[test]
    fn the_sdk_trusts_amazons_roots_unless_told_otherwise() {
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut vars = LAMBDA.to_vec();
            vars.extend_from_slice(extra);
            sdk_config_from(lookup(&vars), None)
        };
        let pinned = |c: Result<SdkConfig, String>| c.map(|c| c.http_client().is_some());
        assert_eq!(pinned(with(&[])), Ok(true));
        assert_eq!(pinned(with(&[("DHUKUTI_AWS_TRUST", "Amazon")])), Ok(true));
        assert_eq!(pinned(with(&[("DHUKUTI_AWS_TRUST", "system")])), Ok(false));
        assert_eq!(
            pinned(with(&[("DHUKUTI_AWS_TRUST", "everyone")])),
            Err("DHUKUTI_AWS_TRUST must be `amazon` or `system`".to_owned())
        );
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
