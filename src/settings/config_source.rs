//! Config source settings: where the rate limit configuration comes from (`CONFIG_TYPE`: the
//! directory of `RUNTIME_ROOT`, `RUNTIME_SUBDIRECTORY` and `RUNTIME_APPDIRECTORY`, checked every
//! `CONFIG_RELOAD_INTERVAL`, or an xDS server and its client's `CONFIG_GRPC_XDS_*` and
//! `XDS_CLIENT_*` variables), how either is loaded, and what start-up and health make of it.

use std::path::PathBuf;
use std::time::Duration;

use crate::xds::{BackoffOptions, XdsOptions, XdsTls};
use sluice::config::LoadOptions;

use super::{Env, SettingsError};

/// Where the rate limit configuration comes from, and what start-up and health make of it.
#[derive(Debug, Clone)]
pub struct ConfigSourceSettings {
    pub source: ConfigSource,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: serve at once, answering "no rate limit
    /// configuration loaded" until a configuration arrives (false: wait for it before serving).
    pub force_start: bool,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: health also needs a configuration with at
    /// least one domain.
    pub healthy_needs_a_domain: bool,
}

/// `CONFIG_TYPE`.
#[derive(Debug, Clone)]
pub enum ConfigSource {
    /// `FILE`: the directory of `RUNTIME_ROOT` etc., watched for changes.
    Files,
    /// `GRPC_XDS_SOTW`: pushed by an xDS server; files are not read.
    Xds(Box<XdsOptions>),
}

/// The directory the configuration files are read from.
pub(super) fn config_dir<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> PathBuf {
    let mut config_dir = PathBuf::from(env.string("RUNTIME_ROOT", "/srv/runtime_data/current"));
    if let Some(sub) = env.raw("RUNTIME_SUBDIRECTORY") {
        config_dir.push(sub);
    }
    config_dir.push(env.string("RUNTIME_APPDIRECTORY", "config"));
    config_dir
}

/// How a configuration is loaded, from files or xDS alike.
pub(super) fn load_options<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<LoadOptions, SettingsError> {
    Ok(LoadOptions {
        merge_domains: env.bool("MERGE_DOMAIN_CONFIG", false)?,
        ignore_dotfiles: env.bool("RUNTIME_IGNOREDOTFILES", false)?,
    })
}

/// How often the config directory is checked for changes; zero turns live reload off.
pub(super) fn reload_interval<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<Duration, SettingsError> {
    env.duration("CONFIG_RELOAD_INTERVAL", Duration::from_secs(1))
}

