//! The client's address as proxies of your own forwarded it ([`x_forwarded_for`],
//! [`forwarded`]), keyed by its prefix (`ip.rs`).
//!
//! Each proxy appends the address it received the request from, so the list grows to the
//! right and only its rightmost entries, those your own proxies wrote, can be trusted: the
//! client writes the rest, and would get a fresh budget for every address it made up. The
//! client's address is therefore the entry `trusted_hops` from the right, never the leftmost.
//! A list too short to hold it, or an entry there that is not an address, is a refusal
//! ([`Missing::Request`]), never a pass and never a fallback to an entry further left.
//!
//! Lines of the header are one list, in order (RFC 9110, section 5.3). Elements are read from
//! the right and only as far as needed; a `Forwarded` line is split at commas outside quoted
//! strings (RFC 7239), so a quoted comma cannot shift the count.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::{FORWARDED, GetAll, HeaderName, HeaderValue};
use http::request::Parts;

use super::ip::Prefixes;
use super::{Key, KeyExtractor, Missing};

/// The key of the client's address as proxies forwarded it; made by [`x_forwarded_for`] or
/// [`forwarded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardedIp {
    syntax: Syntax,
    trusted_hops: usize,
    prefixes: Prefixes,
}

/// Which header, and so which list syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Syntax {
    /// `X-Forwarded-For: client, proxy1`: bare addresses.
    XForwardedFor,
    /// RFC 7239's `Forwarded: for=client;proto=https, for="[2001:db8::1]:4711"`.
    Forwarded,
}

/// The client's IP address from `X-Forwarded-For`, the entry `trusted_hops` from the right:
/// `trusted_hops` is how many proxies of your own the request passes, each appending the
/// address it received the request from (1 for one load balancer or Envoy in front of the
/// service). Keyed as [`super::peer_ip`] keys addresses: IPv6 by its /64, IPv4-mapped as IPv4.
///
/// Entries may carry a port (`192.0.2.1:4711`, `[2001:db8::1]:4711`). A request whose list
/// has fewer than `trusted_hops` entries, or whose entry there is not an address (`unknown`
/// included), is refused with [`Missing::Request`]; `trusted_hops` 0 refuses every request
/// ([`Missing::Wiring`]): without a proxy of yours, nothing in the header is trustworthy, so
/// key on [`super::peer_ip`] instead.
///
/// Use it only when every request reaches the service through those proxies. A client that
/// can reach the service directly writes the whole list.
pub fn x_forwarded_for(trusted_hops: usize) -> ForwardedIp {
    ForwardedIp {
        syntax: Syntax::XForwardedFor,
        trusted_hops,
        prefixes: Prefixes::default(),
    }
}

/// The client's IP address from RFC 7239's `Forwarded`: the `for=` parameter of the element
/// `trusted_hops` from the right, as [`x_forwarded_for`] reads its list (the same rules and
/// refusals). `for="[2001:db8::1]:4711"` is read as `2001:db8::1`; an element without `for=`,
/// with two of them, or whose node is `unknown` or obfuscated (`for=_hidden`, which may change
/// per request) is refused.
pub fn forwarded(trusted_hops: usize) -> ForwardedIp {
    ForwardedIp {
        syntax: Syntax::Forwarded,
        ..x_forwarded_for(trusted_hops)
    }
}

impl ForwardedIp {
    /// Keys IPv6 addresses by their first `len` bits (64 unless set; above 128 counts as 128),
    /// as [`super::PeerIp::ipv6_prefix`].
    pub fn ipv6_prefix(self, len: u8) -> Self {
        ForwardedIp {
            prefixes: self.prefixes.with_v6(len),
            ..self
        }
    }

    /// Keys IPv4 addresses by their first `len` bits (32 unless set; above 32 counts as 32),
    /// as [`super::PeerIp::ipv4_prefix`].
    pub fn ipv4_prefix(self, len: u8) -> Self {
        ForwardedIp {
            prefixes: self.prefixes.with_v4(len),
            ..self
        }
    }

    /// The client's address in `request`'s header.
    fn client_ip(&self, request: &Parts) -> Result<IpAddr, Missing> {
        let name = self.syntax.name();
        if self.trusted_hops == 0 {
            return Err(Missing::Wiring(
                format!("{name} read with 0 trusted hops: no entry of it can be trusted").into(),
            ));
        }
        let lines = request.headers.get_all(self.syntax.header());
        let entry = nth_from_right(lines, self.trusted_hops, self.syntax)?;
        let node = match self.syntax {
            Syntax::XForwardedFor => Cow::Borrowed(entry),
            Syntax::Forwarded => Cow::Owned(for_parameter(entry).map_err(|why| {
                Missing::Request(format!("the client's {name} element {why}").into())
            })?),
        };
        node_ip(&node).map_err(|unusable| {
            let why = match unusable {
                Unusable::Hidden => "hides the address (unknown or obfuscated)",
                Unusable::Malformed => "is not an IP address",
            };
            Missing::Request(format!("the client's {name} entry {why}").into())
        })
    }
}

