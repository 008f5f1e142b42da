//! Offset pagination: `limit` 1..=100 (default per list), `offset` >= 0
//! (any: every record stays reachable by offset, as the contract says);
//! lists answer `{data, meta: {total, limit, offset}}`, newest first.
//!
//! A deep offset is located from the lists' per-day counters (DynamoDB
//! has no skip), kept per list and per filter value; every list also
//! takes `starting_after` (our extension,
//! documented in `docs/api.md`): the id of a record of the list, the page
//! then holds the records after it, at the cost of the page alone
//! whatever its depth; `offset` then counts from there. See "Deep pages"
//! in `docs/decisions-refined.md`.

use serde::Serialize;

use super::error::ApiError;
use super::input::QueryParams;
use shared::domain::listing::{self, ListFilter};
use shared::domain::{Provider, Window};
use shared::ids::IdKind;
use shared::store::Seek;
use shared::time::Timestamp;

pub const MAX_LIMIT: usize = 100;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pagination {
    pub limit: usize,
    pub offset: usize,
    /// Where the page starts: the list's start, or after `starting_after`.
    pub seek: Seek,
}

impl Pagination {
    /// The records of the list this page holds.
    pub fn window(&self) -> Window {
        Window {
            offset: self.offset,
            limit: self.limit,
            seek: self.seek.clone(),
        }
    }

    /// `limit`, `offset` and `starting_after` (an id of `list`'s kind: the
    /// sort key of every list is its records' id).
    pub fn from_query(
        q: &QueryParams,
        default_limit: usize,
        list: IdKind,
    ) -> Result<Self, ApiError> {
        let limit = match q.get("limit") {
            None => default_limit,
            Some(raw) => match raw.trim().parse::<i64>() {
                Ok(n) if (1..=MAX_LIMIT as i64).contains(&n) => n as usize,
                _ => {
                    return Err(ApiError::validation(
                        "limit",
                        format!("limit must be an integer from 1 to {MAX_LIMIT}, got '{raw}'"),
                    ));
                }
            },
        };
        let offset = match q.get("offset") {
            None => 0,
            // The document's `offset` is an int64: 0..=i64::MAX. Past the
            // end of any list is an empty page; past int64 is a 400.
            Some(raw) => match raw.trim().parse::<i64>() {
                Ok(n) if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
                _ => {
                    return Err(ApiError::validation(
                        "offset",
                        format!("offset must be an integer >= 0, got '{raw}'"),
                    ));
                }
            },
        };
        let seek = match q.get("starting_after") {
            None => Seek::Start,
            Some(raw) if shared::ids::is_valid(raw, list) => Seek::After(raw.to_owned()),
            Some(raw) => {
                return Err(ApiError::validation(
                    "starting_after",
                    format!(
                        "starting_after must be the id of a record of this list ({}…), got '{raw}'",
                        list.prefix()
                    ),
                ));
            }
        };
        Ok(Pagination {
            limit,
            offset,
            seek,
        })
    }
}

/// `limit` and `offset` as the document shows them ([`Pagination::from_query`]
/// reads them; its bounds are these).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct PageParams {
    /// Records per page; each list names its default.
    #[param(minimum = 1, maximum = 100)]
    limit: Option<u32>,
    /// Records to skip (from `starting_after` when given). Any offset
    /// costs about the same: past 100 the page is located from the list's
    /// per-day counters (each filter value has its own), then read from
    /// that day.
    #[param(minimum = 0)]
    offset: Option<u64>,
    /// Extension: the id of a record of this list; the page holds the
    /// records after it (older, lists being newest first). Pass the last
    /// id of a page to read the next one at the cost of one page.
    starting_after: Option<String>,
}

