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

    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// True when `value` matches. The first piece is a prefix, the last a suffix, and the ones in
    /// between must appear in order without overlapping (greedy leftmost search is exact here).
    pub fn matches(&self, value: &str) -> bool {
        let (first, rest) = self
            .pieces
            .split_first()
            .expect("split gives one piece at least");
        let (last, middle) = rest
            .split_last()
            .expect("a pattern with '*' has two pieces");
        let Some(mut remaining) = value.strip_prefix(&**first) else {
            return false;
        };
        for piece in middle {
            match remaining.find(&**piece) {
                Some(at) => remaining = &remaining[at + piece.len()..],
                None => return false,
            }
        }
        remaining.ends_with(&**last)
    }
}

#[cfg(test)]
mod tests {
    use super::Wildcard;

    fn m(pattern: &str, value: &str) -> bool {
        Wildcard::new(pattern).unwrap().matches(value)
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
    fn no_star_is_not_a_wildcard() {
        assert!(Wildcard::new("plain").is_none());
    }
}
