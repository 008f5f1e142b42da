//! Statement files going up: `POST /v1/reconciliation/uploads` gives a
//! short-lived URL the merchant `PUT`s the file to (S3: a presigned PUT,
//! since a Lambda request cannot carry a large body; the local blob
//! directory: `PUT /statement-uploads/{id}?expires=…&signature=…` on the
//! gateway, signed like the export links with a key derived from the
//! credentials master key). The run then reads the blob by the upload's
//! id.
//!
//! Stored at `STU#<id>` / `STU`; the file is the blob
//! `statements/<project>/<id>`.

use chrono::NaiveDate;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::runs::RunError;
use crate::Deps;
use crate::domain::record::{self, Record};
use crate::domain::{Mode, Provider, Tenant};
use crate::ids::{ProjectId, StatementUploadId};
use crate::keys;
use crate::refusal::Refusal;
use crate::store::{Key, StoreError};
use crate::time::Timestamp;

pub use super::statements::MAX_BYTES;
/// How long an upload URL works.
pub const UPLOAD_TTL: chrono::Duration = chrono::Duration::minutes(15);
const PURPOSE: &str = "statement-uploads";

/// A stored upload slot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatementUpload {
    pub id: StatementUploadId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub provider: Provider,
    /// The Nepal day it is for, `YYYY-MM-DD`.
    pub day: String,
    pub expires_at: Timestamp,
    pub created_at: Timestamp,
}

impl StatementUpload {
    pub fn key(id: &StatementUploadId) -> Key {
        keys::statement_upload(id)
    }

    pub fn blob_key(&self) -> String {
        format!("statements/{}/{}", self.project_id, self.id)
    }
}

impl Record for StatementUpload {
    fn item_key(&self) -> Key {
        StatementUpload::key(&self.id)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("this upload link is not valid")]
    BadLink,
    #[error("this upload link has expired; ask POST /v1/reconciliation/uploads for another")]
    Expired,
    #[error("the file is over the limit of {MAX_BYTES} bytes")]
    TooLarge,
    #[error("no key to sign upload links with (the credentials master key)")]
    Unsigned,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("blob store: {0}")]
    Blobs(#[from] crate::blobs::BlobError),
}

impl From<UploadError> for Refusal {
    fn from(err: UploadError) -> Self {
        match err {
            e @ UploadError::BadLink => Refusal::forbidden("upload_link_invalid", e.to_string()),
            e @ UploadError::Expired => Refusal::forbidden("upload_link_expired", e.to_string()),
            e @ UploadError::TooLarge => Refusal::invalid("file", e.to_string()),
            e @ UploadError::Unsigned => Refusal::internal(&e),
            UploadError::Store(e) => e.into(),
            UploadError::Blobs(e) => Refusal::unavailable(&e),
        }
    }
}

fn signed(deps: &Deps, id: &StatementUploadId, expires: i64) -> Result<Hmac<Sha256>, UploadError> {
    let keys = deps.providers.keys().ok_or(UploadError::Unsigned)?;
    let key = keys.current().derive(PURPOSE);
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key).map_err(|_| UploadError::Unsigned)?;
    mac.update(id.as_bytes());
    mac.update(b"\n");
    mac.update(expires.to_string().as_bytes());
    Ok(mac)
}

/// A new upload slot for `tenant`'s statement of `provider` on `day`,
/// and the URL to `PUT` the file to.
pub async fn create(
    deps: &Deps,
    tenant: &Tenant,
    provider: Provider,
    day: NaiveDate,
    now: Timestamp,
) -> Result<(StatementUpload, String), UploadError> {
    let upload = StatementUpload {
        id: StatementUploadId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        provider,
        day: day.format("%Y-%m-%d").to_string(),
        expires_at: now.plus(UPLOAD_TTL),
        created_at: now,
    };
    let ttl = UPLOAD_TTL
        .to_std()
        .unwrap_or(std::time::Duration::from_secs(900));
    let url = match deps.blobs.upload_url(&upload.blob_key(), ttl).await? {
        Some(url) => url,
        None => {
            let at = upload.expires_at.unix_seconds();
            let signature = hex::encode(signed(deps, &upload.id, at)?.finalize().into_bytes());
            let base = deps.config.base_for(None);
            format!(
                "{base}/statement-uploads/{}?expires={at}&signature={signature}",
                upload.id
            )
        }
    };
    deps.store.transact(vec![upload.put_new()?]).await?;
    Ok((upload, url))
}

/// Takes the file `PUT` to a signed local link: refused unless the
/// signature is ours for this id and time, the time has not passed, and
/// the file is within [`MAX_BYTES`].
pub async fn receive(
    deps: &Deps,
    id: &StatementUploadId,
    expires: &str,
    signature: &str,
    bytes: bytes::Bytes,
    now: Timestamp,
) -> Result<(), UploadError> {
    let at: i64 = expires.parse().map_err(|_| UploadError::BadLink)?;
    let given = hex::decode(signature).map_err(|_| UploadError::BadLink)?;
    signed(deps, id, at)?
        .verify_slice(&given)
        .map_err(|_| UploadError::BadLink)?;
    if now.unix_seconds() >= at {
        return Err(UploadError::Expired);
    }
    if bytes.len() > MAX_BYTES {
        return Err(UploadError::TooLarge);
    }
    let upload = record::get::<StatementUpload>(&*deps.store, &StatementUpload::key(id))
        .await?
        .ok_or(UploadError::BadLink)?;
    deps.blobs
        .put(&upload.blob_key(), bytes, "application/octet-stream")
        .await?;
    Ok(())
}

/// The file uploaded to `tenant`'s slot `id` for `provider` and `day`:
/// refused (naming `uploadId`) when the slot is another's, for another
/// provider or day, or empty; naming `file` when over the limit.
pub async fn file_of(
    deps: &Deps,
    tenant: &Tenant,
    id: &StatementUploadId,
    provider: Provider,
    day: NaiveDate,
) -> Result<Vec<u8>, RunError> {
    let nope = |m: &str| RunError::Field("uploadId", m.to_owned());
    let upload = record::get::<StatementUpload>(&*deps.store, &StatementUpload::key(id))
        .await?
        .filter(|u| tenant.owns(u.project_id.as_str(), u.mode))
        .ok_or_else(|| nope("no such upload"))?;
    if upload.provider != provider || upload.day != day.format("%Y-%m-%d").to_string() {
        return Err(nope(&format!(
            "this upload is for {} on {}",
            upload.provider.as_str(),
            upload.day
        )));
    }
    let blob = deps
        .blobs
        .get(&upload.blob_key())
        .await
        .map_err(|e| RunError::Provider2(format!("blob store: {e}")))?
        .ok_or_else(|| nope("nothing was uploaded to this upload's URL yet"))?;
    if blob.bytes.len() > MAX_BYTES {
        return Err(RunError::File(format!(
            "the file is over the limit of {MAX_BYTES} bytes"
        )));
    }
    Ok(blob.bytes.to_vec())
}
