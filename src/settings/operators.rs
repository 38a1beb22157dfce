//! The operators' tools (issue #42): the admin API's token (`ADMIN_API_TOKEN`; the API is off
//! without it) and the over-limit decision log (`DECISION_LOG`, `DECISION_LOG_VALUES`,
//! `DECISION_LOG_MAX_PER_SECOND`). The log's other variables are refused while it is off, so a
//! misspelt `DECISION_LOG` does not go unseen.

use sluice::rls::{DecisionLogOptions, LogValues};

use super::{Env, SettingsError};

/// The admin API's token and the decision log's options.
#[derive(Clone, Default)]
pub struct OperatorSettings {
    /// `ADMIN_API_TOKEN`: the admin API is served (debug port, gRPC port) and callers must send
    /// `authorization: Bearer <token>`; `None`: it is not served.
    pub admin_token: Option<String>,
    /// `DECISION_LOG=over_limit`: a line per descriptor judged over its limit.
    pub decision_log: Option<DecisionLogOptions>,
}

impl std::fmt::Debug for OperatorSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorSettings")
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field("decision_log", &self.decision_log)
            .finish()
    }
}

/// The default of `DECISION_LOG_MAX_PER_SECOND`.
const DEFAULT_LINES_PER_SECOND: u64 = 100;

pub(super) fn operator_settings<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<OperatorSettings, SettingsError> {
    let admin_token = env.raw("ADMIN_API_TOKEN");
    if admin_token.as_ref().is_some_and(|t| t.len() < 16) {
        return Err(env.error("ADMIN_API_TOKEN", "must have at least 16 characters"));
    }
    Ok(OperatorSettings {
        admin_token,
        decision_log: decision_log(env)?,
    })
}

fn decision_log<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<Option<DecisionLogOptions>, SettingsError> {
    let on = match env.raw("DECISION_LOG").as_deref() {
        None | Some("" | "off") => false,
        Some("over_limit") => true,
        Some(_) => return Err(env.error("DECISION_LOG", "expected over_limit or off")),
    };
    let names = ["DECISION_LOG_VALUES", "DECISION_LOG_MAX_PER_SECOND"];
    if !on {
        if let Some(name) = names.into_iter().find(|n| env.raw(n).is_some()) {
            return Err(env.error(name, "has no effect unless DECISION_LOG=over_limit"));
        }
        return Ok(None);
    }
    let values = match env.raw("DECISION_LOG_VALUES") {
        None => LogValues::default(),
        Some(text) => LogValues::parse(&text)
            .ok_or_else(|| env.error("DECISION_LOG_VALUES", "expected hash, redact or plain"))?,
    };
    let max_per_second = env.number("DECISION_LOG_MAX_PER_SECOND", DEFAULT_LINES_PER_SECOND)?;
    if max_per_second == 0 {
        return Err(env.error(
            "DECISION_LOG_MAX_PER_SECOND",
            "must be at least 1 (DECISION_LOG=off turns the log off)",
        ));
    }
    Ok(Some(DecisionLogOptions {
        values,
        max_per_second,
    }))
}

#[cfg(test)]
mod tests {
    use crate::settings::tests::settings;
    use sluice::rls::{DecisionLogOptions, LogValues};

    #[test]
    fn both_are_off_by_default_and_the_token_is_never_shown() {
        let off = settings(&[]).unwrap().operators;
        assert!(off.admin_token.is_none() && off.decision_log.is_none());
        let on = settings(&[
            ("ADMIN_API_TOKEN", "0123456789abcdef"),
            ("DECISION_LOG", "over_limit"),
        ])
        .unwrap()
        .operators;
        assert_eq!(on.admin_token.as_deref(), Some("0123456789abcdef"));
        assert!(!format!("{on:?}").contains("0123456789abcdef"));
        assert_eq!(
            on.decision_log,
            Some(DecisionLogOptions {
                values: LogValues::Hash,
                max_per_second: 100
            })
        );
    }

    #[test]
    fn bad_values_name_their_variable() {
        let refused = |vars: &[(&str, &str)]| settings(vars).unwrap_err().variable;
        assert_eq!(refused(&[("ADMIN_API_TOKEN", "short")]), "ADMIN_API_TOKEN");
        assert_eq!(refused(&[("DECISION_LOG", "all")]), "DECISION_LOG");
        assert_eq!(
            refused(&[("DECISION_LOG_VALUES", "hash")]),
            "DECISION_LOG_VALUES"
        );
        let log = ("DECISION_LOG", "over_limit");
        assert_eq!(
            refused(&[log, ("DECISION_LOG_VALUES", "md5")]),
            "DECISION_LOG_VALUES"
        );
        assert_eq!(
            refused(&[log, ("DECISION_LOG_MAX_PER_SECOND", "0")]),
            "DECISION_LOG_MAX_PER_SECOND"
        );
    }
}
