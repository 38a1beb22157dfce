//! Descriptor value patterns: `*` matches zero or more characters, anywhere, any number of times.

/// A compiled pattern: the literal pieces between the stars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wildcard {
    pattern: Box<str>,
    pieces: Vec<Box<str>>,
}

impl Wildcard {
    /// Compiles `pattern`; returns `None` when it has no `*` (it is then an exact value).
    pub fn new(pattern: &str) -> Option<Self> {
        if !pattern.contains('*') {
            return None;
        }
        Some(Self {
            pattern: pattern.into(),
            pieces: pattern.split('*').map(Into::into).collect(),
        })
    }

    /// The pattern as the config wrote it (its stats key and counter key use it).
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// True when `value` matches. The first piece is a prefix, the last a suffix, and the ones in
    /// between must appear in order without overlapping (greedy leftmost search is exact here).
    /// Compared as bytes: a request value need not be UTF-8 (see `build.rs`), and on UTF-8 text
    /// byte and character matching agree.
    pub fn matches(&self, value: &[u8]) -> bool {
        let (first, rest) = self
            .pieces
            .split_first()
            .expect("split gives one piece at least");
        let (last, middle) = rest
            .split_last()
            .expect("a pattern with '*' has two pieces");
        let Some(mut remaining) = value.strip_prefix(first.as_bytes()) else {
            return false;
        };
        for piece in middle {
            match find(remaining, piece.as_bytes()) {
                Some(at) => remaining = &remaining[at + piece.len()..],
                None => return false,
            }
        }
        remaining.ends_with(last.as_bytes())
    }
}

/// Where `needle` first occurs in `haystack`. Pieces are short (config text), so the plain
/// search is linear in the value for all practical purposes.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::Wildcard;

    fn m(pattern: &str, value: &str) -> bool {
        Wildcard::new(pattern).unwrap().matches(value.as_bytes())
    }

    #[test]
    fn table() {
        let cases = [
            ("*", "", true),
            ("*", "anything", true),
            ("foo*", "foo", true),
            ("foo*", "foobar", true),
            ("foo*", "fo", false),
            ("*bar", "bar", true),
            ("*bar", "xbar", true),
            ("*bar", "barx", false),
            ("bar*b", "barb", true),
            ("bar*b", "bar123b", true),
            ("bar*b", "bara", false),
            ("bar*b", "xbarb", false),
            ("bar*b", "bar", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "a-b-b-c", true),
            ("a*b*c", "acb", false),
            ("a**c", "ac", true),
            ("ab*ba", "aba", false),
            ("ab*ba", "abba", true),
            ("*.example.com", "api.example.com", true),
            ("*.example.com", "example.com", false),
        ];
        for (pattern, value, want) in cases {
            assert_eq!(m(pattern, value), want, "{pattern:?} vs {value:?}");
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_match_by_bytes() {
        let w = Wildcard::new("user*").unwrap();
        assert!(w.matches(b"userC\xff"));
        assert!(
            Wildcard::new("*\u{e9}")
                .unwrap()
                .matches("caf\u{e9}".as_bytes())
        );
        assert!(!Wildcard::new("*x").unwrap().matches(b"\xffy"));
        assert!(Wildcard::new("a*b*c").unwrap().matches(b"a\xc3b\x80c"));
    }

    #[test]
    fn no_star_is_not_a_wildcard() {
        assert!(Wildcard::new("plain").is_none());
    }
}