impl KeyExtractor for ForwardedIp {
    fn key(&self, request: &Parts) -> Key {
        match self.client_ip(request) {
            Ok(ip) => Key::Value(self.prefixes.key(ip)),
            Err(missing) => Key::Missing(missing),
        }
    }
}

impl Syntax {
    fn name(self) -> &'static str {
        match self {
            Syntax::XForwardedFor => "X-Forwarded-For",
            Syntax::Forwarded => "Forwarded",
        }
    }

    fn header(self) -> HeaderName {
        match self {
            Syntax::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            Syntax::Forwarded => FORWARDED,
        }
    }

    /// One line's elements, trimmed, empty ones dropped (RFC 9110's list rule); `None` when a
    /// `Forwarded` line leaves a quoted string open.
    fn elements(self, line: &[u8]) -> Option<Vec<&[u8]>> {
        match self {
            Syntax::XForwardedFor => Some(
                line.split(|&b| b == b',')
                    .map(<[u8]>::trim_ascii)
                    .filter(|e| !e.is_empty())
                    .collect(),
            ),
            Syntax::Forwarded => split_outside_quotes(line, b','),
        }
    }
}

/// The `n`th element from the right (1 is the rightmost) of the list every line of the header
/// makes, in order. Lines left of the one holding it are not read.
fn nth_from_right<'a>(
    lines: GetAll<'a, HeaderValue>,
    n: usize,
    syntax: Syntax,
) -> Result<&'a [u8], Missing> {
    let name = syntax.name();
    let mut seen = 0;
    for line in lines.iter().rev() {
        let elements = syntax.elements(line.as_bytes()).ok_or_else(|| {
            Missing::Request(format!("{name} has a quoted string that is not closed").into())
        })?;
        if let Some(element) = elements.iter().rev().nth(n - seen - 1) {
            return Ok(element);
        }
        seen += elements.len();
    }
    Err(Missing::Request(
        format!("{name} has {seen} entries, fewer than the {n} trusted hops").into(),
    ))
}

/// `text` split at each `separator` outside quoted strings (a backslash inside one escapes the
/// next byte), parts trimmed and empty ones dropped; `None` when a quoted string is not closed.
fn split_outside_quotes(text: &[u8], separator: u8) -> Option<Vec<&[u8]>> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, &byte) in text.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && byte == b'\\' {
            escaped = true;
        } else if byte == b'"' {
            quoted = !quoted;
        } else if byte == separator && !quoted {
            parts.push(&text[start..i]);
            start = i + 1;
        }
    }
    if quoted {
        return None;
    }
    parts.push(&text[start..]);
    let parts = parts.into_iter().map(<[u8]>::trim_ascii);
    Some(parts.filter(|p| !p.is_empty()).collect())
}

/// The value of the one `for` parameter of a `Forwarded` element, unquoted; the error says
/// what is wrong, after "the client's Forwarded element".
fn for_parameter(element: &[u8]) -> Result<Vec<u8>, &'static str> {
    // The element's quotes are balanced: the line was split with them.
    let pairs = split_outside_quotes(element, b';').unwrap_or_default();
    let mut found = None;
    for pair in pairs {
        let at = pair
            .iter()
            .position(|&b| b == b'=')
            .ok_or("has a parameter without a value")?;
        if !pair[..at].trim_ascii().eq_ignore_ascii_case(b"for") {
            continue;
        }
        if found.is_some() {
            return Err("has two for= parameters");
        }
        found = Some(unquote(pair[at + 1..].trim_ascii()).ok_or("has a malformed for= value")?);
    }
    found.ok_or("has no for= parameter")
}

/// A token as it is, or a quoted string's content with its escapes undone; `None` for a quoted
/// string followed by more text.
fn unquote(value: &[u8]) -> Option<Vec<u8>> {
    let Some(rest) = value.strip_prefix(b"\"") else {
        return Some(value.to_vec());
    };
    let mut content = Vec::with_capacity(rest.len());
    let mut bytes = rest.iter();
    while let Some(&byte) = bytes.next() {
        match byte {
            b'\\' => content.push(*bytes.next()?),
            b'"' => return bytes.as_slice().is_empty().then_some(content),
            _ => content.push(byte),
        }
    }
    None
}

/// Why a node gives no address.
enum Unusable {
    /// `unknown` or an obfuscated identifier (`_abc`): the proxy chose not to tell.
    Hidden,
    Malformed,
}

