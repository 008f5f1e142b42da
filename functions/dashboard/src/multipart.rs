//! `multipart/form-data` (RFC 7578) as a browser posts a form with a file:
//! each part's name, its file name when it has one, and its bytes. Only
//! what a form without script sends: no nested parts, no transfer
//! encodings. Anything else is an error, never a panic.

use bytes::Bytes;

/// One field of the form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    pub name: String,
    /// The chosen file's name (a file field).
    pub filename: Option<String>,
    pub bytes: Bytes,
}

/// The boundary a `Content-Type` of `multipart/form-data` names.
pub(crate) fn boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';');
    let kind = params.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        if !k.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let v = v.trim().trim_matches('"');
        (!v.is_empty() && v.len() <= 70 && v.bytes().all(|b| b.is_ascii_graphic() || b == b' '))
            .then(|| v.to_owned())
    })
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || from > hay.len() {
        return None;
    }
    let first = needle[0];
    let mut at = from;
    while at + needle.len() <= hay.len() {
        let next = hay[at..].iter().position(|b| *b == first)?;
        at += next;
        if hay.get(at..at + needle.len()) == Some(needle) {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// A `Content-Disposition: form-data` header's `name` and `filename`.
fn disposition(headers: &str) -> Option<(String, Option<String>)> {
    let line = headers.split("\r\n").find(|l| {
        l.split_once(':')
            .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
    })?;
    let (_, value) = line.split_once(':')?;
    let mut params = value.split(';');
    if !params.next()?.trim().eq_ignore_ascii_case("form-data") {
        return None;
    }
    let (mut name, mut filename) = (None, None);
    for p in params {
        let Some((k, v)) = p.trim().split_once('=') else {
            continue;
        };
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v)
            .to_owned();
        match k.trim().to_ascii_lowercase().as_str() {
            "name" => name = Some(v),
            "filename" => filename = Some(v),
            _ => {}
        }
    }
    Some((name?, filename))
}

/// Why a body is not a form.
pub(crate) const MALFORMED: &str = "the form did not arrive whole (malformed multipart body)";

/// The parts of `body`, sent with `boundary`.
pub(crate) fn parse(body: &Bytes, boundary: &str) -> Result<Vec<Part>, &'static str> {
    let delimiter = format!("--{boundary}");
    let next_delimiter = format!("\r\n--{boundary}");
    let mut at = find(body, delimiter.as_bytes(), 0).ok_or(MALFORMED)? + delimiter.len();
    let mut parts = Vec::new();
    loop {
        match body.get(at..at + 2) {
            Some(b"--") => return Ok(parts),
            Some(b"\r\n") => at += 2,
            _ => return Err(MALFORMED),
        }
        let head_end = find(body, b"\r\n\r\n", at).ok_or(MALFORMED)?;
        let headers = std::str::from_utf8(&body[at..head_end]).map_err(|_| MALFORMED)?;
        let (name, filename) = disposition(headers).ok_or(MALFORMED)?;
        let start = head_end + 4;
        let end = find(body, next_delimiter.as_bytes(), start).ok_or(MALFORMED)?;
        parts.push(Part {
            name,
            filename,
            bytes: body.slice(start..end),
        });
        at = end + next_delimiter.len();
        if parts.len() > 32 {
            return Err(MALFORMED);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(parts: &[(&str, Option<&str>, &[u8])]) -> Bytes {
        let mut out = b"preamble\r\n".to_vec();
        for (name, file, bytes) in parts {
            out.extend_from_slice(b"--XyZ\r\nContent-Disposition: form-data; name=\"");
            out.extend_from_slice(name.as_bytes());
            out.push(b'"');
            if let Some(f) = file {
                out.extend_from_slice(format!("; filename=\"{f}\"").as_bytes());
                out.extend_from_slice(b"\r\nContent-Type: text/csv");
            }
            out.extend_from_slice(b"\r\n\r\n");
            out.extend_from_slice(bytes);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"--XyZ--\r\n");
        Bytes::from(out)
    }

    #[test]
    fn a_browser_form_with_a_file_reads_back_exactly() {
        let file: &[u8] = b"a,b\r\n--X,y\r\n\r\n\x00\xff end";
        let b = body(&[
            ("csrf", None, b"tok"),
            ("provider", None, b"esewa"),
            ("file", Some("day.csv"), file),
        ]);
        let parts = parse(&b, "XyZ").unwrap_or_default();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0].name, "csrf");
        assert_eq!(&parts[1].bytes[..], b"esewa");
        assert_eq!(parts[2].filename.as_deref(), Some("day.csv"));
        assert_eq!(&parts[2].bytes[..], file);
        let empty = parse(&body(&[("file", Some(""), b"")]), "XyZ").unwrap_or_default();
        assert_eq!(empty[0].bytes.len(), 0);
    }

    #[test]
    fn the_boundary_comes_from_the_content_type() {
        assert_eq!(
            boundary("multipart/form-data; boundary=----abc").as_deref(),
            Some("----abc")
        );
        assert_eq!(
            boundary("Multipart/Form-Data;charset=utf-8; boundary=\"q r\"").as_deref(),
            Some("q r")
        );
        for bad in [
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "multipart/form-data; boundary=",
            "multipart/mixed; boundary=a",
        ] {
            assert_eq!(boundary(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_broken_body_is_an_error_at_every_cut() {
        let whole = body(&[("csrf", None, b"tok"), ("file", Some("f.csv"), b"x,y\r\n")]);
        assert!(parse(&whole, "XyZ").is_ok());
        for cut in 0..whole.len() - 4 {
            let part = whole.slice(..cut);
            assert!(parse(&part, "XyZ").is_err(), "cut at {cut}");
        }
        assert!(parse(&whole, "other").is_err());
        let no_name =
            Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nx\r\n--XyZ--");
        assert_eq!(parse(&no_name, "XyZ"), Err(MALFORMED));
    }
}
