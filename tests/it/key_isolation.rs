//! Key isolation: no descriptor value can make two different descriptors share a counter.
//!
//! Owns the property tests of `sluice::rls::KeyBuilder::fixed_window` and of the decision
//! path (memory store) that back the promise "counter keys escape descriptor values"
//! (docs/upstream-differences.md):
//!
//! * (a) different entry lists under one limit and window never give the same key, whatever the
//!   values contain, including lists of different lengths and every pair that upstream
//!   envoyproxy/ratelimit maps to one key;
//! * (b) a key has no `{`/`}` after the prefix, so a value cannot choose a Redis Cluster hash
//!   tag, and a prefix with braces is refused;
//! * (c) values without `% _ { } *` give byte-for-byte upstream's key, so both services can share
//!   a Redis during a migration;
//! * (d) `share_threshold` collapses every value at its position, and only there;
//! * distinct values of a key-only descriptor never share one budget in a real `RateLimiter`.
//!
//! Threat model (module doc of `src/rls/key.rs`): values come from clients, descriptor keys
//! and the domain come from the operator's Envoy and config. So keys here are drawn from a fixed
//! set of config-like names, and values from anything, biased toward the characters that build
//! keys (`_ : { } * %`), plus newlines, unicode, empty and 4096-byte values.

use sluice_test_kit as kit;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kit::in_process::pinned_limiter;
use proptest::prelude::*;
use sluice::clock::ManualClock;
use sluice::config::{Limit, Unit};
use sluice::proto::{Code, DescriptorEntry, RateLimitDescriptor, RateLimitRequest};
use sluice::rls::{KeyBuilder, RateLimiter, RlsOptions};
use sluice::store::{MemoryStore, MemoryStoreOptions};

/// Descriptor keys as operators write them: Envoy's built-in action keys and typical
/// `descriptor_key`s. Several contain `_`, which is not escaped in keys (upstream's names need
/// it), so this set is what the isolation claim is about: no key here is a `_`-separated prefix of
/// another (`remote` is not a key while `remote_address` is), as in real configs.
const KEYS: &[&str] = &[
    "remote_address",
    "masked_remote_address",
    "generic_key",
    "header_match",
    "query_match",
    "source_cluster",
    "destination_cluster",
    "user",
    "path",
    "tenant",
    "x-api-key",
];

const DOMAIN: &str = "edge";
const WINDOW: u64 = 1_700_000_040;

fn entries(pairs: &[(&str, &str)]) -> Vec<DescriptorEntry> {
    pairs
        .iter()
        .map(|(key, value)| DescriptorEntry {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
        })
        .collect()
}

fn owned(pairs: &[(String, String)]) -> Vec<DescriptorEntry> {
    pairs
        .iter()
        .map(|(key, value)| DescriptorEntry {
            key: key.clone().into_bytes(),
            value: value.clone().into_bytes(),
        })
        .collect()
}

fn limit() -> Limit {
    Limit::from_override(10, Unit::Minute)
}

fn key_of(pairs: &[(String, String)]) -> String {
    KeyBuilder::new("")
        .unwrap()
        .fixed_window(DOMAIN, &owned(pairs), &limit(), WINDOW)
}

/// envoyproxy/ratelimit's `GenerateCacheKey`, written out from its Go source, to compare with.
fn upstream_key(prefix: &str, domain: &str, pairs: &[(String, String)], window: u64) -> String {
    let mut key = format!("{prefix}{domain}_");
    for (k, v) in pairs {
        key.push_str(&format!("{k}_{v}_"));
    }
    key.push_str(&window.to_string());
    key
}

// ---------------------------------------------------------------------------------------------
// Strategies

fn config_key() -> impl Strategy<Value = String> {
    prop::sample::select(KEYS).prop_map(str::to_string)
}

/// Values a client can send, weighted toward the ones that could break a key format.
fn hostile_value() -> impl Strategy<Value = String> {
    prop_oneof![
        // Short strings over the separator and escape alphabet (and the key names' letters, so
        // a value can spell `_user_` or `%5F`): where collisions would be.
        4 => "[_:{}*%\\n5FAaeru7]{0,12}",
        1 => Just(String::new()),
        // Any unicode, including multi-byte characters next to reserved bytes.
        2 => "\\PC{0,24}",
        2 => any::<String>(),
        // Long values up to the default MAX_DESCRIPTOR_VALUE_BYTES (4096).
        1 => ("[_%a{]", 0..=4096usize).prop_map(|(c, n)| c.repeat(n)),
        1 => prop::collection::vec(prop::sample::select(vec!['_', '%', 'é', '*', 'x']), 1024..=2048)
            .prop_map(|chars| chars.into_iter().collect()),
    ]
}

