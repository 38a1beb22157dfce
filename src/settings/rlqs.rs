//! Quota service settings (`sluice::rlqs`, Envoy's `rate_limit_quota` filter): the bounds on
//! what Envoys holding quota streams can make Sluice keep (streams, buckets a stream), and how
//! long an unreported bucket is kept. The demand window is not a setting: Envoy 1.40 reports every
//! 5 s whatever it is told, and the window must hold two reports.

use sluice::rlqs::RlqsOptions;

use super::{Env, SettingsError};

/// `RLQS_MAX_STREAMS`, `RLQS_MAX_BUCKETS_PER_STREAM` and `RLQS_BUCKET_IDLE_EXPIRY`.
pub(super) fn rlqs_options<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<RlqsOptions, SettingsError> {
    let defaults = RlqsOptions::default();
    let options = RlqsOptions {
        max_streams: env.number("RLQS_MAX_STREAMS", defaults.max_streams)?,
        max_buckets_per_stream: env.number(
            "RLQS_MAX_BUCKETS_PER_STREAM",
            defaults.max_buckets_per_stream,
        )?,
        idle_bucket: env.duration("RLQS_BUCKET_IDLE_EXPIRY", defaults.idle_bucket)?,
        ..defaults
    };
    // Zero would refuse every stream or answer no bucket: a quota service that is on but serves
    // nothing, which nobody means to deploy.
    if options.max_streams == 0 {
        return Err(env.error("RLQS_MAX_STREAMS", "must be at least 1"));
    }
    if options.max_buckets_per_stream == 0 {
        return Err(env.error("RLQS_MAX_BUCKETS_PER_STREAM", "must be at least 1"));
    }
    // A bucket must outlive the time between two reports of it, or it is abandoned while in use.
    let between_reports = std::time::Duration::from_secs(2 * defaults.demand_window_secs);
    if options.idle_bucket < between_reports {
        return Err(env.error(
            "RLQS_BUCKET_IDLE_EXPIRY",
            format!(
                "must be at least {}s (two demand windows)",
                between_reports.as_secs()
            ),
        ));
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::settings::tests::settings;

    #[test]
    fn quota_bounds_have_defaults_and_refuse_what_would_serve_nothing() {
        let defaults = settings(&[]).unwrap().rlqs;
        assert_eq!(defaults.max_streams, 1024);
        assert_eq!(defaults.max_buckets_per_stream, 1000);
        assert_eq!(defaults.idle_bucket, Duration::from_secs(300));
        let set = settings(&[
            ("RLQS_MAX_STREAMS", "8"),
            ("RLQS_MAX_BUCKETS_PER_STREAM", "50"),
            ("RLQS_BUCKET_IDLE_EXPIRY", "1m"),
        ])
        .unwrap()
        .rlqs;
        assert_eq!(
            (set.max_streams, set.max_buckets_per_stream, set.idle_bucket),
            (8, 50, Duration::from_secs(60))
        );
        for (name, value) in [
            ("RLQS_MAX_STREAMS", "0"),
            ("RLQS_MAX_BUCKETS_PER_STREAM", "0"),
            ("RLQS_MAX_STREAMS", "many"),
            ("RLQS_BUCKET_IDLE_EXPIRY", "5s"),
        ] {
            let err = settings(&[(name, value)]).unwrap_err();
            assert_eq!(err.variable, name, "{err}");
        }
    }
}
