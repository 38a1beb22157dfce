//! Counter keys: the one place that decides what a counter is called in a store.
//!
//! # Format
//!
//! A fixed-window counter is named exactly as envoyproxy/ratelimit names it, so that both services
//! can share one Redis while a fleet migrates:
//!
//! ```text
//! <CACHE_KEY_PREFIX><domain>_<key1>_<value1>_<key2>_<value2>_…_<window start, unix seconds>
//! ```
//!
//! with the runtime values, except that an entry matched by a `share_threshold` wildcard uses the
//! pattern (`files_files/*_`), so every value it matches shares one counter.
//!
//! # Escaping: where we differ from upstream, on purpose
//!
//! Upstream's format is ambiguous: `_` separates parts and may also appear inside them, so the
//! descriptor `(a, "x_b_y")` and the descriptor `(a, "x"), (b, "y")` both become `d_a_x_b_y_<ws>`
//! and share one counter: a client that controls a value can spend someone else's budget. Values
//! are the attacker-controlled part (keys and the domain come from the operator's Envoy and config),
//! so values are percent-escaped: `%`, `_`, `{`, `}` and `*` become `%25`, `%5F`, `%7B`, `%7D` and
//! `%2A`. After escaping a value is a single `_`-free token, so with the key sequence fixed by the
//! matched config path, different values can no longer produce the same key; `*` is escaped so a
//! runtime value can never equal a `share_threshold` pattern. Keys and the domain are escaped for
//! `%`, `{` and `}` only (not `_`, which upstream's own key names such as `generic_key` contain).
//!
//! Values without those characters (the vast majority: IPs, header values, paths) give keys
//! identical to upstream's. The cost: during a migration, a value that contains one of them is
//! counted separately by the two services.
//!
//! # Bytes that are not UTF-8
//!
//! Keys and values arrive as bytes (Envoy copies obs-text header bytes into them; see
//! `build.rs`). Each byte of an invalid UTF-8 sequence is written as `%XX`, the rest of the part
//! as above, so the key is still text, and valid UTF-8 parts give exactly the keys they gave
//! when the fields were strings. No invalid value can meet a valid one: a valid part writes
//! every `%` it holds as `%25`, so a `%XX` with `XX` from `80` to `FF` (the only bytes an
//! invalid sequence holds) comes from an invalid byte, and reading each `%XX` back as the byte
//! `XX` gives the request's bytes again, whichever they were: different bytes, different keys.
//! A long part's digest is of its raw bytes.
//!
//! # Long parts: a digest instead of the text
//!
//! A domain, key or value longer than its input limit (`MAX_DOMAIN_BYTES`,
//! `MAX_DESCRIPTOR_KEY_BYTES`, `MAX_DESCRIPTOR_VALUE_BYTES`) is still judged: refusing the request
//! would make Envoy fail open, so one long header would switch every limit off. In the key such a
//! part is written as `%%` followed by the 64 hex digits of the SHA-256 of its bytes. Escaped
//! text never contains `%%` (every `%` it holds is followed by two hex digits), so a digest can
//! never equal a short part, and two long parts share a counter only if SHA-256 collides. The
//! key stays bounded whatever the client sends; upstream, which has no such limit, would write the
//! whole value into Redis.
//!
//! The other algorithms keep their time inside their state, so their keys carry no window:
//! `<prefix>{<domain>_<key1>_<value1>_…}:<algorithm>` (see [`KeyBuilder::state`]).
//!
//! # Several limits on one descriptor (`rate_limits`)
//!
//! Each limit of a `rate_limits` list has its own counter, named after its algorithm and its
//! window length in seconds (the loader refuses two limits of one list that share both), so
//! reordering the list or changing a rate keeps the counters:
//!
//! ```text
//! <prefix>{<domain>_<key1>_<value1>_…}:fixed_window:<window secs>_<window start>
//! <prefix>{<domain>_<key1>_<value1>_…}:<algorithm>:<window secs>
//! ```
//!
//! Both carry the descriptor as their hash tag, so every limit of one descriptor lives in one
//! Redis Cluster slot and one script call decides them together. A descriptor with a single
//! `rate_limit` keeps the keys above.
//!
//! # Redis Cluster slot
//!
//! No escaped part contains `{` or `}`, and the prefix may not contain them either (checked by
//! [`KeyBuilder::new`]). So a lone fixed-window key has no hash tag: Redis hashes the whole key,
//! which spreads descriptors and windows over all slots. The other keys, and every key of a
//! `rate_limits` list, have exactly one tag, the whole descriptor, placed by us. Either way a
//! value cannot choose which part of a key is hashed, and each descriptor's decision touches one
//! slot.