/// The address of a node: `192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`, `[2001:db8::1]`,
/// `[2001:db8::1]:4711` (a port may be obfuscated, `:_p1`, as RFC 7239 allows).
fn node_ip(node: &[u8]) -> Result<IpAddr, Unusable> {
    let text = std::str::from_utf8(node).map_err(|_| Unusable::Malformed)?;
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(ip);
    }
    let (name, port) = match text.strip_prefix('[') {
        Some(bracketed) => {
            let (inside, after) = bracketed.split_once(']').ok_or(Unusable::Malformed)?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or(Unusable::Malformed)?),
            };
            (inside, port)
        }
        None => match text.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (text, None),
        },
    };
    if port.is_some_and(|port| !is_port(port)) {
        return Err(Unusable::Malformed);
    }
    if name.eq_ignore_ascii_case("unknown") || name.starts_with('_') {
        return Err(Unusable::Hidden);
    }
    let bracketed = text.starts_with('[');
    match (
        bracketed,
        name.parse::<Ipv6Addr>(),
        name.parse::<Ipv4Addr>(),
    ) {
        (true, Ok(v6), _) => Ok(IpAddr::V6(v6)),
        (false, _, Ok(v4)) => Ok(IpAddr::V4(v4)),
        _ => Err(Unusable::Malformed),
    }
}

