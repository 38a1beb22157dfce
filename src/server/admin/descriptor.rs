//! The admin API's text form of a descriptor, `key=value,key2=value2`, as the HTTP API's
//! `descriptor` parameter and the command line take it, and the percent-encoding of URL parts.
//!
//! A `,` or `=` that belongs to a key or a value is written `\,` or `\=`, and a backslash `\\`;
//! a backslash before anything else is an error, so a typo is refused rather than looked up as
//! another descriptor. On top of that, in a URL the whole parameter is percent-encoded as any
//! query value is (`curl -G --data-urlencode 'descriptor=...'` does it): the URL is decoded
//! first, then the escapes.

use std::fmt::Write as _;

use super::Entries;

/// Why a descriptor's text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DescriptorError {
    #[error("the descriptor is empty; expected key=value[,key2=value2...]")]
    Empty,
    #[error("entry {0} has no '=' (write a literal '=' or ',' as \\= or \\,)")]
    NoEquals(usize),
    #[error("entry {0} has an empty key")]
    EmptyKey(usize),
    #[error("'\\' before {0:?} at byte {1}: only \\, \\= and \\\\ are escapes")]
    BadEscape(char, usize),
    #[error("the descriptor ends with a lone '\\'")]
    TrailingBackslash,
}

/// The entries of `text`, in order, each `(key, value)` with its escapes resolved.
pub(crate) fn parse(text: &str) -> Result<Entries, DescriptorError> {
    if text.is_empty() {
        return Err(DescriptorError::Empty);
    }
    let mut entries = Vec::new();
    let (mut key, mut current) = (None::<String>, String::new());
    let mut chars = text.char_indices();
    let finish = |key: Option<String>, value: String, n: usize| match key {
        None => Err(DescriptorError::NoEquals(n)),
        Some(k) if k.is_empty() => Err(DescriptorError::EmptyKey(n)),
        Some(k) => Ok((k.into_bytes(), value.into_bytes())),
    };
    while let Some((at, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, e @ (',' | '=' | '\\'))) => current.push(e),
                Some((_, other)) => return Err(DescriptorError::BadEscape(other, at)),
                None => return Err(DescriptorError::TrailingBackslash),
            },
            '=' if key.is_none() => key = Some(std::mem::take(&mut current)),
            ',' => {
                let value = std::mem::take(&mut current);
                entries.push(finish(key.take(), value, entries.len() + 1)?);
            }
            c => current.push(c),
        }
    }
    entries.push(finish(key, current, entries.len() + 1)?);
    Ok(entries)
}

/// `text` with its `,`, `=` and `\` escaped: the descriptor text of one key or value.
#[cfg(test)]
pub(crate) fn escape(text: &str) -> String {
    text.chars().fold(String::new(), |mut out, c| {
        if matches!(c, ',' | '=' | '\\') {
            out.push('\\');
        }
        out.push(c);
        out
    })
}

/// `text` percent-encoded for a URL's path segment or query value: everything but RFC 3986's
/// unreserved characters.
pub(crate) fn percent_encode(text: &str) -> String {
    text.bytes().fold(String::new(), |mut out, b| {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
        out
    })
}

/// A query value decoded as HTML forms and URL query parsers do: `%XX` is a byte, `+` a space.
/// `None` when the bytes are not UTF-8 or a `%` is not followed by two hex digits.
pub(crate) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(text: &str) -> Vec<(String, String)> {
        parse(text)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (String::from_utf8(k).unwrap(), String::from_utf8(v).unwrap()))
            .collect()
    }

    #[test]
    fn splits_entries_and_resolves_escapes() {
        assert_eq!(pairs("user=u1"), [("user".into(), "u1".into())]);
        assert_eq!(
            pairs("a=1,b=x\\,y\\=z\\\\"),
            [("a".into(), "1".into()), ("b".into(), "x,y=z\\".into())]
        );
        // Only the first unescaped '=' splits; an empty value is a value.
        assert_eq!(
            pairs("k=a=b,e="),
            [("k".into(), "a=b".into()), ("e".into(), "".into())]
        );
        let value = "a,b=c\\d";
        assert_eq!(
            pairs(&format!("k={}", escape(value))),
            [("k".into(), value.into())]
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert_eq!(parse(""), Err(DescriptorError::Empty));
        assert_eq!(parse("user"), Err(DescriptorError::NoEquals(1)));
        assert_eq!(parse("a=1,=2"), Err(DescriptorError::EmptyKey(2)));
        assert_eq!(parse("a=\\n"), Err(DescriptorError::BadEscape('n', 2)));
        assert_eq!(parse("a=1\\"), Err(DescriptorError::TrailingBackslash));
    }

    #[test]
    fn percent_round_trip() {
        let text = "user=a\\,b c/é";
        assert_eq!(percent_decode(&percent_encode(text)).as_deref(), Some(text));
        assert_eq!(percent_decode("a+b%2C").as_deref(), Some("a b,"));
        assert_eq!(percent_decode("%G1"), None);
    }
}
