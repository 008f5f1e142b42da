//! What any part of the edge may know of the request being served without
//! depending on the rest of it: its id (set by `requests::with_edge` for
//! the task serving it) and the largest body the edge reads.

/// The header carrying the request id, both ways.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The largest request body read (1 MiB); a bigger one is a 413.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

tokio::task_local! {
    pub(crate) static REQUEST_ID: String;
}

/// The id of the request this task is serving, if inside `with_edge`.
pub fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(Clone::clone).ok()
}
