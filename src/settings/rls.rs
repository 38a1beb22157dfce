//! Decision path settings (`sluice::rls`): shadow and quota modes, the rate limit response
//! headers, the bounds on a request's descriptors, the failure policy, the local over-limit cache,
//! and whether counters stop at the limit.

use sluice::rls::{FailurePolicy, HeaderNames, InputLimits, RlsOptions};

use super::{Env, SettingsError};

/// The options of the Envoy decision path.
pub(super) fn rls_options<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<RlsOptions, SettingsError> {
    let response_headers =
        env.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false)?
            .then(|| HeaderNames {
                limit: env.string("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
                remaining: env.string("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
                reset: env.string("LIMIT_RESET_HEADER", "RateLimit-Reset"),
            });
    let defaults = InputLimits::default();
    let input_limits = InputLimits {
        max_descriptors: env.number("MAX_DESCRIPTORS_PER_REQUEST", defaults.max_descriptors)?,
        max_entries: env.number("MAX_ENTRIES_PER_DESCRIPTOR", defaults.max_entries)?,
        max_domain_bytes: env.number("MAX_DOMAIN_BYTES", defaults.max_domain_bytes)?,
        max_key_bytes: env.number("MAX_DESCRIPTOR_KEY_BYTES", defaults.max_key_bytes)?,
        max_value_bytes: env.number("MAX_DESCRIPTOR_VALUE_BYTES", defaults.max_value_bytes)?,
    };
    Ok(RlsOptions {
        shadow_mode: env.bool("SHADOW_MODE", false)?,
        quota_mode: env.bool("QUOTA_MODE", false)?,
        response_headers,
        draft_headers: env.bool("LIMIT_RESPONSE_HEADERS_DRAFT", false)?,
        dynamic_metadata: env.bool("RESPONSE_DYNAMIC_METADATA", false)?,
        input_limits,
        failure_policy: match env.string("FAILURE_POLICY", "fail_closed").as_str() {
            "fail_closed" => FailurePolicy::FailClosed,
            "fail_open" => FailurePolicy::FailOpen,
            "local_share" => FailurePolicy::LocalShare,
            _ => {
                return Err(env.error(
                    "FAILURE_POLICY",
                    "expected fail_closed, fail_open or local_share",
                ));
            }
        },
        local_cache_bytes: env.number("LOCAL_CACHE_SIZE_IN_BYTES", 0usize)?,
        stop_increment_when_over: env.bool("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)?,
    })
}
