//! Server-sent events as a screen reads them (`/c/{id}/events`).

use serde_json::Value;

/// One server-sent event: `(id, event, data)`.
pub type Sent = (String, String, Value);

/// Reads events from an open stream until `until` says stop or `within`
/// passes; `None` for a comment-only or ended stream.
pub async fn read_events(
    res: &mut reqwest::Response,
    buf: &mut String,
    within: std::time::Duration,
    until: impl Fn(&Sent) -> bool,
) -> Vec<Sent> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim());
                }
            }
            if event.is_empty() {
                continue;
            }
            let sent = (
                id,
                event,
                serde_json::from_str(&data).unwrap_or(Value::Null),
            );
            let stop = until(&sent);
            out.push(sent);
            if stop {
                return out;
            }
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, res.chunk()).await {
            Ok(Ok(Some(bytes))) => buf.push_str(&String::from_utf8_lossy(&bytes)),
            _ => return out,
        }
    }
}