/// The filters of `GET /v1/payments` and `GET /v1/refunds` (our
/// extension, `docs/api.md`): `createdFrom` (inclusive) and `createdTo`
/// (exclusive), each an RFC 3339 instant (any offset) or a date
/// `YYYY-MM-DD` (its 00:00 UTC); `status`, one of `S`'s names;
/// `provider`, `esewa`, `khalti` or `fonepay`. Anything else is a 400
/// naming the parameter. Served by the lists' indexes
/// (`shared::domain::listing`).
pub fn list_filter<S>(q: &QueryParams) -> Result<ListFilter, ApiError>
where
    S: serde::Serialize + serde::de::DeserializeOwned + AllStatuses,
{
    let instant = |name: &str| -> Result<Option<Timestamp>, ApiError> {
        let Some(raw) = q.get(name) else {
            return Ok(None);
        };
        parse_instant(raw.trim()).map(Some).ok_or_else(|| {
            ApiError::validation(
                name,
                format!(
                    "{name} must be an ISO 8601 instant (2026-11-01T00:00:00Z, \
                     2026-11-01T05:45:00+05:45) or a date (2026-11-01, its 00:00 UTC), got '{raw}'"
                ),
            )
        })
    };
    let from = instant("createdFrom")?;
    let to = instant("createdTo")?;
    if let (Some(f), Some(t)) = (from, to) {
        if t <= f {
            return Err(ApiError::validation(
                "createdTo",
                "createdTo must be after createdFrom (the range is [createdFrom, createdTo))",
            ));
        }
    }
    let status = match q.get("status") {
        None => None,
        Some(raw) => {
            let parsed: Option<S> =
                serde_json::from_value(serde_json::Value::String(raw.trim().to_owned())).ok();
            match parsed {
                Some(s) => Some(listing::status_name(&s)),
                None => {
                    return Err(ApiError::validation(
                        "status",
                        format!(
                            "status must be one of {}, got '{raw}'",
                            S::all_names().join(", ")
                        ),
                    ));
                }
            }
        }
    };
    let provider = match q.get("provider") {
        None => None,
        Some(raw) => match Provider::parse(raw.trim()) {
            Some(p) => Some(p),
            None => {
                return Err(ApiError::validation(
                    "provider",
                    format!("provider must be one of esewa, khalti, fonepay, got '{raw}'"),
                ));
            }
        },
    };
    Ok(ListFilter {
        status,
        provider,
        from,
        to,
    })
}

/// Every status a list's records may have, by name (for messages).
pub trait AllStatuses {
    fn all_names() -> Vec<String>;
}

impl AllStatuses for shared::domain::payments::PaymentStatus {
    fn all_names() -> Vec<String> {
        use shared::domain::payments::PaymentStatus as S;
        [
            S::Pending,
            S::Processing,
            S::Success,
            S::Failed,
            S::Refunded,
            S::Cancelled,
        ]
        .iter()
        .map(listing::status_name)
        .collect()
    }
}

impl AllStatuses for shared::domain::refunds::RefundStatus {
    fn all_names() -> Vec<String> {
        use shared::domain::refunds::RefundStatus as S;
        [S::Processing, S::Succeeded, S::Failed, S::RequiresAction]
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect()
    }
}

/// An RFC 3339 instant, or a date (its 00:00 UTC).
fn parse_instant(raw: &str) -> Option<Timestamp> {
    if let Some(t) = Timestamp::parse(raw) {
        return Some(t);
    }
    let date = chrono::NaiveDate::parse_from_str(raw, "%Y-%m-%d").ok()?;
    // Exactly the ten characters of a date (chrono accepts `2026-1-1`).
    if raw.len() != 10 {
        return None;
    }
    let midnight = date.and_hms_opt(0, 0, 0)?.and_utc();
    Some(Timestamp::from_datetime(midnight))
}

/// The filters as the document shows them ([`list_filter`] reads them).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct FilterParams {
    /// Extension: created at or after this instant (RFC 3339, any
    /// offset; or a date `YYYY-MM-DD`, its 00:00 UTC).
    created_from: Option<String>,
    /// Extension: created before this instant (exclusive; same forms).
    created_to: Option<String>,
    /// Extension: only records with this status.
    status: Option<String>,
    /// Extension: only records of this provider (a refund's is its
    /// payment's): `esewa`, `khalti` or `fonepay`.
    provider: Option<String>,
}

/// The page's place in the whole list.
#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Meta {
    /// Records matching the query in all pages.
    pub total: u64,
    pub limit: usize,
    pub offset: usize,
}

