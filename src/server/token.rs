//! Bearer tokens, checked in one place for every API that takes one: the native API
//! (`LIMITER_API_TOKEN`, `named.rs`) and the admin API (`ADMIN_API_TOKEN`, `admin/`). The
//! comparison runs over SHA-256 digests in constant time, so neither the token's bytes nor its
//! length can be learnt from response times; a fingerprint names a token in logs without
//! giving it away.

use std::fmt::Write as _;

/// The token an API expects, as its digest; `None` takes every call.
#[derive(Clone)]
pub(crate) struct Expected {
    digest: Option<[u8; 32]>,
}

impl Expected {
    pub(crate) fn new(token: Option<&str>) -> Self {
        Self {
            digest: token.map(digest),
        }
    }

    /// Whether the call may go on: no token is expected, or `authorization` (the header's or
    /// metadata's value) carries it as a `Bearer` credential.
    pub(crate) fn admits(&self, authorization: Option<&str>) -> bool {
        let Some(expected) = &self.digest else {
            return true;
        };
        let presented = authorization.and_then(bearer_credentials).map(digest);
        presented.is_some_and(|p| {
            // Every byte is compared whatever the first difference, so the time does not depend
            // on where it is.
            p.iter()
                .zip(expected)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
        })
    }
}

fn digest(text: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The first 8 hex digits of the SHA-256 of the credentials `authorization` carries
/// (`printf %s TOKEN | sha256sum | cut -c1-8`), or `none`: who asked, in a log line, without
/// the token. Eight digits tell a few tokens apart and are far too few to find one by.
pub(crate) fn fingerprint(authorization: Option<&str>) -> String {
    let Some(token) = authorization.and_then(bearer_credentials) else {
        return "none".into();
    };
    digest(token)[..4]
        .iter()
        .fold(String::new(), |mut text, byte| {
            let _ = write!(text, "{byte:02x}");
            text
        })
}

/// The token of an `authorization` value that uses the `Bearer` scheme. RFC 7235 (section 2.1)
/// makes the scheme case-insensitive and puts one or more spaces before the credentials, so
/// `bearer <token>` and `BEARER  <token>` name the same token as `Bearer <token>`.
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    let token = rest.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_only_the_token_in_any_case_of_the_scheme() {
        let expected = Expected::new(Some("s3cret"));
        assert!(expected.admits(Some("Bearer s3cret")));
        assert!(expected.admits(Some("bearer   s3cret")));
        assert!(!expected.admits(Some("Bearer s3cre")));
        assert!(!expected.admits(Some("Basic s3cret")));
        assert!(!expected.admits(None));
        assert!(Expected::new(None).admits(None));
    }

    #[test]
    fn a_fingerprint_is_the_digest_s_first_digits() {
        // printf %s s3cret | sha256sum | cut -c1-8
        assert_eq!(fingerprint(Some("Bearer s3cret")), "1ec1c26b");
        assert_eq!(fingerprint(None), "none");
    }
}
