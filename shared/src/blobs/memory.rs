//! [`MemoryBlobs`]: blobs in a map, for tests. Also home of the content
//! type rule every backend applies ([`validate_content_type`]).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use async_trait::async_trait;
use bytes::Bytes;

use super::{Blob, BlobError, Blobs, validate_key};

/// The longest content type accepted.
pub const MAX_CONTENT_TYPE: usize = 255;

/// A content type must be usable as an HTTP header value on S3: 1 to
/// [`MAX_CONTENT_TYPE`] printable ASCII characters (spaces allowed, not at
/// the ends). Checked the same way on every backend; a bad one is
/// [`BlobError::Backend`] (the port has no variant for it).
pub(crate) fn validate_content_type(content_type: &str) -> Result<(), BlobError> {
    let ok = !content_type.is_empty()
        && content_type.len() <= MAX_CONTENT_TYPE
        && content_type.trim() == content_type
        && content_type.bytes().all(|b| (0x20..=0x7e).contains(&b));
    if ok {
        Ok(())
    } else {
        Err(BlobError::Backend(format!(
            "invalid content type {:?}: expected 1 to {MAX_CONTENT_TYPE} printable ASCII characters",
            content_type.chars().take(80).collect::<String>()
        )))
    }
}

/// Blobs in memory. Cheap to clone; clones share the same objects.
#[derive(Clone, Debug, Default)]
pub struct MemoryBlobs {
    objects: Arc<RwLock<HashMap<String, Blob>>>,
}

impl MemoryBlobs {
    pub fn new() -> Self {
        Self::default()
    }

    /// How many objects are stored.
    pub fn len(&self) -> usize {
        self.objects
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no object is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl Blobs for MemoryBlobs {
    async fn put(&self, key: &str, bytes: Bytes, content_type: &str) -> Result<(), BlobError> {
        validate_key(key)?;
        validate_content_type(content_type)?;
        let blob = Blob {
            bytes,
            content_type: content_type.to_owned(),
        };
        self.objects
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.to_owned(), blob);
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Blob>, BlobError> {
        validate_key(key)?;
        Ok(self
            .objects
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn roundtrip_overwrite_and_missing() {
        let blobs = MemoryBlobs::new();
        assert_eq!(blobs.get("a/b.pdf").await.unwrap(), None);
        blobs
            .put("a/b.pdf", Bytes::from_static(b"%PDF-1"), "application/pdf")
            .await
            .unwrap();
        blobs
            .put("a/b.pdf", Bytes::from_static(b"{}"), "application/json")
            .await
            .unwrap();
        let got = blobs.get("a/b.pdf").await.unwrap().unwrap();
        assert_eq!(
            (got.bytes.as_ref(), got.content_type.as_str()),
            (&b"{}"[..], "application/json")
        );
        assert_eq!(blobs.len(), 1);
        assert_eq!(blobs.clone().get("a/b.pdf").await.unwrap(), Some(got));
    }

    #[tokio::test]
    async fn invalid_keys_store_nothing() {
        let blobs = MemoryBlobs::new();
        for key in ["", "/a", "a/../b", "a//b", "./a", "a b", "ü"] {
            let err = blobs
                .put(key, Bytes::new(), "text/plain")
                .await
                .unwrap_err();
            assert!(matches!(err, BlobError::InvalidKey(_)), "{key:?}: {err:?}");
        }
        assert!(blobs.is_empty());
    }

    #[test]
    fn content_types() {
        for ok in ["application/pdf", "text/plain; charset=utf-8", "x"] {
            assert!(validate_content_type(ok).is_ok(), "{ok:?}");
        }
        let long = "a".repeat(MAX_CONTENT_TYPE + 1);
        for bad in [
            "",
            " text/plain",
            "text/plain\n",
            "a\rb",
            "tëxt",
            long.as_str(),
        ] {
            assert!(
                matches!(validate_content_type(bad), Err(BlobError::Backend(_))),
                "{bad:?}"
            );
        }
    }

    mod conformance {
        use std::sync::Arc;

        use crate::blobs::Blobs;
        use crate::blobs::memory::MemoryBlobs;

        async fn make() -> Option<Arc<dyn Blobs>> {
            Some(Arc::new(MemoryBlobs::new()))
        }

        crate::blob_conformance_tests!(make);
    }
}