/// Values that upstream and Sluice must write identically: no `% _ { } *`.
fn plain_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-zA-Z0-9./:\\- \\n]{0,20}",
        1 => "[^%_{}*]{0,40}",
        1 => ("[a-z0-9:]", 0..=4096usize).prop_map(|(c, n)| c.repeat(n)),
    ]
}

fn descriptor(
    value: impl Strategy<Value = String>,
) -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec((config_key(), value), 1..=5)
}

/// A descriptor whose first value contains `_<key>_` for a key of the set, and the descriptor
/// upstream cannot tell from it: the value split into two entries there. Example:
/// `[(path, "a_user_b")]` and `[(path, "a"), (user, "b")]` are both `d_path_a_user_b_<ws>`.
/// A descriptor's entries as (key, value) pairs.
type Pairs = Vec<(String, String)>;

fn upstream_twins() -> impl Strategy<Value = (Pairs, Pairs)> {
    (
        config_key(),
        "[^_]{0,8}",
        config_key(),
        hostile_value(),
        prop::collection::vec((config_key(), hostile_value()), 0..=3),
    )
        .prop_map(|(first, before, inner, after, rest)| {
            let mut joined = vec![(first.clone(), format!("{before}_{inner}_{after}"))];
            joined.extend(rest.iter().cloned());
            let mut split = vec![(first, before), (inner, after)];
            split.extend(rest);
            (joined, split)
        })
}

// ---------------------------------------------------------------------------------------------
// (a) different descriptors, different keys

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A batch of random descriptors (1 to 5 entries each, so lengths differ within a batch):
    /// two that differ must not share a key.
    #[test]
    fn different_descriptors_never_share_a_key(
        batch in prop::collection::vec(descriptor(hostile_value()), 2..=24)
    ) {
        let mut seen: HashMap<String, &Vec<(String, String)>> = HashMap::new();
        for pairs in &batch {
            if let Some(other) = seen.insert(key_of(pairs), pairs) {
                prop_assert_eq!(other, pairs, "two descriptors share a counter");
            }
        }
    }

    /// The collisions that exist upstream: every such pair gets two keys here.
    #[test]
    fn upstream_collisions_get_separate_keys((joined, split) in upstream_twins()) {
        // Guards the generator: if upstream did not collide, this test would prove nothing.
        prop_assert_eq!(
            upstream_key("", DOMAIN, &joined, WINDOW),
            upstream_key("", DOMAIN, &split, WINDOW)
        );
        prop_assert_ne!(key_of(&joined), key_of(&split));
    }

    /// Same keys, one value changed anywhere: a different counter. This is the budget-stealing
    /// case (the attacker controls one value and targets another client's counter).
    #[test]
    fn changing_one_value_changes_the_key(
        pairs in descriptor(hostile_value()),
        index in any::<prop::sample::Index>(),
        other in hostile_value(),
    ) {
        let index = index.index(pairs.len());
        prop_assume!(pairs[index].1 != other);
        let mut changed = pairs.clone();
        changed[index].1 = other;
        prop_assert_ne!(key_of(&pairs), key_of(&changed));
    }
}

// ---------------------------------------------------------------------------------------------
// (b) no hash tag from a value

proptest! {
    #[test]
    fn no_braces_after_the_prefix(
        prefix in "[^{}]{0,12}",
        pairs in descriptor(hostile_value()),
    ) {
        let keys = KeyBuilder::new(&prefix).unwrap();
        let key = keys.fixed_window(DOMAIN, &owned(&pairs), &limit(), WINDOW);
        prop_assert!(key.starts_with(&prefix));
        let rest = &key[prefix.len()..];
        prop_assert!(!rest.contains(['{', '}']), "hash tag material in {:?}", rest);
    }

    /// Domains and keys are operator input, but they are escaped too: a `{` typed into a
    /// descriptor_key must not pin counters to one slot either.
    #[test]
    fn braces_in_domain_and_keys_are_escaped(
        domain in "[a-z{}]{1,8}",
        key in "[a-z_{}]{1,8}",
        value in hostile_value(),
    ) {
        let built = KeyBuilder::new("")
            .unwrap()
            .fixed_window(&domain, &entries(&[(&key, &value)]), &limit(), WINDOW);
        prop_assert!(!built.contains(['{', '}']), "{:?}", built);
    }

    #[test]
    fn a_prefix_with_a_brace_is_refused(before in ".{0,8}", brace in "[{}]", after in ".{0,8}") {
        let prefix = format!("{before}{brace}{after}");
        prop_assert!(KeyBuilder::new(&prefix).is_err(), "accepted {:?}", prefix);
    }

    #[test]
    fn a_prefix_without_braces_is_accepted(prefix in "[^{}]{0,32}") {
        prop_assert!(KeyBuilder::new(&prefix).is_ok());
    }
}

