//! Which webhook URLs we may call (decisions "Webhooks"): `https` only, and
//! never a host that resolves to loopback, private, link-local, carrier
//! NAT, multicast or cloud-metadata addresses, checked when the endpoint is
//! registered and again at every delivery (DNS can change in between).
//! The local gateway may allow `http://127.0.0.1` in sandbox behind an
//! explicit flag ([`Policy::allow_local_http`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Longest URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// What a check allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// `http://127.0.0.1` / `http://localhost` (and only those) are
    /// allowed: the local gateway in sandbox, behind a flag.
    pub allow_local_http: bool,
}

/// Why a URL is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("{0}")]
    Invalid(String),
    #[error("webhook URLs must use https")]
    NotHttps,
    #[error("the host is or resolves to a {0} address, which webhooks may not call")]
    Forbidden(&'static str),
    #[error("the host {0} does not resolve")]
    Unresolvable(String),
}

/// The kind of address `ip` is when webhooks may not call it.
pub fn forbidden_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_v4(v4);
            }
            let s = v6.segments();
            // IPv4-compatible (deprecated, `::a.b.c.d`): judged as the IPv4
            // address it carries.
            if s[..6] == [0, 0, 0, 0, 0, 0] && !v6.is_loopback() && !v6.is_unspecified() {
                return forbidden_v4(Ipv4Addr::new(
                    (s[6] >> 8) as u8,
                    s[6] as u8,
                    (s[7] >> 8) as u8,
                    s[7] as u8,
                ));
            }
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if v6.is_multicast() {
                Some("multicast")
            } else if (s[0] & 0xfe00) == 0xfc00 {
                // Also AWS's IPv6 metadata address, fd00:ec2::254.
                Some("private (unique local)")
            } else if (s[0] & 0xffc0) == 0xfe80 {
                Some("link-local")
            } else if (s[0] & 0xffc0) == 0xfec0 {
                Some("site-local")
            } else if s[0] == 0x64 && s[1] == 0xff9b {
                // NAT64 (64:ff9b::/96 and the local-use 64:ff9b:1::/48)
                // could reach any IPv4 address, private ones included.
                Some("NAT64")
            } else if s[0] == 0x2002 {
                // 6to4 embeds an IPv4 address too.
                Some("6to4")
            } else {
                None
            }
        }
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if o == [169, 254, 169, 254] || o == [100, 100, 100, 200] {
        Some("cloud metadata")
    } else if ip.is_private() {
        Some("private")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        Some("carrier-grade NAT")
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        // IETF protocol assignments; 192.0.0.192 is a cloud metadata address.
        Some("reserved")
    } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
        Some("benchmarking")
    } else if o[0] == 0 || ip.is_broadcast() {
        Some("unspecified")
    } else if ip.is_multicast() || o[0] >= 240 {
        Some("multicast or reserved")
    } else {
        None
    }
}

/// A host name that names this machine or a private network whatever DNS
/// says: `localhost` and its kin, `.local`/`.internal`/`.localdomain`
/// names (mDNS, cloud metadata such as `metadata.google.internal`), and
/// single-label names (resolved through the server's search domains).
fn internal_name(host: &str) -> Option<&'static str> {
    let host = host.trim_end_matches('.');
    let loopback = [
        "localhost",
        "localhost.localdomain",
        "ip6-localhost",
        "ip6-loopback",
    ];
    if loopback.contains(&host) || host.ends_with(".localhost") {
        return Some("loopback");
    }
    if [".local", ".internal", ".localdomain", ".lan", ".home.arpa"]
        .iter()
        .any(|suffix| host.ends_with(suffix))
        || !host.contains('.')
    {
        return Some("private-network");
    }
    None
}

/// A webhook URL, checked for its form (not yet resolved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub url: String,
    pub host: String,
    pub port: u16,
    /// `http://127.0.0.1` or `localhost` under [`Policy::allow_local_http`].
    pub local: bool,
}

/// Checks a URL's form: absolute, `https` (or local http when allowed),
/// a host, no user credentials, at most [`MAX_URL_LEN`]. An IP literal is
/// judged at once.
pub fn check_url(url: &str, policy: Policy) -> Result<Target, UrlError> {
    if url.is_empty() || url.len() > MAX_URL_LEN {
        return Err(UrlError::Invalid(format!(
            "url must be 1 to {MAX_URL_LEN} characters"
        )));
    }
    let parsed = reqwest::Url::parse(url)
        .map_err(|_| UrlError::Invalid("url must be an absolute URL".into()))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(UrlError::Invalid(
            "url must not carry user credentials".into(),
        ));
    }
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| UrlError::Invalid("url has no host".into()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let local_host = matches!(host.as_str(), "127.0.0.1" | "localhost");
    let local = match parsed.scheme() {
        "https" => false,
        "http" if policy.allow_local_http && local_host => true,
        _ => return Err(UrlError::NotHttps),
    };
    if !local {
        if let Ok(ip) = host.parse::<IpAddr>() {
            if let Some(kind) = forbidden_kind(ip) {
                return Err(UrlError::Forbidden(kind));
            }
        } else if let Some(kind) = internal_name(&host) {
            return Err(UrlError::Forbidden(kind));
        }
    }
    if parsed.as_str().len() > MAX_URL_LEN {
        // Percent-encoding can make a short input long: judge what is kept.
        return Err(UrlError::Invalid(format!(
            "url must be at most {MAX_URL_LEN} characters once encoded"
        )));
    }
    let port = parsed.port_or_known_default().unwrap_or(443);
    Ok(Target {
        url: parsed.to_string(),
        host,
        port,
        local,
    })
}

