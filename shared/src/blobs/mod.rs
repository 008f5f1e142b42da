//! The blob port: S3 in AWS, a local directory on the dev server, memory in
//! tests. Keys are `/`-separated paths such as `invoices/oinv_…/v1.pdf`.

use async_trait::async_trait;
use bytes::Bytes;

pub mod local;
pub mod memory;
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
