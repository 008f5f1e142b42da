//! HTML escaping for the pages we serve (hosted checkout, simulators).

/// Escapes text for HTML content and double- or single-quoted attribute
/// values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn markup_and_quotes_are_escaped() {
        assert_eq!(
            super::esc("<a href=\"x\">&'ü"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;ü"
        );
    }
}