use std::fmt::Write;

use crate::config::Limit;
use crate::proto::DescriptorEntry;
use crate::store::{LimiterKeys, StateKeys};

/// Characters that make a descriptor value ambiguous or steer a Redis Cluster hash tag.
fn reserved_in_value(b: u8) -> bool {
    matches!(b, b'%' | b'_' | b'{' | b'}' | b'*')
}

/// Characters of a domain or descriptor key that could steer a hash tag (or clash with escaping).
fn reserved_in_name(b: u8) -> bool {
    matches!(b, b'%' | b'{' | b'}')
}

/// Rejected at start-up: a prefix with braces would put every key on one Redis Cluster slot.
#[derive(Debug, thiserror::Error)]
#[error(
    "CACHE_KEY_PREFIX must not contain '{{' or '}}' (it would pin every key to one Redis Cluster slot): {0:?}"
)]
pub struct PrefixError(String);

/// Builds counter keys under a fixed prefix.
#[derive(Debug, Clone, Default)]
pub struct KeyBuilder {
    prefix: String,
    /// Parts longer than these (bytes) are written as a digest (see the module doc).
    long: LongParts,
}

/// From how many bytes on a domain, key or value is written as its digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LongParts {
    pub(crate) domain: usize,
    pub(crate) key: usize,
    pub(crate) value: usize,
}

impl Default for LongParts {
    fn default() -> Self {
        let limits = super::InputLimits::default();
        Self {
            domain: limits.max_domain_bytes,
            key: limits.max_key_bytes,
            value: limits.max_value_bytes,
        }
    }
}

/// What marks a digest in a key: never produced by escaping, which writes `%` only before two hex
/// digits.
const DIGEST_MARK: &str = "%%";

impl KeyBuilder {
    /// Keys under `prefix` (`CACHE_KEY_PREFIX`; empty for none). A prefix with `{` or `}`
    /// would be read as a Redis Cluster hash tag and pin every key to one slot, so it is refused.
    pub fn new(prefix: &str) -> Result<Self, PrefixError> {
        if prefix.contains(['{', '}']) {
            return Err(PrefixError(prefix.to_string()));
        }
        Ok(Self {
            prefix: prefix.to_string(),
            long: LongParts::default(),
        })
    }

    /// Uses `long` as the lengths above which parts are digested.
    pub(crate) fn with_long_parts(mut self, long: LongParts) -> Self {
        self.long = long;
        self
    }

    /// The key of the fixed-window counter of `entries` under `limit` for the window that starts
    /// at `window_start` (unix seconds): upstream's format. A calendar window passes its
    /// period's name instead (`2026-11@Europe/Berlin`, `config::Period::label`), so that
    /// replicas agree on the counter by the config alone.
    pub fn fixed_window(
        &self,
        domain: &str,
        entries: &[DescriptorEntry],
        limit: &Limit,
        window_start: impl std::fmt::Display,
    ) -> String {
        let mut key = self.start(domain, entries);
        if limit.member.is_some() {
            self.write_member(&mut key, domain, entries, limit, "fixed_window");
        } else {
            self.write_descriptor(&mut key, domain, entries, limit);
        }
        key.push('_');
        write!(key, "{window_start}").expect("writing to a String cannot fail");
        key
    }

    /// The key of the state of any other algorithm, named after it:
    /// `<prefix>{<domain>_<key1>_<value1>…}:<algorithm>`. The braces make the whole descriptor
    /// the Redis Cluster hash tag, so an algorithm that keeps more than one key could keep them
    /// in one slot, and different descriptors still spread over the slots. The window is not in
    /// the key: these algorithms keep time inside their state, on Redis's clock.
    pub fn state(
        &self,
        domain: &str,
        entries: &[DescriptorEntry],
        limit: &Limit,
        algorithm: &str,
    ) -> String {
        let mut key = self.start(domain, entries);
        if limit.member.is_some() {
            self.write_member(&mut key, domain, entries, limit, algorithm);
            return key;
        }
        key.push('{');
        self.write_descriptor(&mut key, domain, entries, limit);
        key.push_str("}:");
        key.push_str(algorithm);
        key
    }

