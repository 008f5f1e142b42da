//! [`S3Blobs`]: the blob port on Amazon S3, one bucket.
//!
//! Keys and content types are checked like on every backend before a
//! request is sent. Objects are written with `ServerSideEncryption: AES256`
//! (SSE-S3). Errors: throttling (`SlowDown`), timeouts, connection
//! failures and 5xx answers are [`BlobError::Unavailable`]; everything else
//! is [`BlobError::Backend`] with the operation and S3's message.

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
#[cfg(feature = "tools")]
use aws_sdk_s3::operation::create_bucket::CreateBucketError;
use aws_sdk_s3::operation::get_object::GetObjectError;
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::ServerSideEncryption;
#[cfg(feature = "tools")]
use aws_sdk_s3::types::{
    BucketLocationConstraint, CreateBucketConfiguration, PublicAccessBlockConfiguration,
    ServerSideEncryptionByDefault, ServerSideEncryptionConfiguration, ServerSideEncryptionRule,
};
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;
use futures::TryStreamExt;
use futures::stream::BoxStream;

use super::memory::validate_content_type;
use super::{Blob, BlobError, Blobs, rechunk, validate_key};

/// The size of a multipart upload's parts (S3 takes 5 MiB at least, the
/// last part excepted): what a streamed put holds in memory at once.
pub const PART_SIZE: usize = 8 * 1024 * 1024;
use crate::aws::is_transient;

/// The blob port on one S3 bucket.
#[derive(Clone, Debug)]
pub struct S3Blobs {
    client: Client,
    bucket: String,
}

impl S3Blobs {
    pub fn new(client: Client, bucket: impl Into<String>) -> Self {
        Self {
            client,
            bucket: bucket.into(),
        }
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }
}

/// An S3 client for `endpoint` (moto, LocalStack, MinIO, ...) in `region`,
/// path-style, with static dummy credentials: for tests and local runs only.
pub fn client_for_endpoint(endpoint: &str, region: &str) -> Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .endpoint_url(endpoint)
        .force_path_style(true)
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

/// Creates `bucket` in the client's region if it does not exist yet (one
/// this account already owns is fine), then blocks all public access and
/// sets default encryption to SSE-S3 (AES256). Idempotent.
///
/// An emulator that answers `NotImplemented` to the public access block or
/// the encryption settings is tolerated (with a warning); any other error
/// fails.
#[cfg(feature = "tools")]
pub async fn ensure_bucket(client: &Client, bucket: &str) -> Result<(), BlobError> {
    let region = client.config().region().map(|r| r.as_ref().to_owned());
    let mut create = client.create_bucket().bucket(bucket);
    // us-east-1 is the one region that takes no location constraint.
    if let Some(region) = region.filter(|r| r != "us-east-1") {
        create = create.create_bucket_configuration(
            CreateBucketConfiguration::builder()
                .location_constraint(BucketLocationConstraint::from(region.as_str()))
                .build(),
        );
    }
    match create.send().await {
        Ok(_) => {}
        Err(err)
            if matches!(
                err.as_service_error(),
                Some(CreateBucketError::BucketAlreadyOwnedByYou(_))
            ) => {}
        Err(err) => return Err(sdk_error(&format!("CreateBucket {bucket}"), err)),
    }

    let block = client
        .put_public_access_block()
        .bucket(bucket)
        .public_access_block_configuration(
            PublicAccessBlockConfiguration::builder()
                .block_public_acls(true)
                .ignore_public_acls(true)
                .block_public_policy(true)
                .restrict_public_buckets(true)
                .build(),
        )
        .send()
        .await;
    tolerate_not_implemented(&format!("PutPublicAccessBlock {bucket}"), block)?;

    let by_default = ServerSideEncryptionByDefault::builder()
        .sse_algorithm(ServerSideEncryption::Aes256)
        .build()
        .map_err(|e| BlobError::Backend(format!("default encryption: {e}")))?;
    let encryption = ServerSideEncryptionConfiguration::builder()
        .rules(
            ServerSideEncryptionRule::builder()
                .apply_server_side_encryption_by_default(by_default)
                .build(),
        )
        .build()
        .map_err(|e| BlobError::Backend(format!("default encryption: {e}")))?;
    let encrypt = client
        .put_bucket_encryption()
        .bucket(bucket)
        .server_side_encryption_configuration(encryption)
        .send()
        .await;
    tolerate_not_implemented(&format!("PutBucketEncryption {bucket}"), encrypt)?;
    Ok(())
}

#[cfg(feature = "tools")]
fn tolerate_not_implemented<T, E>(op: &str, result: Result<T, SdkError<E>>) -> Result<(), BlobError>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match result {
        Ok(_) => Ok(()),
        Err(err) if err.code() == Some("NotImplemented") => {
            tracing::warn!(
                operation = op,
                "the S3 endpoint does not implement this; skipped"
            );
            Ok(())
        }
        Err(err) => Err(sdk_error(op, err)),
    }
}

fn sdk_error<E>(op: &str, err: SdkError<E>) -> BlobError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let message = format!("{op}: {}", DisplayErrorContext(&err));
    if is_transient(&err) {
        BlobError::Unavailable(message)
    } else {
        BlobError::Backend(message)
    }
}

