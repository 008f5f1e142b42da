//! [`LocalDirBlobs`]: blobs in a directory, for the dev server.
//!
//! The object under key `invoices/oinv_1/v1.pdf` is the file
//! `<root>/invoices/oinv_1/v1.pdf`. Keys pass [`validate_key`] first, so a
//! path never leaves `<root>`. Each file holds a one-line header with the
//! content type, then the bytes:
//!
//! ```text
//! dhukuti-blob/1 application/pdf\n<bytes>
//! ```
//!
//! so the type and the bytes are replaced together. A put writes a
//! temporary file next to the target (named `.~tmp-<ulid>`: `~` is not a
//! key character, so it never shadows an object), syncs it and renames it
//! over the target: a reader sees the old object or the new one, never a
//! mix, even across processes.
//!
//! A key segment longer than [`MAX_SEGMENT`] bytes (file names stop at 255)
//! is stored as its first 100 bytes, `~` and the SHA-256 of the whole
//! segment in hex; `~` never occurs in a key, so this cannot collide.
//!
//! Unlike S3, a key cannot be both an object and a "folder" of other
//! objects (`a` and `a/b`): the second put fails with
//! [`BlobError::Backend`].

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;
use futures::stream::BoxStream;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use ulid::Ulid;

use super::memory::validate_content_type;
use super::{Blob, BlobError, Blobs, validate_key};

const MAGIC: &[u8] = b"dhukuti-blob/1 ";
/// The longest key segment used as a file name as is.
pub const MAX_SEGMENT: usize = 200;

/// Blobs under a local directory (created on the first put).
#[derive(Clone, Debug)]
pub struct LocalDirBlobs {
    root: PathBuf,
}

impl LocalDirBlobs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file of `key`, which must be valid.
    fn path(&self, key: &str) -> Result<PathBuf, BlobError> {
        validate_key(key)?;
        let mut path = self.root.clone();
        // Segment by segment: every one is a plain ASCII name (validate_key).
        for segment in key.split('/') {
            if segment.len() <= MAX_SEGMENT {
                path.push(segment);
            } else {
                let digest = hex::encode(Sha256::digest(segment.as_bytes()));
                path.push(format!("{}~{digest}", &segment[..100]));
            }
        }
        Ok(path)
    }
}

fn backend(what: &str, path: &Path, err: std::io::Error) -> BlobError {
    BlobError::Backend(format!("{what} {}: {err}", path.display()))
}

