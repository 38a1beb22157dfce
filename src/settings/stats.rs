//! Stats settings: upstream's sinks (statsd over TCP, DogStatsD over UDP, or Prometheus on a
//! listener of its own), their mapping, tags and flush interval, the debug listener, the cap on
//! detailed metric series, and where the near_limit stat starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{Env, SettingsError};

/// Upstream's stats settings (`stats_settings`).
#[derive(Clone, Debug)]
pub struct StatsSettings {
    /// `DISABLE_STATS=true` turns every sink of upstream's stats off.
    pub enabled: bool,
    /// `USE_STATSD` (TCP) or `USE_DOG_STATSD` (UDP) to `STATSD_HOST:STATSD_PORT`.
    pub statsd: Option<StatsdSink>,
    pub flush_interval: Duration,
    /// `PROMETHEUS_MAPPER_YAML`: statsd_exporter mapping rules replacing upstream's default.
    pub mapper_file: Option<PathBuf>,
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`: upstream's legacy response-time series,
    /// milliseconds under the `_seconds` name.
    pub response_time_in_ms: bool,
    /// `EXTRA_TAGS` (`k:v,k2:v2`), on every stat.
    pub extra_tags: Vec<(String, String)>,
    /// `DEBUG_HOST:DEBUG_PORT`: `/`, `/rlconfig`, `/stats`.
    pub debug_addr: SocketAddr,
    /// `MAX_DETAILED_METRIC_SERIES` (Sluice's): stat series named after request values
    /// (`detailed_metric`, `value_to_metric`, overrides) at most; 0: no cap.
    pub max_detailed_series: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsdSink {
    /// `host:port`.
    pub addr: String,
    /// DogStatsD (tags as `|#k:v`, over UDP) rather than plain statsd over TCP.
    pub dog: bool,
}

#[derive(Debug, Clone)]
pub struct PrometheusListener {
    pub addr: SocketAddr,
    pub path: String,
}

/// Upstream's stats variables. Sinks are exclusive as upstream's: `USE_STATSD` (true unless
/// set otherwise, as upstream), `USE_DOG_STATSD` and `USE_PROMETHEUS`; two at once is an error
/// naming both, unless `DISABLE_STATS` turns them all off.
pub(super) fn stats_settings<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<StatsSettings, SettingsError> {
    let enabled = !env.bool("DISABLE_STATS", false)?;
    let sinks = [
        ("USE_STATSD", env.bool("USE_STATSD", true)?),
        ("USE_DOG_STATSD", env.bool("USE_DOG_STATSD", false)?),
        ("USE_PROMETHEUS", env.bool("USE_PROMETHEUS", false)?),
    ];
    let on: Vec<&str> = sinks
        .iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| *n)
        .collect();
    if enabled && on.len() > 1 {
        let first = on[0];
        let mut err = env.error(
            first,
            format!(
                "{} are set together: one stats sink at a time, as upstream (USE_STATSD is true \
                 unless set to false)",
                on.join(" and ")
            ),
        );
        if err.value.is_empty() {
            err.value = "true (default)".into();
        }
        return Err(err);
    }
    let host = env.string("STATSD_HOST", "localhost");
    let port: u16 = env.number("STATSD_PORT", 8125)?;
    let statsd =
        (enabled && (on.contains(&"USE_STATSD") || on.contains(&"USE_DOG_STATSD"))).then(|| {
            StatsdSink {
                addr: if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                },
                dog: on.contains(&"USE_DOG_STATSD"),
            }
        });
    let flush_interval = env.duration("STATS_FLUSH_INTERVAL", Duration::from_secs(10))?;
    if flush_interval.is_zero() {
        return Err(env.error("STATS_FLUSH_INTERVAL", "expected a duration above zero"));
    }
    let mut extra_tags = Vec::new();
    for pair in env
        .string("EXTRA_TAGS", "")
        .split(',')
        .filter(|p| !p.trim().is_empty())
    {
        match pair.split(':').collect::<Vec<_>>()[..] {
            [k, v] if !k.trim().is_empty() => {
                extra_tags.push((k.trim().to_string(), v.trim().to_string()));
            }
            _ => {
                return Err(env.error(
                    "EXTRA_TAGS",
                    format!("expected key:value pairs separated by commas, got {pair:?}"),
                ));
            }
        }
    }
    Ok(StatsSettings {
        enabled,
        statsd,
        flush_interval,
        mapper_file: env.raw("PROMETHEUS_MAPPER_YAML").map(PathBuf::from),
        response_time_in_ms: env.bool("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", false)?,
        extra_tags,
        debug_addr: env.addr("DEBUG_HOST", "DEBUG_PORT", 6070)?,
        max_detailed_series: env.number("MAX_DETAILED_METRIC_SERIES", 10_000)?,
    })
}