#[async_trait]
impl Blobs for S3Blobs {
    async fn put(&self, key: &str, bytes: Bytes, content_type: &str) -> Result<(), BlobError> {
        validate_key(key)?;
        validate_content_type(content_type)?;
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(ByteStream::from(bytes))
            .content_type(content_type)
            .server_side_encryption(ServerSideEncryption::Aes256)
            .send()
            .await
            .map_err(|e| sdk_error(&format!("PutObject {key}"), e))?;
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Blob>, BlobError> {
        validate_key(key)?;
        let out = match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => out,
            Err(err) if matches!(err.as_service_error(), Some(GetObjectError::NoSuchKey(_))) => {
                return Ok(None);
            }
            Err(err) => return Err(sdk_error(&format!("GetObject {key}"), err)),
        };
        let content_type = out
            .content_type
            .clone()
            .unwrap_or_else(|| "application/octet-stream".to_owned());
        let bytes = out
            .body
            .collect()
            .await
            .map_err(|e| {
                BlobError::Unavailable(format!(
                    "GetObject {key}: reading the body: {}",
                    DisplayErrorContext(&e)
                ))
            })?
            .into_bytes();
        Ok(Some(Blob {
            bytes,
            content_type,
        }))
    }

    /// A multipart upload of [`PART_SIZE`] parts, aborted on any failure
    /// (nothing is visible under `key` until it completes).
    async fn put_stream(
        &self,
        key: &str,
        content_type: &str,
        chunks: BoxStream<'_, Result<Bytes, BlobError>>,
    ) -> Result<u64, BlobError> {
        validate_key(key)?;
        validate_content_type(content_type)?;
        let started = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .content_type(content_type)
            .server_side_encryption(ServerSideEncryption::Aes256)
            .send()
            .await
            .map_err(|e| sdk_error(&format!("CreateMultipartUpload {key}"), e))?;
        let upload_id = started
            .upload_id
            .ok_or_else(|| BlobError::Backend(format!("CreateMultipartUpload {key}: no id")))?;
        match self.upload_parts(key, &upload_id, chunks).await {
            Ok(len) => Ok(len),
            Err(err) => {
                let aborted = self
                    .client
                    .abort_multipart_upload()
                    .bucket(&self.bucket)
                    .key(key)
                    .upload_id(&upload_id)
                    .send()
                    .await;
                if let Err(e) = aborted {
                    tracing::warn!(key, error = %DisplayErrorContext(&e), "multipart upload not aborted");
                }
                Err(err)
            }
        }
    }

    /// A presigned GET of `key`.
    async fn download_url(
        &self,
        key: &str,
        expires_in: std::time::Duration,
    ) -> Result<Option<String>, BlobError> {
        let config = presigning(key, expires_in)?;
        let request = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .presigned(config)
            .await
            .map_err(|e| sdk_error(&format!("presigning GetObject {key}"), e))?;
        Ok(Some(request.uri().to_owned()))
    }

    /// A presigned PUT of `key` (a statement upload).
    async fn upload_url(
        &self,
        key: &str,
        expires_in: std::time::Duration,
    ) -> Result<Option<String>, BlobError> {
        let config = presigning(key, expires_in)?;
        let request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .presigned(config)
            .await
            .map_err(|e| sdk_error(&format!("presigning PutObject {key}"), e))?;
        Ok(Some(request.uri().to_owned()))
    }
}

/// The presigning of `key` for `expires_in`, the key checked first (both
/// presigned GET and PUT).
fn presigning(key: &str, expires_in: std::time::Duration) -> Result<PresigningConfig, BlobError> {
    validate_key(key)?;
    PresigningConfig::expires_in(expires_in)
        .map_err(|e| BlobError::Backend(format!("presigning {key}: {e}")))
}

