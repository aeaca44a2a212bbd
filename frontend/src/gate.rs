//! The door against browsers (as Jupyter and Ollama's `OLLAMA_ORIGINS` guard theirs): a web
//! page must not drive the API from the user's own browser, since on loopback without a key
//! anything that reaches the port may generate, read the cache entries or evict everything.
//!
//! - **DNS rebinding**: a page at `evil.example` that resolves its name to 127.0.0.1 reaches
//!   the port, but its requests carry `Host: evil.example`. Only a loopback name (`localhost`,
//!   `*.localhost`, 127.0.0.0/8, `::1`), the address the front end is bound to, or an
//!   `--allowed-hosts` entry is served; anything else gets 421.
//! - **Cross-origin requests**: a browser names the page that sent a request in `Origin`.
//!   Loopback origins (a local web UI) and `--allowed-origins` entries pass; any other gets
//!   403, the CORS preflight (`OPTIONS`) included. Requests with no `Origin` (curl, SDKs) pass.
//!
//! `*` in either list allows everything.

use std::net::IpAddr;

/// Which `Host` and `Origin` values are served.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    /// Host names (lowercase, no port) allowed besides loopback ones.
    hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`, lowercase) allowed besides loopback ones.
    origins: Vec<String>,
}

/// Splits a comma-separated list, trimmed and lowercased, empty entries dropped.
pub fn list(text: Option<&str>) -> Vec<String> {
    text.unwrap_or("")
        .split(',')
        .map(|s| s.trim().trim_end_matches('/').to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

impl Gate {
    /// The gate for a front end bound to `bound`, with the operator's extra hosts and origins.
    pub fn new(bound: IpAddr, hosts: Vec<String>, origins: Vec<String>) -> Gate {
        let mut hosts = hosts;
        if !bound.is_loopback() && !bound.is_unspecified() {
            hosts.push(bound.to_string());
        }
        Gate { hosts, origins }
    }

    /// Whether a request whose `Host` header is `host` is served (None: no header, which only
    /// non-browser HTTP/1.0 clients send).
    pub fn host_ok(&self, host: Option<&str>) -> bool {
        let Some(host) = host else { return true };
        let name = host_name(host).to_ascii_lowercase();
        loopback_name(&name) || self.hosts.iter().any(|h| h == "*" || *h == name)
    }

    /// Whether a request whose `Origin` header is `origin` is served.
    pub fn origin_ok(&self, origin: Option<&str>) -> bool {
        let Some(origin) = origin else { return true };
        let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
        if self.origins.iter().any(|o| o == "*" || *o == origin) {
            return true;
        }
        match origin.split_once("://") {
            Some(("http" | "https", authority)) => loopback_name(host_name(authority)),
            _ => false,
        }
    }
}

/// The host part of `host[:port]` or `[v6]:port`.
fn host_name(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match authority.rsplit_once(':') {
        // One colon: host:port. More: a bare IPv6 address.
        Some((h, _)) if !h.contains(':') => h,
        _ => authority,
    }
}

fn loopback_name(name: &str) -> bool {
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local() -> Gate {
        Gate::new("127.0.0.1".parse().unwrap(), vec![], vec![])
    }

    #[test]
    fn loopback_hosts_pass_and_rebound_names_do_not() {
        let g = local();
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:8080",
            "127.9.9.9",
            "app.localhost:1",
        ] {
            assert!(g.host_ok(Some(ok)), "{ok}");
        }
        assert!(g.host_ok(None));
        for bad in [
            "rebind.example:8080",
            "evil.example",
            "localhost.evil.example",
            "10.0.0.5:8080",
            "",
        ] {
            assert!(!g.host_ok(Some(bad)), "{bad}");
        }
        let g = Gate::new(
            "127.0.0.1".parse().unwrap(),
            list(Some("My-Box.lan, ")),
            vec![],
        );
        assert!(g.host_ok(Some("my-box.lan:8080")));
        let g = Gate::new("192.168.1.7".parse().unwrap(), vec![], vec![]);
        assert!(g.host_ok(Some("192.168.1.7:8080")), "the bound address");
        assert!(
            Gate::new("127.0.0.1".parse().unwrap(), list(Some("*")), vec![]).host_ok(Some("x.y"))
        );
    }

    #[test]
    fn loopback_origins_pass_and_other_pages_do_not() {
        let g = local();
        assert!(g.origin_ok(None));
        for ok in [
            "http://localhost:3000",
            "http://127.0.0.1:8080",
            "https://[::1]:5173",
        ] {
            assert!(g.origin_ok(Some(ok)), "{ok}");
        }
        for bad in [
            "https://evil.example",
            "http://rebind.example:8080",
            "null",
            "file://",
            "http://localhost.evil.example",
        ] {
            assert!(!g.origin_ok(Some(bad)), "{bad}");
        }
        let g = Gate::new(
            "127.0.0.1".parse().unwrap(),
            vec![],
            list(Some("https://ui.example.com/")),
        );
        assert!(g.origin_ok(Some("https://UI.example.com")));
        assert!(!g.origin_ok(Some("https://ui.example.com:444")));
    }
}