/// `NEAR_LIMIT_RATIO`: where the near_limit metric starts, as a share of the limit.
pub(super) fn near_limit_ratio<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<f64, SettingsError> {
    Ok(
        match env.raw("NEAR_LIMIT_RATIO").map(|v| v.parse::<f64>()) {
            None => 0.8,
            Some(Ok(r)) if (0.0..=1.0).contains(&r) => r,
            Some(_) => {
                return Err(env.error("NEAR_LIMIT_RATIO", "expected a number from 0 to 1"));
            }
        },
    )
}

/// `USE_PROMETHEUS=true`: metrics also on a listener of their own (`PROMETHEUS_ADDR`,
/// `PROMETHEUS_PATH`).
pub(super) fn prometheus_listener<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<Option<PrometheusListener>, SettingsError> {
    Ok(if env.bool("USE_PROMETHEUS", false)? {
        let path = env.string("PROMETHEUS_PATH", "/metrics");
        // Route syntax (`{name}`, `*`, `:`) would be read as a pattern, not a path.
        if !path.starts_with('/') || path.contains(['{', '}', '*', ':']) {
            return Err(env.error(
                "PROMETHEUS_PATH",
                "expected a path starting with / and without { } * :",
            ));
        }
        Some(PrometheusListener {
            addr: env.listen_addr("PROMETHEUS_ADDR", ":9090")?,
            path,
        })
    } else {
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::tests::settings;

    #[test]
    fn prometheus_listener_takes_go_addresses() {
        assert!(settings(&[]).unwrap().prometheus.is_none());
        let on = settings(&[("USE_PROMETHEUS", "true"), ("USE_STATSD", "false")])
            .unwrap()
            .prometheus
            .unwrap();
        assert_eq!(on.addr, "0.0.0.0:9090".parse().unwrap());
        assert_eq!(on.path, "/metrics");
        let set = settings(&[
            ("USE_PROMETHEUS", "true"),
            ("USE_STATSD", "false"),
            ("PROMETHEUS_ADDR", "127.0.0.1:9102"),
        ])
        .unwrap()
        .prometheus
        .unwrap();
        assert_eq!(set.addr, "127.0.0.1:9102".parse().unwrap());
        for (name, value) in [("PROMETHEUS_ADDR", "9090"), ("PROMETHEUS_PATH", "/{x}")] {
            let err = settings(&[
                ("USE_PROMETHEUS", "true"),
                ("USE_STATSD", "false"),
                (name, value),
            ])
            .unwrap_err();
            assert_eq!(err.variable, name);
        }
    }

    #[test]
    fn stats_sinks_are_exclusive_and_statsd_is_the_default() {
        let default = settings(&[]).unwrap().stats;
        assert!(default.enabled);
        assert_eq!(
            default.statsd,
            Some(StatsdSink {
                addr: "localhost:8125".into(),
                dog: false
            })
        );
        assert_eq!(default.debug_addr, "0.0.0.0:6070".parse().unwrap());
        let err = settings(&[("USE_PROMETHEUS", "true")]).unwrap_err();
        assert!(
            err.reason.contains("USE_STATSD and USE_PROMETHEUS"),
            "{err}"
        );
        let err = settings(&[
            ("USE_DOG_STATSD", "true"),
            ("USE_PROMETHEUS", "true"),
            ("USE_STATSD", "0"),
        ])
        .unwrap_err();
        assert!(
            err.reason.contains("USE_DOG_STATSD and USE_PROMETHEUS"),
            "{err}"
        );
        let off = settings(&[("DISABLE_STATS", "true"), ("USE_PROMETHEUS", "true")]).unwrap();
        assert!(!off.stats.enabled && off.stats.statsd.is_none());
        let tags = settings(&[("EXTRA_TAGS", "a:1, b:2")])
            .unwrap()
            .stats
            .extra_tags;
        assert_eq!(tags, [("a".into(), "1".into()), ("b".into(), "2".into())]);
        assert_eq!(
            settings(&[("EXTRA_TAGS", "a:1:2")]).unwrap_err().variable,
            "EXTRA_TAGS"
        );
    }
}