/// `CONFIG_TYPE`, the xDS client's `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` variables, and the
/// start-up and health switches that apply to either source.
pub(super) fn config_source<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    load: &LoadOptions,
) -> Result<ConfigSourceSettings, SettingsError> {
    // Upstream compares the exact spelling.
    let source = match env.string("CONFIG_TYPE", "FILE").as_str() {
        "FILE" => ConfigSource::Files,
        "GRPC_XDS_SOTW" => ConfigSource::Xds(Box::new(xds_options(env, load)?)),
        _ => return Err(env.error("CONFIG_TYPE", "expected FILE or GRPC_XDS_SOTW")),
    };
    Ok(ConfigSourceSettings {
        source,
        force_start: env.bool("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?,
        healthy_needs_a_domain: env.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
    })
}

/// The xDS client's options, for `CONFIG_TYPE=GRPC_XDS_SOTW`.
fn xds_options<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    load: &LoadOptions,
) -> Result<XdsOptions, SettingsError> {
    let node_metadata = node_metadata(env);
    let headers = xds_headers(env)?;
    // Accepted for compatibility; upstream's value has no effect either.
    env.duration(
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        Duration::from_secs(3),
    )?;
    let tls = xds_tls(env)?;
    let backoff = xds_backoff(env)?;
    let max_message_bytes = match env.number("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0usize)? {
        0 => None,
        n => Some(n),
    };
    Ok(XdsOptions {
        server_url: env.string("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
        node_id: env.string("CONFIG_GRPC_XDS_NODE_ID", "default"),
        node_metadata,
        headers,
        tls,
        backoff,
        max_message_bytes,
        load: load.clone(),
    })
}

/// `CONFIG_GRPC_XDS_NODE_METADATA` (`k=v,k2=v2`), the node's metadata sent to the xDS server.
fn node_metadata<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Vec<(String, String)> {
    // Upstream drops metadata parts without `=`.
    env.string("CONFIG_GRPC_XDS_NODE_METADATA", "")
        .split(',')
        .filter_map(|part| part.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`, sent with every xDS request.
fn xds_headers<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<Vec<(String, String)>, SettingsError> {
    // Upstream reads a Go map (`k:v,k2:v2`); a part without `:` is an error there as well.
    let headers_var = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS";
    env.string(headers_var, "")
        .split(',')
        .filter(|part| !part.trim().is_empty())
        .map(|part| match part.split_once(':') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            // The value may hold credentials: never shown.
            _ => Err(SettingsError {
                variable: headers_var.to_string(),
                value: "<redacted>".to_string(),
                reason: "expected name:value[,name:value…]".to_string(),
            }),
        })
        .collect::<Result<_, _>>()
}

/// `CONFIG_GRPC_XDS_SERVER_USE_TLS` and its files: the server's CA and name, the client's
/// certificate.
fn xds_tls<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Option<XdsTls>, SettingsError> {
    let tls = if env.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
        let cert = env.raw("CONFIG_GRPC_XDS_CLIENT_TLS_CERT");
        let key = env.raw("CONFIG_GRPC_XDS_CLIENT_TLS_KEY");
        let cert_and_key = match (cert, key) {
            (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
            (None, None) => None,
            (Some(_), None) => {
                return Err(env.error(
                    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
                    "must be set with CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                ));
            }
            (None, Some(_)) => {
                return Err(env.error(
                    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                    "must be set with CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
                ));
            }
        };
        Some(XdsTls {
            ca: env
                .raw("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
                .map(PathBuf::from),
            cert_and_key,
            server_name: env.raw("CONFIG_GRPC_XDS_SERVER_TLS_SAN"),
        })
    } else {
        None
    };
    Ok(tls)
}

/// `XDS_CLIENT_BACKOFF_*`: the xDS client's reconnect schedule.
fn xds_backoff<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<BackoffOptions, SettingsError> {
    let defaults = BackoffOptions::default();
    let random_var = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR";
    let random_factor = match env.raw(random_var).map(|v| v.trim().parse::<f64>()) {
        None => defaults.random_factor,
        Some(Ok(f)) if (0.0..=1.0).contains(&f) => f,
        Some(_) => return Err(env.error(random_var, "expected a number from 0 to 1")),
    };
    let backoff = BackoffOptions {
        initial: env.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", defaults.initial)?,
        max: env.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", defaults.max)?,
        random_factor,
        jitter: env.bool("XDS_CLIENT_BACKOFF_JITTER", defaults.jitter)?,
    };
    if backoff.initial.is_zero() || backoff.max < backoff.initial {
        return Err(env.error(
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            "the backoff needs 0 < XDS_CLIENT_BACKOFF_INITIAL_INTERVAL <= XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        ));
    }
    Ok(backoff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::tests::settings;

    #[test]
    fn config_type_selects_the_source_and_refuses_anything_else() {
        let s = settings(&[]).unwrap();
        assert!(matches!(s.config_source.source, ConfigSource::Files));
        assert!(!s.config_source.force_start);
        assert!(!s.config_source.healthy_needs_a_domain);
        let err = settings(&[("CONFIG_TYPE", "GRPC_XDS_DELTA")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "CONFIG_TYPE=\"GRPC_XDS_DELTA\": expected FILE or GRPC_XDS_SOTW"
        );
        let s = settings(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "a=1,broken,b=two"),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "x-team:rl,x-env:prod",
            ),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s"),
            ("XDS_CLIENT_BACKOFF_JITTER", "false"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1048576"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
            ("MERGE_DOMAIN_CONFIG", "true"),
        ])
        .unwrap();
        assert!(s.config_source.force_start);
        assert!(s.config_source.healthy_needs_a_domain);
        let ConfigSource::Xds(xds) = s.config_source.source else {
            panic!("expected xDS");
        };
        assert_eq!(xds.server_url, "envoy-gateway:18001");
        assert_eq!(xds.node_id, "envoy-ratelimit");
        let pairs = |v: &[(String, String)]| {
            v.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert_eq!(pairs(&xds.node_metadata), "a=1,b=two");
        assert_eq!(pairs(&xds.headers), "x-team=rl,x-env=prod");
        let tls = xds.tls.unwrap();
        assert_eq!(tls.ca, Some(PathBuf::from("/certs/ca.crt")));
        assert!(tls.cert_and_key.is_some());
        assert_eq!(xds.backoff.initial, Duration::from_millis(100));
        assert_eq!(xds.backoff.max, Duration::from_secs(1));
        assert!(!xds.backoff.jitter);
        assert_eq!(xds.max_message_bytes, Some(1 << 20));
        assert!(xds.load.merge_domains);
        let err = settings(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "novalue"),
        ])
        .unwrap_err();
        assert_eq!(err.variable, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS");
        let secret = settings(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "authorization:Bearer s3cret",
            ),
        ])
        .unwrap();
        assert!(!format!("{secret:?}").contains("s3cret"));
    }
}
