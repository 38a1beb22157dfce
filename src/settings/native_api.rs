//! Native API settings (`sluice.v1.Limiter`): whether it is served (`LIMITER_API_ENABLED`), on
//! which port and for whom, the named limiters' bounds, and the longest wait of `Acquire`. Its
//! variables are refused while it is off, so a forgotten `LIMITER_API_ENABLED` does not go unseen.

use std::net::SocketAddr;
use std::time::Duration;

use sluice::named::Bounds;

use super::{Env, SettingsError};

/// Where and for whom the native API is served. It is off by default: it lets any caller create
/// limiters and spend their permits, which an Envoy-only deployment never needs.
#[derive(Clone)]
pub struct LimiterApiSettings {
    /// `LIMITER_GRPC_PORT` (on `GRPC_HOST`): a listener of its own, so the API can be kept off
    /// the port Envoy reaches; `None` serves it on the gRPC port.
    pub addr: Option<SocketAddr>,
    /// `LIMITER_API_TOKEN`: callers must send `authorization: Bearer <token>`.
    pub token: Option<String>,
    /// `LIMITER_MAX_COUNT`, `LIMITER_IDLE_EXPIRY` and `LIMITER_MAX_CLIENTS`.
    pub bounds: Bounds,
}

impl std::fmt::Debug for LimiterApiSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterApiSettings")
            .field("addr", &self.addr)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("bounds", &self.bounds)
            .finish()
    }
}

pub(super) fn limiter_api<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<Option<LimiterApiSettings>, SettingsError> {
    let enabled = env.bool("LIMITER_API_ENABLED", false)?;
    let names = [
        "LIMITER_GRPC_PORT",
        "LIMITER_API_TOKEN",
        "LIMITER_MAX_COUNT",
        "LIMITER_IDLE_EXPIRY",
        "LIMITER_MAX_CLIENTS",
    ];
    if !enabled {
        if let Some(name) = names.into_iter().find(|n| env.raw(n).is_some()) {
            return Err(env.error(name, "has no effect unless LIMITER_API_ENABLED=true"));
        }
        return Ok(None);
    }
    let addr = match env.raw("LIMITER_GRPC_PORT") {
        None => None,
        Some(_) => Some(env.addr("GRPC_HOST", "LIMITER_GRPC_PORT", 0)?),
    };
    let token = env.raw("LIMITER_API_TOKEN");
    if token.as_ref().is_some_and(|t| t.len() < 16) {
        return Err(env.error("LIMITER_API_TOKEN", "must have at least 16 characters"));
    }
    let defaults = Bounds::default();
    let bounds = Bounds {
        max_count: env.number("LIMITER_MAX_COUNT", defaults.max_count)?,
        idle: env.duration("LIMITER_IDLE_EXPIRY", defaults.idle)?,
        max_clients: env.number("LIMITER_MAX_CLIENTS", defaults.max_clients)?,
    };
    Ok(Some(LimiterApiSettings {
        addr,
        token,
        bounds,
    }))
}

/// `LIMITER_MAX_WAIT`: the longest wait of the native API's `Acquire`/`TryAcquire`.
pub(super) fn limiter_max_wait<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<Duration, SettingsError> {
    env.duration("LIMITER_MAX_WAIT", Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::settings::tests::settings;

    #[test]
    fn the_native_api_is_off_unless_enabled_and_its_token_is_never_shown() {
        assert!(settings(&[]).unwrap().limiter_api.is_none());
        let api = settings(&[
            ("LIMITER_API_ENABLED", "true"),
            ("LIMITER_GRPC_PORT", "8082"),
            ("LIMITER_API_TOKEN", "0123456789abcdef"),
            ("LIMITER_IDLE_EXPIRY", "168h"),
            ("LIMITER_MAX_COUNT", "5"),
        ])
        .unwrap()
        .limiter_api
        .unwrap();
        assert_eq!(api.addr, Some("0.0.0.0:8082".parse().unwrap()));
        assert_eq!(api.bounds.idle, Duration::from_secs(168 * 3600));
        assert_eq!(api.bounds.max_count, 5);
        assert!(!format!("{api:?}").contains("0123456789abcdef"));
        let err = settings(&[
            ("LIMITER_API_ENABLED", "true"),
            ("LIMITER_API_TOKEN", "short"),
        ])
        .unwrap_err();
        assert_eq!(err.variable, "LIMITER_API_TOKEN");
        assert!(!err.to_string().contains("short"), "{err}");
        let err = settings(&[("LIMITER_MAX_COUNT", "5")]).unwrap_err();
        assert_eq!(err.variable, "LIMITER_MAX_COUNT");
    }
}
