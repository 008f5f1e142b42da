//! The behaviour suite every [`Blobs`] backend passes, unchanged.
//!
//! Each case is a `pub async fn case(blobs: Arc<dyn Blobs>)` that panics on
//! failure. [`blob_conformance_tests!`](crate::blob_conformance_tests)
//! expands to one `#[tokio::test]` per case; `$make` is an async fn (or a
//! closure returning a future) yielding `Option<Arc<dyn Blobs>>` with a
//! fresh, empty store, `None` meaning "skip" (see [`aws_endpoint`]):
//!
//! ```ignore
//! async fn make() -> Option<Arc<dyn Blobs>> { Some(Arc::new(MemoryBlobs::new())) }
//! shared::blob_conformance_tests!(make);
//! ```
//!
//! S3 is strongly consistent for reads after writes, so cases read back
//! at once.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;

pub use crate::queue::testkit::aws_endpoint;

use super::{Blob, BlobError, Blobs};

/// Expands to one `#[tokio::test]` per case of [`crate::blobs::testkit`].
/// `$make` yields `Option<Arc<dyn Blobs>>` (`None` skips the case).
#[macro_export]
macro_rules! blob_conformance_tests {
    ($make:expr) => {
        $crate::blob_conformance_tests!(@cases $make;
            put_get_roundtrip,
            empty_and_large_objects,
            put_overwrites_bytes_and_content_type,
            missing_is_none,
            nested_keys_are_independent,
            invalid_keys_are_rejected,
            invalid_content_type_is_rejected,
            concurrent_puts,
            streamed_puts,
        );
    };
    (@cases $make:expr; $($case:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let made: ::std::option::Option<::std::sync::Arc<dyn $crate::blobs::Blobs>> = ($make)().await;
                let ::std::option::Option::Some(blobs) = made else { return };
                $crate::blobs::testkit::$case(blobs).await;
            }
        )+
    };
}

async fn put(blobs: &dyn Blobs, key: &str, bytes: impl Into<Bytes>, content_type: &str) {
    blobs
        .put(key, bytes.into(), content_type)
        .await
        .unwrap_or_else(|e| panic!("put {key}: {e}"));
}

async fn get(blobs: &dyn Blobs, key: &str) -> Option<Blob> {
    blobs
        .get(key)
        .await
        .unwrap_or_else(|e| panic!("get {key}: {e}"))
}

fn assert_blob(got: Option<Blob>, bytes: &[u8], content_type: &str, what: &str) {
    let Some(got) = got else {
        panic!("{what}: missing")
    };
    assert_eq!(got.content_type, content_type, "{what}: content type");
    assert!(
        got.bytes.as_ref() == bytes,
        "{what}: {} bytes back, {} put",
        got.bytes.len(),
        bytes.len()
    );
}

/// Keys the port refuses on every backend.
pub const INVALID_KEYS: &[&str] = &[
    "",
    "/absolute",
    "trailing/",
    "a//b",
    ".",
    "..",
    "../escape",
    "a/../../escape",
    "a/./b",
    "a/..",
    "back\\slash",
    "with space",
    "nul\0byte",
    "newline\n",
    "ünïcode",
    "percent%2e%2e",
    "tilde~",
];

// ---------------------------------------------------------------- cases

/// Bytes (all 256 values) and content type come back as put.
pub async fn put_get_roundtrip(blobs: Arc<dyn Blobs>) {
    let bytes: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    put(
        blobs.as_ref(),
        "invoices/oinv_01jd0000000000000000000000/v1.pdf",
        bytes.clone(),
        "application/pdf",
    )
    .await;
    let got = get(
        blobs.as_ref(),
        "invoices/oinv_01jd0000000000000000000000/v1.pdf",
    )
    .await;
    assert_blob(got, &bytes, "application/pdf", "pdf");

    let json = br#"{"a":"\u0928"}"#;
    put(
        blobs.as_ref(),
        "exports/x.json",
        &json[..],
        "application/json; charset=utf-8",
    )
    .await;
    assert_blob(
        get(blobs.as_ref(), "exports/x.json").await,
        json,
        "application/json; charset=utf-8",
        "json",
    );

    put(
        blobs.as_ref(),
        "top-level_KEY.v2",
        &b"top"[..],
        "text/plain",
    )
    .await;
    assert_blob(
        get(blobs.as_ref(), "top-level_KEY.v2").await,
        b"top",
        "text/plain",
        "top level",
    );
}

