//! The HTTP edge every function shares: the error envelope, request ids and
//! request logs, authentication and scopes, rate limits, pagination and JSON
//! input.

pub mod auth;
pub mod edge;
pub mod error;
pub mod html;
pub mod idempotency;
pub mod input;
pub mod pagination;
pub mod ratelimit;
pub mod strict;
pub mod throttle;

pub use auth::Auth;
pub use edge::{RequestId, with_edge};
pub use error::{ApiError, ErrorType};
pub use input::{JsonBody, OptionalJsonBody, QueryParams};
pub use pagination::{Page, Pagination};
