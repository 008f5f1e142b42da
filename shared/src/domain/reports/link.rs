//! A ready report's download link. On S3 it is a presigned GET
//! ([`crate::blobs::Blobs::download_url`]); where the blob store has none
//! (the local directory), it is `GET /exports/{id}?expires=
//! <unix seconds>&signature=<hex>`, the signature an HMAC-SHA256 of
//! `<id>\n<expires>` under a key derived from the credentials master key
//! (`CredentialsKey::derive("report-links")`): the link is the bearer, so
//! the route asks for no API key, only a signature that holds and a time
//! not past.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{Report, ReportError, ReportStatus};
use crate::Deps;
use crate::blobs::Blob;
use crate::domain::record;
use crate::ids::ReportId;
use crate::time::Timestamp;

/// How long a download link works.
pub const LINK_TTL: chrono::Duration = chrono::Duration::minutes(15);
const PURPOSE: &str = "report-links";

fn mac(deps: &Deps) -> Result<Hmac<Sha256>, ReportError> {
    let keys = deps.providers.keys().ok_or(ReportError::Unsigned)?;
    let key = keys.current().derive(PURPOSE);
    <Hmac<Sha256> as Mac>::new_from_slice(&key).map_err(|_| ReportError::Unsigned)
}

fn signed(deps: &Deps, id: &ReportId, expires: i64) -> Result<Hmac<Sha256>, ReportError> {
    let mut mac = mac(deps)?;
    mac.update(id.as_bytes());
    mac.update(b"\n");
    mac.update(expires.to_string().as_bytes());
    Ok(mac)
}

/// A link to `report`'s file (which must be ready) and when it expires.
pub async fn download_link(
    deps: &Deps,
    report: &Report,
    now: Timestamp,
) -> Result<(String, Timestamp), ReportError> {
    let expires = now.plus(LINK_TTL);
    let ttl = LINK_TTL
        .to_std()
        .unwrap_or(std::time::Duration::from_secs(900));
    if let Some(url) = deps.blobs.download_url(&report.blob_key(), ttl).await? {
        return Ok((url, expires));
    }
    let at = expires.unix_seconds();
    let signature = hex::encode(signed(deps, &report.id, at)?.finalize().into_bytes());
    let base = deps.config.base_for(None);
    Ok((
        format!(
            "{base}/exports/{}?expires={at}&signature={signature}",
            report.id
        ),
        expires,
    ))
}

/// The file behind a signed local link: refused unless the signature is
/// ours for this id and time, and the time has not passed.
pub async fn download(
    deps: &Deps,
    id: &ReportId,
    expires: &str,
    signature: &str,
    now: Timestamp,
) -> Result<Blob, ReportError> {
    let at: i64 = expires.parse().map_err(|_| ReportError::BadLink)?;
    let given = hex::decode(signature).map_err(|_| ReportError::BadLink)?;
    signed(deps, id, at)?
        .verify_slice(&given)
        .map_err(|_| ReportError::BadLink)?;
    if now.unix_seconds() >= at {
        return Err(ReportError::Expired);
    }
    let report = record::get::<Report>(&*deps.store, &Report::key(id))
        .await?
        .filter(|r| r.status == ReportStatus::Ready)
        .ok_or_else(|| ReportError::NotFound(id.clone()))?;
    deps.blobs
        .get(&report.blob_key())
        .await?
        .ok_or_else(|| ReportError::NotFound(id.clone()))
}