/// Resolves the target's host and refuses it if any address it resolves
/// to is forbidden (a host with one private address among public ones is
/// refused: the connection could pick it). Answers the addresses to
/// connect to, so the caller connects to what was checked.
pub async fn resolve(target: &Target) -> Result<Vec<SocketAddr>, UrlError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((target.host.as_str(), target.port))
        .await
        .map_err(|_| UrlError::Unresolvable(target.host.clone()))?
        .collect();
    if addrs.is_empty() {
        return Err(UrlError::Unresolvable(target.host.clone()));
    }
    for a in &addrs {
        match forbidden_kind(a.ip()) {
            None => {}
            Some("loopback") if target.local => {}
            Some(kind) => return Err(UrlError::Forbidden(kind)),
        }
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn internal_names_are_refused_without_dns() {
        let policy = Policy {
            allow_local_http: false,
        };
        for url in [
            "https://localhost.localdomain/x",
            "https://metadata.google.internal/computeMetadata/v1/",
            "https://printer.local/x",
            "https://intranet/x",
            "https://router.lan./x",
            "https://a.localhost/x",
        ] {
            assert!(
                matches!(check_url(url, policy), Err(UrlError::Forbidden(_))),
                "{url}"
            );
        }
        for url in [
            "https://hooks.shop.example/x",
            "https://shop.com.np/dhukuti",
        ] {
            assert!(check_url(url, policy).is_ok(), "{url}");
        }
    }

    #[test]
    fn internal_addresses_are_forbidden_and_public_ones_allowed() {
        for (a, kind) in [
            ("127.0.0.1", "loopback"),
            ("127.9.9.9", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "cloud metadata"),
            ("169.254.1.1", "link-local"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("0.0.0.0", "unspecified"),
            ("255.255.255.255", "unspecified"),
            ("224.0.0.1", "multicast or reserved"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fd12:3456::1", "private (unique local)"),
            ("fe80::1", "link-local"),
            ("::ffff:10.0.0.1", "private"),
            ("::ffff:169.254.169.254", "cloud metadata"),
            ("fd00:ec2::254", "private (unique local)"),
            ("64:ff9b::a00:1", "NAT64"),
            ("64:ff9b:1::a00:1", "NAT64"),
            ("::127.0.0.1", "loopback"),
            ("::10.0.0.1", "private"),
            ("fec0::1", "site-local"),
            ("2002:a00:1::1", "6to4"),
            ("192.0.0.192", "reserved"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
        ] {
            assert_eq!(forbidden_kind(ip(a)), Some(kind), "{a}");
        }
        for a in [
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "203.0.113.7",
        ] {
            assert_eq!(forbidden_kind(ip(a)), None, "{a}");
        }
    }

    #[test]
    fn urls_must_be_https_to_a_public_host() {
        let p = Policy::default();
        let ok = check_url("https://shop.example/hooks?x=1", p).unwrap();
        assert_eq!(
            (ok.host.as_str(), ok.port, ok.local),
            ("shop.example", 443, false)
        );
        assert_eq!(
            check_url("https://shop.example:8443/h", p).unwrap().port,
            8443
        );
        assert_eq!(
            check_url("http://shop.example/h", p),
            Err(UrlError::NotHttps)
        );
        assert_eq!(
            check_url("ftp://shop.example/h", p),
            Err(UrlError::NotHttps)
        );
        assert!(matches!(
            check_url("shop.example/h", p),
            Err(UrlError::Invalid(_))
        ));
        assert!(matches!(
            check_url("https://user:pw@shop.example/h", p),
            Err(UrlError::Invalid(_))
        ));
        assert!(matches!(check_url("", p), Err(UrlError::Invalid(_))));
        assert!(matches!(
            check_url(&format!("https://a.example/{}", "x".repeat(2100)), p),
            Err(UrlError::Invalid(_))
        ));
        for internal in [
            "https://127.0.0.1/h",
            "https://localhost/h",
            "https://api.localhost/h",
            "https://10.0.0.5/h",
            "https://169.254.169.254/latest/meta-data",
            "https://[::1]/h",
            "https://[fe80::1]/h",
        ] {
            assert!(
                matches!(check_url(internal, p), Err(UrlError::Forbidden(_))),
                "{internal}"
            );
        }
        // Local http only behind the flag, and only to loopback names.
        let dev = Policy {
            allow_local_http: true,
        };
        assert_eq!(
            check_url("http://127.0.0.1:9000/h", p),
            Err(UrlError::NotHttps)
        );
        assert!(check_url("http://127.0.0.1:9000/h", dev).unwrap().local);
        assert!(check_url("http://localhost:9000/h", dev).unwrap().local);
        assert_eq!(check_url("http://10.0.0.5/h", dev), Err(UrlError::NotHttps));
    }

    #[tokio::test]
    async fn resolution_is_checked_too() {
        let p = Policy::default();
        // A name that resolves to loopback is refused even over https.
        let t = Target {
            url: "https://localhost.test/h".into(),
            host: "localhost".into(),
            port: 443,
            local: false,
        };
        assert_eq!(resolve(&t).await, Err(UrlError::Forbidden("loopback")));
        let dev = check_url(
            "http://127.0.0.1:9/h",
            Policy {
                allow_local_http: true,
            },
        )
        .unwrap();
        assert!(resolve(&dev).await.is_ok());
        // IP literals resolve to themselves.
        let public = check_url("https://203.0.113.7/h", p).unwrap();
        assert_eq!(resolve(&public).await.unwrap()[0].ip(), ip("203.0.113.7"));
    }

    #[test]
    fn the_length_limit_applies_to_the_encoded_url() {
        let long = format!("https://a.example/{}", "é".repeat(1000));
        assert!(long.len() <= MAX_URL_LEN);
        assert!(matches!(
            check_url(&long, Policy::default()),
            Err(UrlError::Invalid(m)) if m.contains("encoded")
        ));
    }
}