    /// The demand an RLQS bucket's reporters sent in the window of `window_secs` starting at
    /// `window_start` (`crate::rlqs`): `<state key of algorithm rlqs_demand>:<window secs>:<start>`.
    /// Under the limit's hash tag, so a window and the one before it share a slot; a name no
    /// algorithm has, so it never meets a decision's counter.
    pub fn rlqs_demand(
        &self,
        domain: &str,
        entries: &[DescriptorEntry],
        limit: &Limit,
        (window_secs, window_start): (u64, u64),
    ) -> String {
        let mut key = self.state(domain, entries, limit, "rlqs_demand");
        write!(key, ":{window_secs}:{window_start}").expect("writing to a String cannot fail");
        key
    }

    /// `{<descriptor>}:<algorithm>:<window secs>`: one limit of a `rate_limits` list (see the
    /// module doc). The tag is the same for every limit of the list: one slot for all.
    fn write_member(
        &self,
        key: &mut String,
        domain: &str,
        entries: &[DescriptorEntry],
        limit: &Limit,
        algorithm: &str,
    ) {
        key.push('{');
        self.write_descriptor(key, domain, entries, limit);
        key.push_str("}:");
        key.push_str(algorithm);
        let window = limit.quota.window_secs().unwrap_or(0);
        write!(key, ":{window}").expect("writing to a String cannot fail");
    }

    /// The keys of a named limiter (native API): `<prefix>{limiter_<name>}:config`, `:state`,
    /// `:epoch`, `:clients` (the per-limiter cap's set of clients), and `:state:<client>` /
    /// `:epoch:<client>` for a client. One hash tag for all, so
    /// one script can use them together. The name is escaped like a descriptor value, so its
    /// braces cannot move the tag and `limiter_<name>` has a single raw `_`, unlike any
    /// descriptor key's `<domain>_<key>_<value>`.
    pub fn limiter(&self, name: &str, client: Option<&str>) -> LimiterKeys {
        let mut tag = String::with_capacity(self.prefix.len() + name.len() + 12);
        tag.push_str(&self.prefix);
        tag.push_str("{limiter_");
        escape_into(&mut tag, name.as_bytes(), reserved_in_value);
        tag.push('}');
        let state_keys = |suffix: &str| {
            let mut state = format!("{tag}:state");
            let mut epoch = format!("{tag}:epoch");
            if !suffix.is_empty() {
                for key in [&mut state, &mut epoch] {
                    key.push(':');
                    escape_into(key, suffix.as_bytes(), reserved_in_value);
                }
            }
            StateKeys { state, epoch }
        };
        LimiterKeys {
            config: format!("{tag}:config"),
            shared: state_keys(""),
            client: client.map(state_keys),
            clients: format!("{tag}:clients"),
            client_id: client.unwrap_or_default().to_string(),
        }
    }

    /// The registry of named limiters (which exist, until when each is kept while idle):
    /// `<prefix>{limiters}:registry`. Its tag differs from every limiter's `{limiter_<name>}`.
    pub(crate) fn limiter_registry(&self) -> String {
        format!("{}{{limiters}}:registry", self.prefix)
    }

    fn start(&self, domain: &str, entries: &[DescriptorEntry]) -> String {
        // Long parts become 66-byte digests; this is only a capacity hint.
        let long = self.long;
        let size = self.prefix.len()
            + domain.len().min(long.domain)
            + entries
                .iter()
                .map(|e| e.key.len().min(long.key) + e.value.len().min(long.value) + 70)
                .sum::<usize>()
            + 24;
        let mut key = String::with_capacity(size);
        key.push_str(&self.prefix);
        key
    }

