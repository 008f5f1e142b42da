//! Offset pagination: `limit` 1..=100 (default per list), `offset` >= 0;
//! lists answer `{data, meta: {total, limit, offset}}`, newest first.

use serde::Serialize;

use super::error::ApiError;
use super::input::QueryParams;
use shared::domain::Window;

pub const MAX_LIMIT: usize = 100;
/// Offsets are read through on DynamoDB (it has no skip), so a page past
/// this many records is refused rather than letting one call scan a
/// partition without bound. See `../shared/spec/decisions.md`.
pub const MAX_OFFSET: usize = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pagination {
    pub limit: usize,
    pub offset: usize,
}

impl Pagination {
    /// The records of the list this page holds.
    pub fn window(&self) -> Window {
        Window {
            offset: self.offset,
            limit: self.limit,
        }
    }

    pub fn from_query(q: &QueryParams, default_limit: usize) -> Result<Self, ApiError> {
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
            Some(raw) => match raw.trim().parse::<i64>() {
                Ok(n) if (0..=MAX_OFFSET as i64).contains(&n) => n as usize,
                Ok(n) if n > MAX_OFFSET as i64 => {
                    return Err(ApiError::validation(
                        "offset",
                        format!(
                            "offset must be at most {MAX_OFFSET}; narrow the list with filters"
                        ),
                    ));
                }
                _ => {
                    return Err(ApiError::validation(
                        "offset",
                        format!("offset must be an integer >= 0, got '{raw}'"),
                    ));
                }
            },
        };
        Ok(Pagination { limit, offset })
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
    /// Records to skip.
    #[param(minimum = 0, maximum = 10_000)]
    offset: Option<u32>,
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
        Pagination::from_query(&QueryParams::parse(Some(q)), 25)
    }

    #[test]
    fn defaults_apply_when_absent() {
        assert_eq!(
            parse(""),
            Ok(Pagination {
                limit: 25,
                offset: 0
            })
        );
        assert_eq!(
            Pagination::from_query(&QueryParams::default(), 10),
            Ok(Pagination {
                limit: 10,
                offset: 0
            })
        );
    }

    #[test]
    fn bounds_are_inclusive() {
        assert_eq!(parse("limit=1&offset=0").map(|p| p.limit), Ok(1));
        assert_eq!(parse("limit=100").map(|p| p.limit), Ok(100));
        assert_eq!(parse("offset=10000").map(|p| p.offset), Ok(10000));
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
            ("offset=10001", "offset"),
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
            },
        );
        assert_eq!(
            serde_json::to_value(&p).unwrap_or_default(),
            serde_json::json!({"data": [1, 2], "meta": {"total": 7, "limit": 2, "offset": 4}})
        );
    }
}