fn encode(content_type: &str, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + content_type.len() + 1 + bytes.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(content_type.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(bytes);
    out
}

fn decode(mut file: Vec<u8>) -> Option<Blob> {
    let rest = file.strip_prefix(MAGIC)?;
    let newline = rest.iter().position(|&b| b == b'\n')?;
    let content_type = std::str::from_utf8(&rest[..newline]).ok()?.to_owned();
    let start = MAGIC.len() + newline + 1;
    let bytes = Bytes::from(file.split_off(start));
    Some(Blob {
        bytes,
        content_type,
    })
}

async fn write_new(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .await?;
    file.write_all(data).await?;
    file.sync_all().await
}

#[async_trait]
impl Blobs for LocalDirBlobs {
    async fn put(&self, key: &str, bytes: Bytes, content_type: &str) -> Result<(), BlobError> {
        let path = self.path(key)?;
        validate_content_type(content_type)?;
        let dir = path.parent().unwrap_or(&self.root);
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| backend("cannot create directory", dir, e))?;
        let tmp = dir.join(format!(".~tmp-{}", Ulid::new()));
        if let Err(err) = write_new(&tmp, &encode(content_type, &bytes)).await {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(backend("cannot write", &tmp, err));
        }
        if let Err(err) = tokio::fs::rename(&tmp, &path).await {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(backend("cannot replace", &path, err));
        }
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Blob>, BlobError> {
        let path = self.path(key)?;
        match tokio::fs::read(&path).await {
            Ok(file) => decode(file)
                .map(Some)
                .ok_or_else(|| BlobError::Backend(format!("not a blob file: {}", path.display()))),
            // No such file, or `key` names a "folder" or goes through an object.
            Err(err)
                if matches!(
                    err.kind(),
                    ErrorKind::NotFound | ErrorKind::IsADirectory | ErrorKind::NotADirectory
                ) =>
            {
                Ok(None)
            }
            Err(err) => Err(backend("cannot read", &path, err)),
        }
    }

    /// Appends each chunk to a temporary file next to the target, then
    /// syncs and renames it over the target, as [`Blobs::put`] does.
    async fn put_stream(
        &self,
        key: &str,
        content_type: &str,
        mut chunks: BoxStream<'_, Result<Bytes, BlobError>>,
    ) -> Result<u64, BlobError> {
        let path = self.path(key)?;
        validate_content_type(content_type)?;
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| backend("cannot create directory", &dir, e))?;
        let tmp = dir.join(format!(".~tmp-{}", Ulid::new()));
        let written = async {
            let mut file = tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .await
                .map_err(|e| backend("cannot write", &tmp, e))?;
            file.write_all(&encode(content_type, &[]))
                .await
                .map_err(|e| backend("cannot write", &tmp, e))?;
            let mut len = 0u64;
            while let Some(chunk) = chunks.try_next().await? {
                file.write_all(&chunk)
                    .await
                    .map_err(|e| backend("cannot write", &tmp, e))?;
                len += chunk.len() as u64;
            }
            file.sync_all()
                .await
                .map_err(|e| backend("cannot write", &tmp, e))?;
            Ok::<u64, BlobError>(len)
        }
        .await;
        let len = match written {
            Ok(len) => len,
            Err(err) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(err);
            }
        };
        if let Err(err) = tokio::fs::rename(&tmp, &path).await {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(backend("cannot replace", &path, err));
        }
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn files_live_under_the_root_with_a_header() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalDirBlobs::new(dir.path().join("blobs"));
        assert_eq!(blobs.get("invoices/x/v1.pdf").await.unwrap(), None);
        blobs
            .put(
                "invoices/x/v1.pdf",
                Bytes::from_static(b"%PDF-1.7\n..."),
                "application/pdf",
            )
            .await
            .unwrap();
        let file = std::fs::read(dir.path().join("blobs/invoices/x/v1.pdf")).unwrap();
        assert_eq!(file, b"dhukuti-blob/1 application/pdf\n%PDF-1.7\n...");
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("blobs/invoices/x"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["v1.pdf"]);
    }

    #[tokio::test]
    async fn path_traversal_never_touches_the_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let blobs = LocalDirBlobs::new(&root);
        std::fs::write(
            dir.path().join("secret"),
            b"dhukuti-blob/1 text/plain\nsecret",
        )
        .unwrap();
        for key in [
            "../secret",
            "a/../../secret",
            "/etc/passwd",
            "..",
            "a/..",
            "./secret",
            "a\\..\\secret",
        ] {
            let err = blobs.get(key).await.unwrap_err();
            assert!(matches!(err, BlobError::InvalidKey(_)), "{key:?}: {err:?}");
            let err = blobs
                .put(key, Bytes::from_static(b"x"), "text/plain")
                .await
                .unwrap_err();
            assert!(matches!(err, BlobError::InvalidKey(_)), "{key:?}: {err:?}");
        }
        assert!(!root.exists(), "nothing was created");
        assert_eq!(
            std::fs::read(dir.path().join("secret")).unwrap(),
            b"dhukuti-blob/1 text/plain\nsecret"
        );
    }

    #[tokio::test]
    async fn long_segments_get_short_file_names() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalDirBlobs::new(dir.path());
        let long_a = format!("{}a", "k".repeat(300));
        let long_b = format!("{}b", "k".repeat(300));
        let exact = "k".repeat(MAX_SEGMENT);
        for (i, key) in [&long_a, &long_b, &exact].into_iter().enumerate() {
            blobs
                .put(
                    &format!("d/{key}"),
                    Bytes::from(vec![i as u8]),
                    "text/plain",
                )
                .await
                .unwrap();
        }
        for (i, key) in [&long_a, &long_b, &exact].into_iter().enumerate() {
            let got = blobs.get(&format!("d/{key}")).await.unwrap().unwrap();
            assert_eq!(got.bytes.as_ref(), [i as u8]);
        }
        assert!(dir.path().join("d").join(&exact).is_file());
        let names: Vec<String> = std::fs::read_dir(dir.path().join("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 3);
        assert!(names.iter().all(|n| n.len() <= MAX_SEGMENT), "{names:?}");
    }

    #[tokio::test]
    async fn a_streamed_put_is_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalDirBlobs::new(dir.path());
        let chunks = futures::stream::iter(vec![
            Ok(Bytes::from_static(b"a,b\n")),
            Ok(Bytes::from_static(b"1,2\n")),
        ]);
        let n = blobs
            .put_stream("r/x.csv", "text/csv", Box::pin(chunks))
            .await
            .unwrap();
        assert_eq!(n, 8);
        let got = blobs.get("r/x.csv").await.unwrap().unwrap();
        assert_eq!(got.bytes.as_ref(), b"a,b\n1,2\n");
        assert_eq!(got.content_type, "text/csv");
        // A failed chunk leaves nothing, not even a temporary file.
        let chunks = futures::stream::iter(vec![
            Ok(Bytes::from_static(b"a,b\n")),
            Err(BlobError::Unavailable("gone".into())),
        ]);
        let err = blobs
            .put_stream("r/y.csv", "text/csv", Box::pin(chunks))
            .await
            .unwrap_err();
        assert!(matches!(err, BlobError::Unavailable(_)), "{err:?}");
        assert_eq!(blobs.get("r/y.csv").await.unwrap(), None);
        let names: Vec<_> = std::fs::read_dir(dir.path().join("r"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["x.csv"]);
    }

    #[tokio::test]
    async fn a_foreign_file_is_a_backend_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plain.txt"), b"hello").unwrap();
        let blobs = LocalDirBlobs::new(dir.path());
        let err = blobs.get("plain.txt").await.unwrap_err();
        assert!(matches!(err, BlobError::Backend(_)), "{err:?}");
    }

    #[tokio::test]
    async fn object_and_folder_under_one_key_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalDirBlobs::new(dir.path());
        blobs
            .put("a", Bytes::from_static(b"1"), "text/plain")
            .await
            .unwrap();
        let err = blobs
            .put("a/b", Bytes::from_static(b"2"), "text/plain")
            .await
            .unwrap_err();
        assert!(matches!(err, BlobError::Backend(_)), "{err:?}");
        assert_eq!(blobs.get("a/b").await.unwrap(), None);
        blobs
            .put("c/d", Bytes::from_static(b"3"), "text/plain")
            .await
            .unwrap();
        let err = blobs
            .put("c", Bytes::from_static(b"4"), "text/plain")
            .await
            .unwrap_err();
        assert!(matches!(err, BlobError::Backend(_)), "{err:?}");
        assert_eq!(blobs.get("c").await.unwrap(), None);
        assert_eq!(
            blobs.get("c/d").await.unwrap().unwrap().bytes.as_ref(),
            b"3"
        );
    }

    #[tokio::test]
    async fn content_type_with_a_newline_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalDirBlobs::new(dir.path());
        let err = blobs
            .put("k", Bytes::from_static(b"x"), "text/plain\nx")
            .await
            .unwrap_err();
        assert!(matches!(err, BlobError::Backend(_)), "{err:?}");
        assert_eq!(blobs.get("k").await.unwrap(), None);
    }

    /// A [`LocalDirBlobs`] that owns its temporary directory.
    struct TempDirBlobs {
        blobs: LocalDirBlobs,
        _dir: tempfile::TempDir,
    }

    #[async_trait]
    impl Blobs for TempDirBlobs {
        async fn put(&self, key: &str, bytes: Bytes, content_type: &str) -> Result<(), BlobError> {
            self.blobs.put(key, bytes, content_type).await
        }

        async fn get(&self, key: &str) -> Result<Option<Blob>, BlobError> {
            self.blobs.get(key).await
        }
    }

    async fn make() -> Option<Arc<dyn Blobs>> {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalDirBlobs::new(dir.path().join("blobs"));
        Some(Arc::new(TempDirBlobs { blobs, _dir: dir }))
    }

    mod conformance {
        use super::make;

        crate::blob_conformance_tests!(make);
    }
}
