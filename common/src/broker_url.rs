//! Broker addresses as users write them: `mqtt://HOST:PORT` (port 1883 when
//! omitted) or `mqtts://HOST:PORT` (port 8883) for TLS.

use std::fmt;
use std::str::FromStr;

/// A parsed broker URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerUrl {
    pub host: String,
    pub port: u16,
    pub tls: bool,
}

/// Why a broker URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid broker URL {url:?}: {why} (expected mqtt://HOST:PORT or mqtts://HOST:PORT)")]
pub struct BrokerUrlError {
    pub url: String,
    pub why: &'static str,
}

impl FromStr for BrokerUrl {
    type Err = BrokerUrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let err = |why| BrokerUrlError { url: url.to_string(), why };
        let (tls, rest) = if let Some(r) = url.strip_prefix("mqtt://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("mqtts://") {
            (true, r)
        } else {
            return Err(err("unknown scheme"));
        };
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') || rest.contains('@') {
            return Err(err("paths and credentials do not belong in the URL"));
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| err("unclosed '['"))?;
            (h, after.strip_prefix(':'))
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            }
        };
        if host.is_empty() {
            return Err(err("empty host"));
        }
        let port = match port {
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| err("bad port"))?,
            None if tls => 8883,
            None => 1883,
        };
        Ok(BrokerUrl { host: host.to_string(), port, tls })
    }
}

impl fmt::Display for BrokerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "mqtts" } else { "mqtt" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        let u: BrokerUrl = "mqtt://127.0.0.1:1884".parse().expect("valid");
        assert_eq!((u.host.as_str(), u.port, u.tls), ("127.0.0.1", 1884, false));
        assert_eq!("mqtts://broker".parse::<BrokerUrl>().map(|u| u.port), Ok(8883));
        assert_eq!("mqtt://[::1]:99".parse::<BrokerUrl>().map(|u| u.to_string()).as_deref(), Ok("mqtt://[::1]:99"));
        for bad in ["http://x:1", "mqtt://:1", "mqtt://h:0", "mqtt://h:x", "mqtt://u@h:1", "h:1"] {
            let e = bad.parse::<BrokerUrl>().expect_err(bad);
            assert!(e.to_string().contains(bad), "{e}");
        }
    }
}