// ---------------------------------------------------------------------------------------------
// (c) upstream's bytes for ordinary values

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn plain_values_give_upstream_keys(
        prefix in "[a-z:]{0,8}",
        domain in "[a-z_.-]{1,12}",
        pairs in descriptor(plain_value()),
        window in any::<u64>(),
    ) {
        let keys = KeyBuilder::new(&prefix).unwrap();
        prop_assert_eq!(
            keys.fixed_window(&domain, &owned(&pairs), &limit(), window),
            upstream_key(&prefix, &domain, &pairs, window)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// (d) share_threshold

/// Wildcard patterns as a config writes them (always with a `*`, which `load` enforces).
fn pattern() -> impl Strategy<Value = String> {
    ("[a-z/._]{0,6}", "[a-z/.]{0,4}").prop_map(|(head, tail)| format!("{head}*{tail}"))
}

proptest! {
    /// Every value at the shared position lands on one counter; the other positions still
    /// separate.
    #[test]
    fn shared_position_collapses_every_value(
        pairs in descriptor(hostile_value()),
        index in any::<prop::sample::Index>(),
        pattern in pattern(),
        replacement in hostile_value(),
    ) {
        let position = index.index(pairs.len());
        let mut shared = limit();
        shared.shared_values = vec![(position, pattern.as_str().into())];
        let keys = KeyBuilder::new("").unwrap();
        let mut changed = pairs.clone();
        changed[position].1 = replacement;
        prop_assert_eq!(
            keys.fixed_window(DOMAIN, &owned(&pairs), &shared, WINDOW),
            keys.fixed_window(DOMAIN, &owned(&changed), &shared, WINDOW)
        );
    }

    #[test]
    fn other_positions_still_separate_under_sharing(
        pairs in prop::collection::vec((config_key(), hostile_value()), 2..=5),
        shared_at in any::<prop::sample::Index>(),
        changed_at in any::<prop::sample::Index>(),
        pattern in pattern(),
        other in hostile_value(),
    ) {
        let shared_at = shared_at.index(pairs.len());
        let changed_at = changed_at.index(pairs.len());
        prop_assume!(shared_at != changed_at && pairs[changed_at].1 != other);
        let mut shared = limit();
        shared.shared_values = vec![(shared_at, pattern.as_str().into())];
        let keys = KeyBuilder::new("").unwrap();
        let mut changed = pairs.clone();
        changed[changed_at].1 = other;
        prop_assert_ne!(
            keys.fixed_window(DOMAIN, &owned(&pairs), &shared, WINDOW),
            keys.fixed_window(DOMAIN, &owned(&changed), &shared, WINDOW)
        );
    }

    /// Upstream writes the runtime value, so a client sending the pattern itself (under an
    /// override, or a limit without sharing) lands on the shared counter. Here `*` is escaped.
    #[test]
    fn a_value_spelling_the_pattern_is_not_the_shared_counter(
        pairs in descriptor(hostile_value()),
        index in any::<prop::sample::Index>(),
        pattern in pattern(),
    ) {
        let position = index.index(pairs.len());
        let mut shared = limit();
        shared.shared_values = vec![(position, pattern.as_str().into())];
        let mut spelled = pairs.clone();
        spelled[position].1 = pattern.clone();
        let keys = KeyBuilder::new("").unwrap();
        prop_assert_ne!(
            keys.fixed_window(DOMAIN, &owned(&pairs), &shared, WINDOW),
            keys.fixed_window(DOMAIN, &owned(&spelled), &limit(), WINDOW)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Upstream's documented collisions, as examples

fn sluice_key(pairs: &[(&str, &str)]) -> String {
    KeyBuilder::new("")
        .unwrap()
        .fixed_window("d", &entries(pairs), &limit(), 60)
}

fn upstream(pairs: &[(&str, &str)]) -> String {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    upstream_key("", "d", &pairs, 60)
}

/// Asserts that upstream confuses the two descriptors (so the example is real) and we do not.
fn separated(left: &[(&str, &str)], right: &[(&str, &str)]) {
    assert_eq!(upstream(left), upstream(right), "not an upstream collision");
    assert_ne!(sluice_key(left), sluice_key(right), "{left:?} vs {right:?}");
}

#[test]
fn readme_example_one_value_spelling_two_entries() {
    // docs/upstream-differences.md: upstream writes both as `d_a_x_b_y_60`, so a client that sets
    // a = "x_b_y" spends the budget of whoever is (a = x, b = y).
    separated(&[("a", "x_b_y")], &[("a", "x"), ("b", "y")]);
}

#[test]
fn underscores_moved_between_values() {
    // Same keys, so the same config path and limit: `d_a_p_b_q_b_r_60` both ways upstream. The
    // client who controls `a` can move part of the descriptor across the entry boundary.
    separated(&[("a", "p_b_q"), ("b", "r")], &[("a", "p"), ("b", "q_b_r")]);
}

#[test]
fn a_value_spelling_a_realistic_next_entry() {
    // With Envoy's own key names: a user header value that spells `_remote_address_<ip>`
    // borrows the per-(user, address) counter of the real user at that address.
    separated(
        &[("user", "mallory_remote_address_10.0.0.7")],
        &[("user", "mallory"), ("remote_address", "10.0.0.7")],
    );
}

#[test]
fn key_and_value_boundary() {
    // docs/upstream-differences.md: upstream's `a` + `b_c` and `a_b` + `c` are one counter (and one config match).
    separated(&[("a", "b_c")], &[("a_b", "c")]);
}

#[test]
fn braces_in_a_value_cannot_pick_the_slot() {
    // Upstream's key `d_a_{victim}_60` hashes only `victim` in Redis Cluster: a client picks the
    // slot (and can pile counters on one node). Here the braces are escaped.
    assert_eq!(upstream(&[("a", "{victim}")]), "d_a_{victim}_60");
    assert_eq!(sluice_key(&[("a", "{victim}")]), "d_a_%7Bvictim%7D_60");
}

#[test]
fn escapes_cannot_be_forged() {
    // Not an upstream collision but the classic mistake of an escaping scheme: if `%` were
    // kept, the value "%5F" would become the escaped "_".
    assert_ne!(sluice_key(&[("a", "%5F")]), sluice_key(&[("a", "_")]));
    assert_ne!(sluice_key(&[("a", "%25")]), sluice_key(&[("a", "%")]));
}

#[test]
fn a_value_spelling_a_share_threshold_pattern() {
    // Upstream: a share_threshold limit on `files/*` counts in `d_files_files/*_60`, and a
    // client that sends the literal value `files/*` under an override writes the same key.
    let mut shared = limit();
    shared.shared_values = vec![(0, "files/*".into())];
    let keys = KeyBuilder::new("").unwrap();
    let pattern_key = keys.fixed_window("d", &entries(&[("files", "files/a")]), &shared, 60);
    assert_eq!(pattern_key, "d_files_files/*_60");
    assert_eq!(upstream(&[("files", "files/*")]), pattern_key);
    assert_ne!(sluice_key(&[("files", "files/*")]), pattern_key);
}

// ---------------------------------------------------------------------------------------------
// The decision path: a real RateLimiter on the memory store

/// 40 s into a minute; nothing in these tests moves it, so every request is in one window.
const NOW_MICROS: u64 = 1_700_000_040_000_000;

fn limiter(config: &str) -> RateLimiter {
    let clock = Arc::new(ManualClock::new(NOW_MICROS));
    let store = Arc::new(MemoryStore::new(
        MemoryStoreOptions::default(),
        clock.clone(),
    ));
    pinned_limiter(store, &clock, config, RlsOptions::default())
}

fn ask(limiter: &RateLimiter, domain: &str, pairs: &[(&str, &str)]) -> Code {
    let request = RateLimitRequest {
        domain: domain.as_bytes().to_vec(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries(pairs),
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let response = futures::executor::block_on(limiter.should_rate_limit(&request, None))
        .expect("a valid request is decided");
    Code::try_from(response.overall_code).expect("known code")
}

/// Distinct values from the hostile strategy, within the default value size limit.
fn distinct_values() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(hostile_value(), 1..=24).prop_map(|values| {
        let mut seen = HashSet::new();
        values
            .into_iter()
            .filter(|v| v.len() <= 4096 && seen.insert(v.clone()))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// `key: user` with one request per hour: each user's first request is admitted and its
    /// second refused, whatever the other users sent before. A key collision shows as a first
    /// request refused; the second-request check shows the limit is really being counted.
    #[test]
    fn distinct_users_never_share_a_budget(users in distinct_values()) {
        let limiter = limiter(
            "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        );
        for user in &users {
            prop_assert_eq!(ask(&limiter, "app", &[("user", user)]), Code::Ok, "first request of {:?}", user);
        }
        for user in &users {
            prop_assert_eq!(ask(&limiter, "app", &[("user", user)]), Code::OverLimit, "second request of {:?}", user);
        }
    }
}

/// A per-user limit nested under a `share_threshold` wildcard: the path is shared, the user is
/// not. The domain and the parent's value are parameters: see the dotted-domain test below.
fn nested_share_config(domain: &str, parent_value: &str) -> String {
    format!(
        "domain: {domain}\n\
         descriptors:\n\
         \x20 - key: host\n\
         \x20   value: \"{parent_value}\"\n\
         \x20   descriptors:\n\
         \x20     - key: path\n\
         \x20       value: \"/static/*\"\n\
         \x20       share_threshold: true\n\
         \x20       descriptors:\n\
         \x20         - key: user\n\
         \x20           rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
    )
}

/// For each user: a first request on `/static/a` must be admitted (users do not share), and a
/// second on another `/static/` path must be refused (paths do share). Returns what went wrong.
fn share_threshold_violations(domain: &str, host: &str, users: &[String]) -> Vec<String> {
    let limiter = limiter(&nested_share_config(domain, host));
    let mut violations = Vec::new();
    for (n, user) in users.iter().enumerate() {
        let first = ask(
            &limiter,
            domain,
            &[("host", host), ("path", "/static/a"), ("user", user)],
        );
        if first != Code::Ok {
            violations.push(format!("first request of user {user:?} refused"));
        }
        let other_path = format!("/static/other-{n}");
        let second = ask(
            &limiter,
            domain,
            &[("host", host), ("path", &other_path), ("user", user)],
        );
        if second != Code::OverLimit {
            violations.push(format!(
                "{other_path} not shared with /static/a for {user:?}"
            ));
        }
    }
    violations
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn users_under_a_shared_wildcard_keep_their_own_budget(users in distinct_values()) {
        prop_assert_eq!(share_threshold_violations("app", "api", &users), Vec::<String>::new());
    }
}

/// BUG (src/config/load.rs, `build_level`: `let depth = parent_path.matches('.').count();`):
/// the entry position that `share_threshold` replaces is counted as the dots in the parent's
/// *path*, and that path is `<domain>.<key>_<value>…`, so every `.` inside the domain name or in
/// a parent's key or value shifts it.
///
/// * Domain `shop.example` (one dot): the pattern of the `path` level (position 1) is recorded
///   at position 2, so the *user* value is replaced by `/static/*` and the path is kept: every
///   user shares one budget (bob's first request is refused after alice's), and paths do not.
/// * Parent value `api.example.com` (two dots): position 3, which this descriptor does not
///   have, so nothing is shared at all.
///
/// Fix: pass the depth down `build_level` as a number instead of deriving it from the path.
#[test]
fn dotted_domain_or_parent_value_keeps_users_apart_and_paths_shared() {
    let users: Vec<String> = vec!["alice".into(), "bob".into()];
    assert_eq!(
        share_threshold_violations("shop.example", "api", &users),
        Vec::<String>::new(),
        "dotted domain"
    );
    assert_eq!(
        share_threshold_violations("app", "api.example.com", &users),
        Vec::<String>::new(),
        "dotted parent value"
    );
}

/// Not a value-steered hash tag, so lower stakes than the property above: but the module doc
/// of key.rs says a fixed-window key never has one, and a `share_threshold` pattern is written
/// unescaped, braces included (`{tenant}*` makes `tenant` the Redis Cluster hash tag of that
/// counter; a `}` in a pattern also ends the `{…}` tag of the other algorithms' state keys
/// early). Config-controlled only.
#[test]
fn braces_in_a_share_threshold_pattern_make_no_hash_tag() {
    let mut shared = limit();
    shared.shared_values = vec![(0, "{tenant}*".into())];
    let key = KeyBuilder::new("").unwrap().fixed_window(
        "d",
        &entries(&[("t", "{tenant}x")]),
        &shared,
        60,
    );
    assert!(!key.contains(['{', '}']), "{key}");
}