/// A port number, or an obfuscated one (`_` and letters, digits, `.`, `_`, `-`).
fn is_port(port: &str) -> bool {
    let digits = !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    let obfuscated = port.len() > 1
        && port.starts_with('_')
        && port
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    digits || obfuscated
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request carrying `lines` of `header`, each a header line of its own.
    fn request(header: &str, lines: &[&str]) -> Parts {
        let mut builder = http::Request::builder();
        for line in lines {
            builder = builder.header(header, *line);
        }
        builder.body(()).unwrap().into_parts().0
    }

    fn xff(hops: usize, lines: &[&str]) -> Key {
        x_forwarded_for(hops).key(&request("x-forwarded-for", lines))
    }

    fn fwd(hops: usize, lines: &[&str]) -> Key {
        forwarded(hops).key(&request("forwarded", lines))
    }

    fn value(v: &str) -> Key {
        Key::Value(v.into())
    }

    /// The reason of a refusal for something the request lacks.
    fn refused(key: Key) -> String {
        match key {
            Key::Missing(Missing::Request(reason)) => reason.into_owned(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_entry_trusted_hops_from_the_right_is_the_client() {
        let list = ["198.51.100.1, 203.0.113.7, 10.0.0.2"];
        assert_eq!(xff(1, &list), value("10.0.0.2"));
        assert_eq!(xff(2, &list), value("203.0.113.7"));
        assert_eq!(xff(3, &list), value("198.51.100.1"));
    }

    #[test]
    fn a_spoofed_leftmost_entry_changes_nothing() {
        for spoof in [
            "1.1.1.1",
            "2001:db8:ffff::1",
            "not an address",
            "unknown",
            "_x",
        ] {
            let header = format!("{spoof}, 203.0.113.7");
            assert_eq!(xff(1, &[&header]), value("203.0.113.7"), "{spoof}");
            let header = format!("for={spoof}, for=203.0.113.7");
            assert_eq!(fwd(1, &[&header]), value("203.0.113.7"), "{spoof}");
        }
        assert_eq!(xff(1, &["\", 203.0.113.7"]), value("203.0.113.7"));
        // A quote left open swallows what follows on its line: refused, never the client's
        // choice.
        refused(fwd(1, &["for=\", for=203.0.113.7"]));
    }

    #[test]
    fn a_list_shorter_than_the_trusted_hops_is_refused_not_read_from_the_left() {
        let reason = refused(xff(2, &["203.0.113.7"]));
        assert_eq!(
            reason,
            "X-Forwarded-For has 1 entries, fewer than the 2 trusted hops"
        );
        refused(xff(1, &[]));
        refused(xff(1, &[" , ,"]));
        refused(fwd(3, &["for=192.0.2.1, for=192.0.2.2"]));
        refused(fwd(1, &[]));
    }

    #[test]
    fn zero_trusted_hops_is_a_wiring_error() {
        for key in [xff(0, &["192.0.2.1"]), fwd(0, &["for=192.0.2.1"])] {
            assert!(matches!(key, Key::Missing(Missing::Wiring(_))), "{key:?}");
        }
    }

    #[test]
    fn a_malformed_or_hidden_client_entry_is_refused() {
        for entry in [
            "not-an-ip",
            "unknown",
            "192.0.2.1:port",
            "[192.0.2.1]",
            "_abc",
            "[::1",
        ] {
            let header = format!("192.0.2.9, {entry}, 10.0.0.1");
            refused(xff(2, &[&header]));
        }
        let hidden = refused(xff(1, &["192.0.2.9, unknown"]));
        assert!(hidden.contains("hides"), "{hidden}");
        let malformed = refused(xff(1, &["192.0.2.9, 192.0.2.300"]));
        assert!(malformed.contains("not an IP address"), "{malformed}");
    }

    #[test]
    fn lines_are_one_list_in_order_and_empty_entries_are_skipped() {
        let lines = ["192.0.2.1, 192.0.2.2", "192.0.2.3,, "];
        assert_eq!(xff(1, &lines), value("192.0.2.3"));
        assert_eq!(xff(2, &lines), value("192.0.2.2"));
        assert_eq!(xff(3, &lines), value("192.0.2.1"));
        refused(xff(4, &lines));
        let lines = ["for=192.0.2.1", "for=192.0.2.2, for=192.0.2.3"];
        assert_eq!(fwd(3, &lines), value("192.0.2.1"));
    }

    #[test]
    fn ports_brackets_ipv6_prefixes_and_mapped_addresses() {
        assert_eq!(xff(1, &["203.0.113.7:4711"]), value("203.0.113.7"));
        assert_eq!(
            xff(1, &["[2001:db8:1:2::1]:4711"]),
            value("2001:db8:1:2::/64")
        );
        assert_eq!(xff(1, &["[2001:db8:1:2::1]"]), value("2001:db8:1:2::/64"));
        assert_eq!(xff(1, &["2001:db8:1:2::1"]), value("2001:db8:1:2::/64"));
        assert_eq!(xff(1, &["::ffff:203.0.113.7"]), value("203.0.113.7"));
        let request = request("x-forwarded-for", &["2001:db8:1:2ff::1"]);
        let key = x_forwarded_for(1).ipv6_prefix(56).key(&request);
        assert_eq!(key, value("2001:db8:1:200::/56"));
        let request = self::request("x-forwarded-for", &["203.0.113.7"]);
        let key = x_forwarded_for(1).ipv4_prefix(24).key(&request);
        assert_eq!(key, value("203.0.113.0/24"));
    }

    #[test]
    fn forwarded_reads_the_for_parameter_of_rfc_7239() {
        // RFC 7239's own examples.
        assert_eq!(
            fwd(1, &["for=\"_gazonk\", For=\"[2001:db8:cafe::17]:4711\""]),
            value("2001:db8:cafe::/64")
        );
        assert_eq!(
            fwd(1, &["for=192.0.2.60;proto=http;by=203.0.113.43"]),
            value("192.0.2.60")
        );
        assert_eq!(
            fwd(2, &["for=192.0.2.43, for=198.51.100.17"]),
            value("192.0.2.43")
        );
        assert_eq!(
            fwd(1, &["proto=https; FOR = \"192.0.2.5:_p1\" "]),
            value("192.0.2.5")
        );
        assert_eq!(fwd(1, &["for=\"192.0.2.\\5\""]), value("192.0.2.5"));
    }

    #[test]
    fn forwarded_refuses_what_names_no_address() {
        let hidden = refused(fwd(1, &["for=\"_gazonk\""]));
        assert!(hidden.contains("hides"), "{hidden}");
        refused(fwd(1, &["for=unknown"]));
        let reason = refused(fwd(1, &["proto=https;by=203.0.113.43"]));
        assert_eq!(
            reason,
            "the client's Forwarded element has no for= parameter"
        );
        let reason = refused(fwd(1, &["for=192.0.2.1;for=192.0.2.2"]));
        assert_eq!(
            reason,
            "the client's Forwarded element has two for= parameters"
        );
        refused(fwd(1, &["for"]));
        refused(fwd(1, &["for=\"192.0.2.1\"x"]));
        refused(fwd(1, &["for=\"[2001:db8::1]"]));
    }

    #[test]
    fn a_quoted_comma_does_not_shift_the_count() {
        // Split naively, the client's element would be `for=192.0.2.66"`, then `for="x`.
        let line = "for=\"x, for=192.0.2.66\", for=203.0.113.7";
        assert_eq!(fwd(1, &[line]), value("203.0.113.7"));
        refused(fwd(2, &[line]));
        // An unclosed quote in an earlier line: the trusted lines are still read.
        let lines = ["for=\"192.0.2.1, for=192.0.2.2", "for=203.0.113.7"];
        assert_eq!(fwd(1, &lines), value("203.0.113.7"));
        let reason = refused(fwd(2, &lines));
        assert_eq!(reason, "Forwarded has a quoted string that is not closed");
    }
}