impl S3Blobs {
    /// The parts of a multipart upload already begun (`upload_id`), then
    /// its completion.
    async fn upload_parts(
        &self,
        key: &str,
        upload_id: &str,
        chunks: BoxStream<'_, Result<Bytes, BlobError>>,
    ) -> Result<u64, BlobError> {
        let mut parts = rechunk(chunks, PART_SIZE);
        let mut done = Vec::new();
        let mut len = 0u64;
        while let Some(part) = parts.try_next().await? {
            let number = i32::try_from(done.len() + 1)
                .map_err(|_| BlobError::Backend(format!("{key}: too many parts")))?;
            len += part.len() as u64;
            let out = self
                .client
                .upload_part()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .part_number(number)
                .body(ByteStream::from(part))
                .send()
                .await
                .map_err(|e| sdk_error(&format!("UploadPart {key} #{number}"), e))?;
            done.push(
                CompletedPart::builder()
                    .part_number(number)
                    .set_e_tag(out.e_tag)
                    .build(),
            );
        }
        if done.is_empty() {
            // S3 completes no upload of zero parts: one empty part.
            let out = self
                .client
                .upload_part()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .part_number(1)
                .body(ByteStream::from(Bytes::new()))
                .send()
                .await
                .map_err(|e| sdk_error(&format!("UploadPart {key} #1"), e))?;
            done.push(
                CompletedPart::builder()
                    .part_number(1)
                    .set_e_tag(out.e_tag)
                    .build(),
            );
        }
        self.client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(done))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| sdk_error(&format!("CompleteMultipartUpload {key}"), e))?;
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use aws_sdk_s3::types::ServerSideEncryption;
    use ulid::Ulid;

    use super::*;
    use crate::blobs::testkit::aws_endpoint;

    fn unique_bucket() -> String {
        format!("dhukuti-test-{}", Ulid::new().to_string().to_lowercase())
    }

    async fn make() -> Option<Arc<dyn Blobs>> {
        let endpoint = aws_endpoint()?;
        let client = client_for_endpoint(&endpoint, "ap-south-1");
        let bucket = unique_bucket();
        ensure_bucket(&client, &bucket).await.unwrap();
        Some(Arc::new(S3Blobs::new(client, bucket)))
    }

    mod conformance {
        use super::make;

        crate::blob_conformance_tests!(make);
    }

    #[tokio::test]
    async fn ensure_bucket_is_idempotent_private_and_encrypted() {
        let Some(endpoint) = aws_endpoint() else {
            return;
        };
        let client = client_for_endpoint(&endpoint, "ap-south-1");
        let bucket = unique_bucket();
        ensure_bucket(&client, &bucket).await.unwrap();
        ensure_bucket(&client, &bucket).await.unwrap();

        let block = client
            .get_public_access_block()
            .bucket(&bucket)
            .send()
            .await
            .unwrap();
        let block = block.public_access_block_configuration().unwrap();
        assert_eq!(block.block_public_acls(), Some(true));
        assert_eq!(block.ignore_public_acls(), Some(true));
        assert_eq!(block.block_public_policy(), Some(true));
        assert_eq!(block.restrict_public_buckets(), Some(true));

        let enc = client
            .get_bucket_encryption()
            .bucket(&bucket)
            .send()
            .await
            .unwrap();
        let rules = enc.server_side_encryption_configuration().unwrap().rules();
        let algorithm = rules[0]
            .apply_server_side_encryption_by_default()
            .unwrap()
            .sse_algorithm();
        assert_eq!(algorithm, &ServerSideEncryption::Aes256);

        let location = client
            .get_bucket_location()
            .bucket(&bucket)
            .send()
            .await
            .unwrap();
        assert_eq!(
            location.location_constraint().map(|l| l.as_str()),
            Some("ap-south-1")
        );
    }

    #[tokio::test]
    async fn objects_are_written_encrypted_with_their_content_type() {
        let Some(endpoint) = aws_endpoint() else {
            return;
        };
        let client = client_for_endpoint(&endpoint, "ap-south-1");
        let bucket = unique_bucket();
        ensure_bucket(&client, &bucket).await.unwrap();
        let blobs = S3Blobs::new(client.clone(), bucket.clone());
        blobs
            .put("a/b.pdf", Bytes::from_static(b"%PDF"), "application/pdf")
            .await
            .unwrap();
        let head = client
            .head_object()
            .bucket(&bucket)
            .key("a/b.pdf")
            .send()
            .await
            .unwrap();
        assert_eq!(
            head.server_side_encryption(),
            Some(&ServerSideEncryption::Aes256)
        );
        assert_eq!(head.content_type(), Some("application/pdf"));
    }

    #[tokio::test]
    async fn missing_bucket_is_a_backend_error() {
        let Some(endpoint) = aws_endpoint() else {
            return;
        };
        let blobs = S3Blobs::new(
            client_for_endpoint(&endpoint, "ap-south-1"),
            unique_bucket(),
        );
        let err = blobs.get("k").await.unwrap_err();
        assert!(matches!(err, BlobError::Backend(_)), "{err:?}");
        let err = blobs
            .put("k", Bytes::from_static(b"x"), "text/plain")
            .await
            .unwrap_err();
        assert!(matches!(err, BlobError::Backend(_)), "{err:?}");
    }

    #[tokio::test]
    async fn unreachable_endpoint_is_unavailable() {
        let client = client_for_endpoint("http://127.0.0.1:9", "ap-south-1");
        let config = client
            .config()
            .to_builder()
            .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
            .build();
        let blobs = S3Blobs::new(Client::from_conf(config), "dhukuti-nowhere");
        let err = blobs.get("k").await.unwrap_err();
        assert!(matches!(err, BlobError::Unavailable(_)), "{err:?}");
    }

    #[tokio::test]
    async fn invalid_requests_never_reach_s3() {
        // Nothing listens on port 9: a request sent would be Unavailable.
        let blobs = S3Blobs::new(
            client_for_endpoint("http://127.0.0.1:9", "ap-south-1"),
            "dhukuti-nowhere",
        );
        let err = blobs.get("../x").await.unwrap_err();
        assert!(matches!(err, BlobError::InvalidKey(_)), "{err:?}");
        let err = blobs.put("k", Bytes::new(), "bad\ntype").await.unwrap_err();
        assert!(matches!(err, BlobError::Backend(_)), "{err:?}");
    }
}