/// A zero-byte object and a multi-megabyte one round trip.
pub async fn empty_and_large_objects(blobs: Arc<dyn Blobs>) {
    put(
        blobs.as_ref(),
        "empty",
        Bytes::new(),
        "application/octet-stream",
    )
    .await;
    assert_blob(
        get(blobs.as_ref(), "empty").await,
        b"",
        "application/octet-stream",
        "empty",
    );

    let large: Vec<u8> = (0..(3 * 1024 * 1024 + 7))
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    put(
        blobs.as_ref(),
        "large/object.bin",
        large.clone(),
        "application/octet-stream",
    )
    .await;
    assert_blob(
        get(blobs.as_ref(), "large/object.bin").await,
        &large,
        "application/octet-stream",
        "large",
    );
}

/// A put replaces the bytes and the content type.
pub async fn put_overwrites_bytes_and_content_type(blobs: Arc<dyn Blobs>) {
    put(
        blobs.as_ref(),
        "doc/v1",
        &b"first version, longer"[..],
        "text/plain",
    )
    .await;
    put(blobs.as_ref(), "doc/v1", &b"second"[..], "application/json").await;
    assert_blob(
        get(blobs.as_ref(), "doc/v1").await,
        b"second",
        "application/json",
        "overwritten",
    );
}

/// A key never put is `None`, including the "folders" and children of a
/// key that exists.
pub async fn missing_is_none(blobs: Arc<dyn Blobs>) {
    assert_eq!(get(blobs.as_ref(), "never/put.pdf").await, None);
    put(
        blobs.as_ref(),
        "folder/object.pdf",
        &b"x"[..],
        "application/pdf",
    )
    .await;
    for key in [
        "folder",
        "folder/object",
        "folder/object.pdf.bak",
        "folder/object.pdf/child",
        "other/object.pdf",
    ] {
        assert_eq!(get(blobs.as_ref(), key).await, None, "{key}");
    }
}

/// Sibling keys and keys sharing a prefix hold their own objects.
pub async fn nested_keys_are_independent(blobs: Arc<dyn Blobs>) {
    let keys = [
        "inv/a/v1.pdf",
        "inv/a/v2.pdf",
        "inv/b/v1.pdf",
        "inv/a/v1.pdf.sig",
        "inv/a-v1.pdf",
    ];
    for (i, key) in keys.iter().enumerate() {
        put(
            blobs.as_ref(),
            key,
            format!("object {i}").into_bytes(),
            "text/plain",
        )
        .await;
    }
    for (i, key) in keys.iter().enumerate() {
        assert_blob(
            get(blobs.as_ref(), key).await,
            format!("object {i}").as_bytes(),
            "text/plain",
            key,
        );
    }
}

/// Invalid keys (traversal, absolute, empty segments, odd bytes, too long)
/// are [`BlobError::InvalidKey`] on put and get, and store nothing.
pub async fn invalid_keys_are_rejected(blobs: Arc<dyn Blobs>) {
    let too_long = "k".repeat(513);
    let longest = "k".repeat(512);
    let keys = INVALID_KEYS.iter().copied().chain([too_long.as_str()]);
    for key in keys {
        match blobs.put(key, Bytes::from_static(b"x"), "text/plain").await {
            Err(BlobError::InvalidKey(_)) => {}
            other => panic!("put {key:?}: expected InvalidKey, got {other:?}"),
        }
        match blobs.get(key).await {
            Err(BlobError::InvalidKey(_)) => {}
            other => panic!("get {key:?}: expected InvalidKey, got {other:?}"),
        }
    }
    for near in ["escape", "a/escape", "a/b", "absolute", "trailing"] {
        assert_eq!(get(blobs.as_ref(), near).await, None, "{near}");
    }
    put(blobs.as_ref(), &longest, &b"long key"[..], "text/plain").await;
    assert_blob(
        get(blobs.as_ref(), &longest).await,
        b"long key",
        "text/plain",
        "512-byte key",
    );
}