/// One page of a list answer.
#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Page<T> {
    pub data: Vec<T>,
    pub meta: Meta,
}

impl<T> Page<T> {
    pub fn new(data: Vec<T>, total: u64, p: Pagination) -> Self {
        Page {
            data,
            meta: Meta {
                total,
                limit: p.limit,
                offset: p.offset,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(q: &str) -> Result<Pagination, ApiError> {
        Pagination::from_query(&QueryParams::parse(Some(q)), 25, IdKind::Payment)
    }

    #[test]
    fn defaults_apply_when_absent() {
        assert_eq!(
            parse(""),
            Ok(Pagination {
                limit: 25,
                offset: 0,
                seek: Seek::Start,
            })
        );
        assert_eq!(
            Pagination::from_query(&QueryParams::default(), 10, IdKind::Payment),
            Ok(Pagination {
                limit: 10,
                offset: 0,
                seek: Seek::Start,
            })
        );
    }

    #[test]
    fn bounds_are_inclusive() {
        assert_eq!(parse("limit=1&offset=0").map(|p| p.limit), Ok(1));
        assert_eq!(parse("limit=100").map(|p| p.limit), Ok(100));
        assert_eq!(parse("offset=10000").map(|p| p.offset), Ok(10000));
    }

    /// The contract allows any offset >= 0: a deep one is a page (empty
    /// past the end), never a refusal (main refused past 10,000).
    #[test]
    fn any_offset_is_a_page() {
        assert_eq!(parse("offset=10001").map(|p| p.offset), Ok(10001));
        assert_eq!(parse("offset=5000000").map(|p| p.offset), Ok(5_000_000));
        assert_eq!(
            parse("offset=9223372036854775807").map(|p| p.offset > 10_000),
            Ok(true)
        );
    }

    /// The document types `offset` as an int64: beyond it is bad input.
    #[test]
    fn an_offset_past_int64_is_refused() {
        assert!(parse("offset=9223372036854775808").is_err());
        assert!(parse("offset=18446744073709551615").is_err());
    }

    #[test]
    fn starting_after_seeks_past_a_record_of_the_list() {
        let id = "pay_01jdq7v3kz8y2x6w5t4s3r2q1p";
        assert_eq!(
            parse(&format!("starting_after={id}&offset=3")).map(|p| p.window()),
            Ok(Window {
                offset: 3,
                limit: 25,
                seek: Seek::After(id.into()),
            })
        );
        for bad in [
            "",
            "pay_",
            "ref_01jdq7v3kz8y2x6w5t4s3r2q1p",
            "pay_01JDQ7V3KZ8Y2X6W5T4S3R2Q1P",
            "pay_01jdq7v3kz8y2x6w5t4s3r2q1p0",
        ] {
            let e = parse(&format!("starting_after={bad}")).err();
            assert_eq!(
                e.as_ref().and_then(|e| e.param.as_deref()),
                Some("starting_after"),
                "{bad}"
            );
        }
    }

    #[test]
    fn bad_values_name_the_parameter() {
        for (q, param) in [
            ("limit=0", "limit"),
            ("limit=101", "limit"),
            ("limit=-1", "limit"),
            ("limit=abc", "limit"),
            ("limit=", "limit"),
            ("limit=1.5", "limit"),
            ("limit=99999999999999999999999", "limit"),
            ("offset=-1", "offset"),
            ("offset=x", "offset"),
            ("offset=1.5", "offset"),
            ("offset=99999999999999999999999", "offset"),
        ] {
            let e = parse(q).err();
            assert_eq!(
                e.as_ref().and_then(|e| e.param.as_deref()),
                Some(param),
                "{q}"
            );
            assert_eq!(e.map(|e| e.code), Some("validation_failed"), "{q}");
        }
    }

    #[test]
    fn page_shape_is_data_and_meta() {
        let p = Page::new(
            vec![1, 2],
            7,
            Pagination {
                limit: 2,
                offset: 4,
                seek: Seek::Start,
            },
        );
        assert_eq!(
            serde_json::to_value(&p).unwrap_or_default(),
            serde_json::json!({"data": [1, 2], "meta": {"total": 7, "limit": 2, "offset": 4}})
        );
    }
}
