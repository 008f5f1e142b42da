//! The HTTP edge every function shares: the error envelope, request ids and
//! request logs, authentication and scopes, idempotency, rate-limit
//! headers, pagination, JSON input and HTML helpers. The rules it serves
//! live in `shared`, which knows nothing of HTTP.

pub mod answers;
pub mod auth;
pub mod context;
pub mod error;
pub mod html;
pub mod idempotency;
pub mod ids;
pub mod input;
pub mod openapi;
pub mod pagination;
pub mod ratelimit;
pub mod refusals;
pub mod requests;

pub use answers::Json;
pub use auth::Auth;
pub use error::{ApiError, ErrorType};
pub use ids::{Id, PathId};
pub use input::{JsonBody, OptionalJsonBody, QueryParams};
pub use pagination::{Page, Pagination};
pub use requests::{RequestId, with_edge};
