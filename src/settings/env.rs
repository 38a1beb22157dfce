//! Reading one variable: the `Env` reader and the syntax of its values (Go's booleans, durations
//! and listen addresses, as upstream parses them), and `SettingsError`, which names the variable
//! and never shows a secret. Every area's parsing (the sibling files) reads through it.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use sluice::store::redis::redact_url;
use sluice::util::parse_go_duration;

/// A variable with a value we cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?}: {reason}")]
pub struct SettingsError {
    pub variable: String,
    /// Shown as given, except for secrets, which are never shown.
    pub value: String,
    pub reason: String,
}

/// Reads variables through `get` (the process environment in production, a map in tests).
pub struct Env<F: Fn(&str) -> Option<String>>(pub F);

impl<F: Fn(&str) -> Option<String>> Env<F> {
    pub(super) fn raw(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|v| !v.is_empty())
    }

    pub(super) fn string(&self, name: &str, default: &str) -> String {
        self.raw(name).unwrap_or_else(|| default.to_string())
    }

    pub(super) fn error(&self, name: &str, reason: impl Into<String>) -> SettingsError {
        let value = self.raw(name).unwrap_or_default();
        let value = if name.ends_with("_AUTH") || name.ends_with("_TOKEN") {
            "<redacted>".to_string()
        } else if name.ends_with("_URL") {
            redact_url(&value)
        } else {
            value
        };
        SettingsError {
            variable: name.to_string(),
            value,
            reason: reason.into(),
        }
    }

    /// Go's `strconv.ParseBool` spellings.
    pub(super) fn bool(&self, name: &str, default: bool) -> Result<bool, SettingsError> {
        match self.raw(name).as_deref() {
            None => Ok(default),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(_) => Err(self.error(name, "expected true or false")),
        }
    }

    pub(super) fn number<T: FromStr>(&self, name: &str, default: T) -> Result<T, SettingsError> {
        match self.raw(name) {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse()
                .map_err(|_| self.error(name, "expected a whole number")),
        }
    }

    /// A size in bytes: a whole number, or one with a binary suffix as Kubernetes writes
    /// memory (`Ki`, `Mi`, `Gi`).
    pub(super) fn bytes(&self, name: &str, default: usize) -> Result<usize, SettingsError> {
        let Some(v) = self.raw(name) else {
            return Ok(default);
        };
        let v = v.trim();
        let (digits, shift) = match v.len().checked_sub(2).map(|at| v.split_at(at)) {
            Some((digits, "Ki")) => (digits, 10),
            Some((digits, "Mi")) => (digits, 20),
            Some((digits, "Gi")) => (digits, 30),
            _ => (v, 0),
        };
        digits
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_mul(1 << shift))
            .ok_or_else(|| self.error(name, "expected a number of bytes, e.g. 4194304 or 4Mi"))
    }

    pub(super) fn duration(
        &self,
        name: &str,
        default: Duration,
    ) -> Result<Duration, SettingsError> {
        match self.raw(name) {
            None => Ok(default),
            Some(v) => parse_go_duration(&v).map_err(|reason| self.error(name, reason)),
        }
    }

    /// Go's listen address: `host:port`, or `:port` for every interface.
    pub(super) fn listen_addr(
        &self,
        name: &str,
        default: &str,
    ) -> Result<SocketAddr, SettingsError> {
        let text = self.string(name, default);
        let (host, port) = text
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .ok_or_else(|| self.error(name, "expected host:port or :port"))?;
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        listen_host(host, port).map_err(|reason| self.error(name, reason))
    }

    pub(super) fn addr(
        &self,
        host_var: &str,
        port_var: &str,
        port: u16,
    ) -> Result<SocketAddr, SettingsError> {
        let host = self.string(host_var, "0.0.0.0");
        let port = self.number(port_var, port)?;
        listen_host(&host, port).map_err(|reason| self.error(host_var, reason))
    }
}

/// The address to listen on for `host`, an IP address or a host name, as Go's `net.Listen`
/// (upstream's) takes it: a name is resolved, and its first IPv4 address is used, else its
/// first address.
fn listen_host(host: &str, port: u16) -> Result<SocketAddr, String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .map_err(|e| format!("expected an IP address or a host name that resolves: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| "the host name resolves to no address".to_string())
}
