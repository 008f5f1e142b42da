//! The blob port: S3 in AWS, a local directory on the dev server, memory in
//! tests. Keys are `/`-separated paths such as `invoices/oinv_…/v1.pdf`.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

pub mod local;
pub mod memory;
#[cfg(feature = "s3")]
pub mod s3;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

/// A stored object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blob {
    pub bytes: Bytes,
    pub content_type: String,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum BlobError {
    /// A key that is empty, absolute, has `..`/empty segments or odd bytes.
    #[error("invalid blob key: {0}")]
    InvalidKey(String),
    #[error("blob store temporarily unavailable: {0}")]
    Unavailable(String),
    #[error("blob store failure: {0}")]
    Backend(String),
}

#[async_trait]
pub trait Blobs: Send + Sync + 'static {
    /// Stores `bytes` under `key`, replacing what was there.
    async fn put(&self, key: &str, bytes: Bytes, content_type: &str) -> Result<(), BlobError>;

    /// The object under `key`, if any.
    async fn get(&self, key: &str) -> Result<Option<Blob>, BlobError>;

    /// Stores what `chunks` yields under `key`, as it comes: a streamed
    /// file (local directory), a multipart upload (S3), so a large object
    /// never sits whole in memory. Nothing is visible under `key` unless
    /// every chunk arrived (a failed chunk aborts the upload). Answers the
    /// bytes written. The default (memory, tests) collects and puts.
    async fn put_stream(
        &self,
        key: &str,
        content_type: &str,
        chunks: BoxStream<'_, Result<Bytes, BlobError>>,
    ) -> Result<u64, BlobError> {
        let parts: Vec<Bytes> = chunks.try_collect().await?;
        let all: Vec<u8> = parts.iter().flat_map(|b| b.iter().copied()).collect();
        let len = all.len() as u64;
        self.put(key, Bytes::from(all), content_type).await?;
        Ok(len)
    }

    /// A URL that downloads `key` without credentials until `expires_in`
    /// has passed (S3: a presigned GET), or `None` where the backend has
    /// none (the caller then serves the object itself, behind a link it
    /// signs: `domain::reports`).
    async fn download_url(
        &self,
        key: &str,
        expires_in: Duration,
    ) -> Result<Option<String>, BlobError> {
        let _ = (key, expires_in);
        Ok(None)
    }

    /// A URL that stores a body under `key` with a plain `PUT`, without
    /// credentials, until `expires_in` has passed (S3: a presigned PUT),
    /// or `None` where the backend has none (the caller then takes the
    /// body itself, behind a link it signs: `domain::reconciliation`).
    async fn upload_url(
        &self,
        key: &str,
        expires_in: Duration,
    ) -> Result<Option<String>, BlobError> {
        let _ = (key, expires_in);
        Ok(None)
    }
}

/// Chunks of at least `min` bytes (the last one may be shorter) out of
/// `chunks`: what a multipart upload's parts need.
pub fn rechunk(
    chunks: BoxStream<'_, Result<Bytes, BlobError>>,
    min: usize,
) -> BoxStream<'_, Result<Bytes, BlobError>> {
    let state = (chunks, Vec::<u8>::new(), false);
    futures::stream::try_unfold(state, move |(mut chunks, mut buf, done)| async move {
        if done {
            return Ok(None);
        }
        while buf.len() < min {
            match chunks.try_next().await? {
                Some(b) => buf.extend_from_slice(&b),
                None => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    return Ok(Some((Bytes::from(buf), (chunks, Vec::new(), true))));
                }
            }
        }
        Ok(Some((
            Bytes::from(buf),
            (chunks, Vec::with_capacity(min), false),
        )))
    })
    .boxed()
}

/// The blobs of a function built without a blob store (no `s3` feature):
/// every call fails, naming the missing feature. Such a function is granted
/// no S3 action in `template.yaml` either (`tests/e2e/deps.rs`).
pub struct NoBlobs;

impl NoBlobs {
    fn refuse() -> BlobError {
        BlobError::Backend("this function is built without a blob store (feature s3)".into())
    }
}

#[async_trait]
impl Blobs for NoBlobs {
    async fn put(&self, _: &str, _: Bytes, _: &str) -> Result<(), BlobError> {
        Err(Self::refuse())
    }

    async fn get(&self, _: &str) -> Result<Option<Blob>, BlobError> {
        Err(Self::refuse())
    }
}

/// Checks a key the same way on every backend, so a key that works on the
/// dev server works on S3 and never escapes the local directory.
pub fn validate_key(key: &str) -> Result<(), BlobError> {
    let ok = !key.is_empty()
        && key.len() <= 512
        && !key.starts_with('/')
        && key
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(BlobError::InvalidKey(key.chars().take(80).collect()))
    }
}
