//! The blob port: S3 in AWS, a local directory on the dev server, memory in
//! tests. Keys are `/`-separated paths such as `invoices/oinv_…/v1.pdf`.

use async_trait::async_trait;
use bytes::Bytes;

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