/// A content type that is not a header value is refused and stores nothing.
pub async fn invalid_content_type_is_rejected(blobs: Arc<dyn Blobs>) {
    for content_type in ["", "text/plain\r\nx-amz-acl: public-read", "tëxt/plain"] {
        if blobs
            .put("typed", Bytes::from_static(b"x"), content_type)
            .await
            .is_ok()
        {
            panic!("content type {content_type:?} was accepted");
        }
    }
    assert_eq!(get(blobs.as_ref(), "typed").await, None);
}

/// Concurrent puts: to distinct keys all land; to one key the last one
/// wins whole (bytes and content type of the same put).
pub async fn concurrent_puts(blobs: Arc<dyn Blobs>) {
    let distinct: Vec<_> = (0..16)
        .map(|i| {
            let blobs = Arc::clone(&blobs);
            tokio::spawn(async move {
                let key = format!("many/{i:02}.bin");
                put(
                    blobs.as_ref(),
                    &key,
                    vec![i as u8; 1000 + i],
                    &format!("application/x-{i}"),
                )
                .await;
            })
        })
        .collect();
    let same: Vec<_> = (0..8)
        .map(|i| {
            let blobs = Arc::clone(&blobs);
            tokio::spawn(async move {
                put(
                    blobs.as_ref(),
                    "contended",
                    vec![b'a' + i as u8; 64 * 1024 + i],
                    &format!("text/x-{i}"),
                )
                .await;
            })
        })
        .collect();
    for task in distinct.into_iter().chain(same) {
        task.await.unwrap();
    }
    for i in 0..16usize {
        let key = format!("many/{i:02}.bin");
        assert_blob(
            get(blobs.as_ref(), &key).await,
            &vec![i as u8; 1000 + i],
            &format!("application/x-{i}"),
            &key,
        );
    }
    let Some(winner) = get(blobs.as_ref(), "contended").await else {
        panic!("contended: missing")
    };
    let candidates: BTreeSet<usize> = (0..8).collect();
    let i = winner
        .content_type
        .strip_prefix("text/x-")
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|i| candidates.contains(i))
        .unwrap_or_else(|| {
            panic!(
                "contended: unexpected content type {:?}",
                winner.content_type
            )
        });
    assert!(
        winner.bytes.as_ref() == vec![b'a' + i as u8; 64 * 1024 + i].as_slice(),
        "contended: bytes are not those of the put with content type text/x-{i}"
    );
}

/// A streamed put stores every chunk in order (more than one multipart
/// part on S3), answers its length, and an empty stream is an empty object.
pub async fn streamed_puts(blobs: Arc<dyn Blobs>) {
    // 9 MiB in 1 MiB chunks: two parts of an S3 multipart upload.
    let chunk: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let chunks: Vec<Result<Bytes, BlobError>> =
        (0..9).map(|_| Ok(Bytes::from(chunk.clone()))).collect();
    let n = blobs
        .put_stream(
            "streams/big.csv",
            "text/csv",
            Box::pin(futures::stream::iter(chunks)),
        )
        .await
        .unwrap();
    assert_eq!(n, 9 * 1024 * 1024);
    let got = blobs.get("streams/big.csv").await.unwrap().unwrap();
    assert_eq!(got.bytes.len(), 9 * 1024 * 1024);
    assert_eq!(got.content_type, "text/csv");
    assert!(got.bytes.chunks(chunk.len()).all(|c| c == chunk.as_slice()));
    let n = blobs
        .put_stream(
            "streams/empty.csv",
            "text/csv",
            Box::pin(futures::stream::empty()),
        )
        .await
        .unwrap();
    assert_eq!(n, 0);
    let got = blobs.get("streams/empty.csv").await.unwrap().unwrap();
    assert!(got.bytes.is_empty());
}