    /// `<domain>_<key1>_<value1>_…_<keyN>_<valueN>`, escaped as the module doc says.
    fn write_descriptor(
        &self,
        key: &mut String,
        domain: &str,
        entries: &[DescriptorEntry],
        limit: &Limit,
    ) {
        let long = self.long;
        part_into(key, domain.as_bytes(), long.domain, reserved_in_name);
        for (index, entry) in entries.iter().enumerate() {
            key.push('_');
            part_into(key, &entry.key, long.key, reserved_in_name);
            key.push('_');
            match limit.shared_value(index) {
                // The pattern comes from the config, not the request: its `*` stays raw, which
                // no escaped runtime value can contain, so the two never meet; its braces are
                // escaped like a name's so they cannot form a hash tag.
                Some(pattern) => escape_text_into(key, pattern, reserved_in_name),
                None => part_into(key, &entry.value, long.value, reserved_in_value),
            }
        }
    }
}

/// Writes `text` escaped, or as its digest when it is longer than `max` bytes.
fn part_into(out: &mut String, text: &[u8], max: usize, reserved: fn(u8) -> bool) {
    if text.len() <= max {
        return escape_into(out, text, reserved);
    }
    out.push_str(DIGEST_MARK);
    let digest = ring::digest::digest(&ring::digest::SHA256, text);
    for byte in digest.as_ref() {
        write!(out, "{byte:02x}").expect("writing to a String cannot fail");
    }
}

/// Writes `text` with its reserved characters as `%XX`, and each byte of an invalid UTF-8
/// sequence as `%XX` too (see "Bytes that are not UTF-8" in the module doc).
fn escape_into(out: &mut String, text: &[u8], reserved: fn(u8) -> bool) {
    for chunk in text.utf8_chunks() {
        escape_text_into(out, chunk.valid(), reserved);
        for byte in chunk.invalid() {
            write!(out, "%{byte:02X}").expect("writing to a String cannot fail");
        }
    }
}

fn escape_text_into(out: &mut String, text: &str, reserved: fn(u8) -> bool) {
    let mut rest = text;
    while let Some(at) = rest.bytes().position(reserved) {
        out.push_str(&rest[..at]);
        write!(out, "%{:02X}", rest.as_bytes()[at]).expect("writing to a String cannot fail");
        // Reserved characters are ASCII, so `at + 1` is a char boundary.
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::config::{Limit, Unit};

    fn e(pairs: &[(&str, &str)]) -> Vec<DescriptorEntry> {
        pairs
            .iter()
            .map(|(k, v)| DescriptorEntry {
                key: k.as_bytes().to_vec(),
                value: v.as_bytes().to_vec(),
            })
            .collect()
    }

    fn limit() -> Limit {
        Limit::from_override(10, Unit::Minute)
    }

    #[test]
    fn ordinary_values_give_upstream_keys() {
        let keys = KeyBuilder::new("").unwrap();
        // Upstream's own examples (test/redis/fixed_cache_impl_test.go).
        assert_eq!(
            keys.fixed_window("domain", &e(&[("key", "value")]), &limit(), 1234),
            "domain_key_value_1234"
        );
        assert_eq!(
            keys.fixed_window(
                "domain",
                &e(&[("key2", "value2"), ("subkey2", "subvalue2")]),
                &limit(),
                1200
            ),
            "domain_key2_value2_subkey2_subvalue2_1200"
        );
        let prefixed = KeyBuilder::new("prefix:").unwrap();
        assert_eq!(
            prefixed.fixed_window("d", &e(&[("remote_address", "10.0.0.1")]), &limit(), 60),
            "prefix:d_remote_address_10.0.0.1_60"
        );
        // Empty runtime value, as upstream writes it.
        assert_eq!(
            keys.fixed_window("d", &e(&[("k", "")]), &limit(), 5),
            "d_k__5"
        );
    }

    #[test]
    fn share_threshold_uses_the_pattern() {
        let keys = KeyBuilder::new("").unwrap();
        let mut shared = limit();
        shared.shared_values = vec![(0, "files/*".into())];
        assert_eq!(
            keys.fixed_window(
                "share-threshold-test",
                &e(&[("files", "files/a")]),
                &shared,
                60
            ),
            "share-threshold-test_files_files/*_60"
        );
        // A runtime value that spells the pattern does not land on the shared counter.
        assert_ne!(
            keys.fixed_window(
                "share-threshold-test",
                &e(&[("files", "files/*")]),
                &limit(),
                60
            ),
            "share-threshold-test_files_files/*_60"
        );
    }

    #[test]
    fn long_parts_become_digests_that_no_short_part_can_equal() {
        let keys = KeyBuilder::new("").unwrap().with_long_parts(LongParts {
            domain: 8,
            key: 8,
            value: 8,
        });
        let digest_of = |text: &str| {
            let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
            let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            format!("%%{hex}")
        };
        let long = "v".repeat(9);
        let key = keys.fixed_window("d", &e(&[("k", &long)]), &limit(), 60);
        assert_eq!(key, format!("d_k_{}_60", digest_of(&long)));
        // At the limit: the text itself.
        let key = keys.fixed_window("d", &e(&[("k", "12345678")]), &limit(), 60);
        assert_eq!(key, "d_k_12345678_60");
        // A short value that spells a digest is escaped, so it cannot meet a long one's key.
        let roomy = KeyBuilder::new("").unwrap().with_long_parts(LongParts {
            value: 100,
            ..LongParts::default()
        });
        let long = "v".repeat(101);
        let forged = digest_of(&long);
        let key = roomy.fixed_window("d", &e(&[("k", &forged)]), &limit(), 60);
        assert_eq!(key, format!("d_k_%25%25{}_60", &forged[2..]));
        let key = roomy.fixed_window("d", &e(&[("k", &long)]), &limit(), 60);
        assert_eq!(key, format!("d_k_{forged}_60"));
        // Long domains and keys too, in the state keys as well.
        let key = keys.state(
            &"D".repeat(9),
            &e(&[(&"K".repeat(9), "v")]),
            &limit(),
            "gcra",
        );
        assert_eq!(
            key,
            format!(
                "{{{}_{}_v}}:gcra",
                digest_of(&"D".repeat(9)),
                digest_of(&"K".repeat(9))
            )
        );
    }

    #[test]
    fn hostile_values_are_escaped() {
        let keys = KeyBuilder::new("").unwrap();
        assert_eq!(
            keys.fixed_window("d", &e(&[("k", "a_b{c}*%")]), &limit(), 1),
            "d_k_a%5Fb%7Bc%7D%2A%25_1"
        );
        assert_eq!(
            keys.fixed_window("d{x}", &e(&[("k{", "v")]), &limit(), 1),
            "d%7Bx%7D_k%7B_v_1"
        );
        assert!(KeyBuilder::new("a{b}").is_err());
    }

    #[test]
    fn upstream_collisions_are_separated() {
        let keys = KeyBuilder::new("").unwrap();
        let upstream = |pairs: &[(&str, &str)]| {
            let mut key = String::from("d_");
            for (k, v) in pairs {
                key.push_str(&format!("{k}_{v}_"));
            }
            key + "60"
        };
        type Entries<'a> = &'a [(&'a str, &'a str)];
        let pairs: &[(Entries, Entries)] = &[
            // One entry whose value spells a second entry, vs two entries.
            (&[("a", "x_b_y")], &[("a", "x"), ("b", "y")]),
            // The same depth, underscores moved from one value into the next entry.
            (&[("a", "x_c"), ("d", "y")], &[("a", "x"), ("c", "d_y")]),
        ];
        for (left, right) in pairs {
            assert_eq!(
                upstream(left),
                upstream(right),
                "upstream collides on {left:?}"
            );
            let l = keys.fixed_window("d", &e(left), &limit(), 60);
            let r = keys.fixed_window("d", &e(right), &limit(), 60);
            assert_ne!(l, r, "{left:?} vs {right:?}");
        }
        // Percent signs cannot forge an escape.
        assert_ne!(
            keys.fixed_window("d", &e(&[("a", "%5F")]), &limit(), 60),
            keys.fixed_window("d", &e(&[("a", "_")]), &limit(), 60)
        );
    }

    #[test]
    fn distinct_values_under_one_key_path_never_share_a_key() {
        // Exhaustive over a small alphabet that includes every separator and escape character.
        let alphabet = ['a', '_', '%', '5', 'F', '{', '}', '*', ':'];
        let mut values = vec![String::new()];
        for _ in 0..3 {
            let mut next = Vec::new();
            for v in &values {
                for c in alphabet {
                    next.push(format!("{v}{c}"));
                }
            }
            values.extend(next);
        }
        values.sort();
        values.dedup();
        let keys = KeyBuilder::new("").unwrap();
        let mut seen = HashSet::new();
        for first in values.iter().step_by(7) {
            for second in &values {
                let key = keys.fixed_window("d", &e(&[("a", first), ("b", second)]), &limit(), 60);
                assert!(!key[..key.len() - 2].contains('{'), "brace in {key}");
                assert!(seen.insert(key.clone()), "collision on {key}");
            }
        }
    }

    /// One entry `k` with the raw bytes `value`.
    fn raw(value: &[u8]) -> Vec<DescriptorEntry> {
        vec![DescriptorEntry {
            key: b"k".to_vec(),
            value: value.to_vec(),
        }]
    }

    /// The value part of `d_k_<value>_60`, read back: each `%XX` as the byte `XX`.
    fn unescape(key: &str) -> Vec<u8> {
        let part = &key.as_bytes()["d_k_".len()..key.len() - "_60".len()];
        let mut out = Vec::new();
        let mut i = 0;
        while i < part.len() {
            if part[i] == b'%' {
                let hex = std::str::from_utf8(&part[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            } else {
                out.push(part[i]);
                i += 1;
            }
        }
        out
    }

    /// The key format before values were bytes: reserved characters escaped, nothing else.
    fn as_before(value: &str) -> String {
        let mut out = String::from("d_k_");
        for c in value.chars() {
            match c {
                '%' | '_' | '{' | '}' | '*' => out.push_str(&format!("%{:02X}", c as u32)),
                c => out.push(c),
            }
        }
        out + "_60"
    }

    #[test]
    fn bytes_that_are_not_utf8_are_percent_escaped() {
        let keys = KeyBuilder::new("").unwrap();
        let key = |value: &[u8]| keys.fixed_window("d", &raw(value), &limit(), 60);
        assert_eq!(key(b"userC\xff"), "d_k_userC%FF_60");
        // The text that spells the escape is escaped itself: a different counter.
        assert_eq!(key(b"userC%FF"), "d_k_userC%25FF_60");
        // Valid sequences around an invalid one stay as they are.
        assert_eq!(key(b"\xc3\xa9\xc3(_"), "d_k_\u{e9}%C3(%5F_60");
        assert_eq!(key(b"\xed\xa0\x80"), "d_k_%ED%A0%80_60");
        // Keys of descriptors (used with Envoy's override limits) alike.
        let entries = vec![DescriptorEntry {
            key: b"x\xfe%".to_vec(),
            value: b"v".to_vec(),
        }];
        assert_eq!(
            keys.fixed_window("d", &entries, &limit(), 60),
            "d_x%FE%25_v_60"
        );
        // Over the length limit: the digest of the raw bytes.
        let short = KeyBuilder::new("").unwrap().with_long_parts(LongParts {
            value: 4,
            ..LongParts::default()
        });
        let long = b"\xff\xff\xff\xff\xff";
        let digest = ring::digest::digest(&ring::digest::SHA256, long);
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            short.fixed_window("d", &raw(long), &limit(), 60),
            format!("d_k_%%{hex}_60")
        );
    }

    proptest::proptest! {
        /// Every byte sequence reads back from its key, so two different ones never share a
        /// counter, valid UTF-8 or not.
        #[test]
        fn any_bytes_read_back_from_their_key(
            value in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::prelude::any::<u8>(),
                    proptest::sample::select(b"%_{}*2F5Aa\xc3\xa9".to_vec()),
                ],
                0..24,
            )
        ) {
            let keys = KeyBuilder::new("").unwrap();
            let key = keys.fixed_window("d", &raw(&value), &limit(), 60);
            proptest::prop_assert_eq!(unescape(&key), value);
        }

        /// Valid UTF-8 gives exactly the key it gave when the fields were strings.
        #[test]
        fn valid_values_keep_their_keys(value in "[%_{}*a-z\u{e9}\u{1F600}\u{80}-\u{7FF}]{0,16}|\\PC{0,16}") {
            let keys = KeyBuilder::new("").unwrap();
            let key = keys.fixed_window("d", &raw(value.as_bytes()), &limit(), 60);
            proptest::prop_assert_eq!(key, as_before(&value));
        }
    }
}
