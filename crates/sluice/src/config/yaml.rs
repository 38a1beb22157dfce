//! A minimal YAML document tree that remembers the line of every node.
//!
//! Config errors must name the line they come from, which serde-based YAML readers do not give
//! for semantic errors (unknown key, bad unit, duplicate domain). This module turns the event
//! stream of `yaml-rust2` into a small tree of scalars, sequences and mappings with 1-based line
//! numbers; `load.rs` validates that tree against upstream's schema.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// One YAML node and the line it starts on.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// 1-based, as editors count.
    pub line: usize,
    /// What the node holds.
    pub value: Value,
}

/// A node's content: the three shapes YAML has once aliases are resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A scalar as written. `plain` is false for quoted and block scalars, which are always
    /// strings, never numbers, booleans or null.
    Scalar {
        /// The scalar's text, escapes resolved.
        text: String,
        /// Written without quotes, so YAML 1.1's typing applies to it (`load/scalars.rs`).
        plain: bool,
    },
    /// Items in document order.
    Sequence(Vec<Node>),
    /// Entries in document order (order matters: wildcard children match in file order).
    Mapping(Vec<(Node, Node)>),
}

/// A YAML syntax error with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    /// 1-based line where the parser stopped.
    pub line: usize,
    /// The parser's reason (or the bound the document broke).
    pub message: String,
}

impl Node {
    /// True for an explicit or implicit YAML null (`~`, `null`, empty value).
    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, plain: true }
            if text.is_empty() || text == "~" || text.eq_ignore_ascii_case("null"))
    }

    /// Nodes in this subtree (itself included). Depth is bounded by [`MAX_DEPTH`].
    fn size(&self) -> usize {
        1 + match &self.value {
            Value::Scalar { .. } => 0,
            Value::Sequence(items) => items.iter().map(Node::size).sum(),
            Value::Mapping(pairs) => pairs.iter().map(|(k, v)| k.size() + v.size()).sum(),
        }
    }

    /// Short human description used in "expected X, found Y" messages.
    pub fn kind(&self) -> &'static str {
        match &self.value {
            Value::Scalar { .. } if self.is_null() => "null",
            Value::Scalar { .. } => "scalar",
            Value::Sequence(_) => "list",
            Value::Mapping(_) => "map",
        }
    }
}

/// Deepest nesting accepted. Real configs nest a few levels; the limit keeps hostile input from
/// exhausting the stack of any recursive walk over the tree.
pub const MAX_DEPTH: usize = 64;

/// Whether `node` nests collections (sequences and mappings) more than [`MAX_DEPTH`] deep,
/// counted as the reader counts them, so a tree built from another source (an xDS resource) is
/// held to the same limit as a file. Walks with a stack of its own, not by recursion, so the
/// depth it measures cannot overflow the thread's stack either.
pub fn nests_too_deep(node: &Node) -> bool {
    let mut pending: Vec<(&Node, usize)> = vec![(node, 0)];
    while let Some((node, above)) = pending.pop() {
        let children: Box<dyn Iterator<Item = &Node>> = match &node.value {
            Value::Scalar { .. } => continue,
            Value::Sequence(items) => Box::new(items.iter()),
            Value::Mapping(entries) => Box::new(entries.iter().flat_map(|(k, v)| [k, v])),
        };
        let depth = above + 1;
        if depth > MAX_DEPTH {
            return true;
        }
        pending.extend(children.map(|child| (child, depth)));
    }
    false
}

/// Most nodes one document may expand to, aliases included: a few hundred bytes of nested
/// aliases can otherwise expand to billions of nodes.
pub const MAX_NODES: usize = 1_000_000;

/// Parses the first document of `text`. An empty stream gives `None`.
///
/// Events are pulled one at a time (yaml-rust2's own `load` recurses once per nesting level,
/// which a deeply nested file turns into a stack overflow).
pub fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    let mut builder = TreeBuilder::default();
    let mut parser = Parser::new_from_str(text);
    while !builder.done && builder.error.is_none() {
        let (event, mark) = parser.next_token().map_err(|e| SyntaxError {
            line: e.marker().line(),
            message: e.info().to_string(),
        })?;
        let end = matches!(event, Event::StreamEnd | Event::DocumentEnd);
        builder.on_event(event, mark);
        if end {
            break;
        }
    }
    if let Some(err) = builder.error {
        return Err(err);
    }
    Ok(builder.document)
}

/// Builds the tree from parser events. Anchored nodes are remembered so aliases expand to a copy.
#[derive(Default)]
struct TreeBuilder {
    stack: Vec<Partial>,
    /// Anchored nodes with their size in nodes.
    anchors: HashMap<usize, (Node, usize)>,
    document: Option<Node>,
    done: bool,
    error: Option<SyntaxError>,
    /// Nodes made so far, counting every node an alias copies.
    nodes: usize,
}

struct Partial {
    line: usize,
    anchor: usize,
    items: Vec<Node>,
    is_mapping: bool,
}

impl TreeBuilder {
    fn fail(&mut self, line: usize, message: String) {
        if self.error.is_none() {
            self.error = Some(SyntaxError { line, message });
        }
    }

    /// Counts `count` more nodes against [`MAX_NODES`].
    fn grow(&mut self, line: usize, count: usize) {
        self.nodes = self.nodes.saturating_add(count);
        if self.nodes > MAX_NODES {
            self.fail(
                line,
                format!(
                    "the document expands to more than {MAX_NODES} nodes (excessive aliasing?)"
                ),
            );
        }
    }

    fn open(&mut self, line: usize, anchor: usize, is_mapping: bool) {
        if self.stack.len() >= MAX_DEPTH {
            self.fail(line, format!("nesting deeper than {MAX_DEPTH} levels"));
            return;
        }
        self.grow(line, 1);
        self.stack.push(Partial {
            line,
            anchor,
            items: Vec::new(),
            is_mapping,
        });
    }

    fn finish(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            let size = node.size();
            self.anchors.insert(anchor, (node.clone(), size));
        }
        match self.stack.last_mut() {
            Some(parent) => parent.items.push(node),
            None => {
                self.document = Some(node);
                self.done = true;
            }
        }
    }
}

impl MarkedEventReceiver for TreeBuilder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        if self.done || self.error.is_some() {
            return;
        }
        let line = mark.line();
        match event {
            Event::Scalar(text, style, anchor, _tag) => {
                self.grow(line, 1);
                let plain = style == TScalarStyle::Plain;
                self.finish(
                    Node {
                        line,
                        value: Value::Scalar { text, plain },
                    },
                    anchor,
                );
            }
            Event::SequenceStart(anchor, _) => self.open(line, anchor, false),
            Event::MappingStart(anchor, _) => self.open(line, anchor, true),
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(partial) = self.stack.pop() else {
                    return;
                };
                let value = if partial.is_mapping {
                    let mut pairs = Vec::with_capacity(partial.items.len() / 2);
                    let mut items = partial.items.into_iter();
                    while let (Some(k), Some(v)) = (items.next(), items.next()) {
                        pairs.push((k, v));
                    }
                    match merge_keys(pairs) {
                        Ok(pairs) => Value::Mapping(pairs),
                        Err(err) => {
                            self.fail(err.line, err.message);
                            return;
                        }
                    }
                } else {
                    Value::Sequence(partial.items)
                };
                self.finish(
                    Node {
                        line: partial.line,
                        value,
                    },
                    partial.anchor,
                );
            }
            Event::Alias(anchor) => match self.anchors.get(&anchor).map(|(_, size)| *size) {
                Some(size) => {
                    // Counted before copying, so the copy itself stays bounded.
                    self.grow(line, size);
                    if self.error.is_none() {
                        let node = self.anchors[&anchor].0.clone();
                        self.finish(node, 0);
                    }
                }
                None => self.fail(line, "alias refers to an unknown anchor".into()),
            },
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
}

/// Resolves YAML 1.1 merge keys (`<<: *base`, `<<: [*a, *b]`) as yaml.v2 does: the merged
/// maps' entries are added after the map's own, a key the map sets itself keeps its own value,
/// and in a list of maps the first that sets a key wins. Without a `<<` key nothing changes.
fn merge_keys(pairs: Vec<(Node, Node)>) -> Result<Vec<(Node, Node)>, SyntaxError> {
    let is_merge =
        |key: &Node| matches!(&key.value, Value::Scalar { text, plain: true } if text == "<<");
    if !pairs.iter().any(|(k, _)| is_merge(k)) {
        return Ok(pairs);
    }
    let (merges, mut own): (Vec<_>, Vec<_>) = pairs.into_iter().partition(|(k, _)| is_merge(k));
    let mut seen: std::collections::HashSet<String> = own
        .iter()
        .filter_map(|(k, _)| match &k.value {
            Value::Scalar { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect();
    let not_a_map = |line| SyntaxError {
        line,
        message: "a merge key (<<) takes a map or a list of maps".into(),
    };
    for (_, source) in merges {
        let maps = match source.value {
            Value::Mapping(entries) => vec![entries],
            Value::Sequence(items) => items
                .into_iter()
                .map(|item| match item.value {
                    Value::Mapping(entries) => Ok(entries),
                    _ => Err(not_a_map(item.line)),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(not_a_map(source.line)),
        };
        for (key, value) in maps.into_iter().flatten() {
            // A set of the scalar keys keeps hostile files (huge maps merged into huge maps)
            // linear; other keys are rare and compared one by one.
            let taken = match &key.value {
                Value::Scalar { text, .. } => !seen.insert(text.clone()),
                _ => own.iter().any(|(k, _)| k.value == key.value),
            };
            if !taken {
                own.push((key, value));
            }
        }
    }
    Ok(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_lines_and_order() {
        let doc = parse("domain: a\ndescriptors:\n  - key: k\n    value: 'v'\n")
            .unwrap()
            .unwrap();
        let Value::Mapping(pairs) = &doc.value else {
            panic!("not a map")
        };
        assert_eq!(pairs[0].0.line, 1);
        assert_eq!(pairs[1].0.line, 2);
        let Value::Sequence(items) = &pairs[1].1.value else {
            panic!("not a list")
        };
        assert_eq!(items[0].line, 3);
        let Value::Mapping(entry) = &items[0].value else {
            panic!("not a map")
        };
        assert_eq!(entry[1].1.line, 4);
        assert_eq!(
            entry[1].1.value,
            Value::Scalar {
                text: "v".into(),
                plain: false
            }
        );
    }

    #[test]
    fn expands_aliases() {
        let doc = parse("a: &x {k: 1}\nb: *x\n").unwrap().unwrap();
        let Value::Mapping(pairs) = &doc.value else {
            panic!("not a map")
        };
        assert_eq!(pairs[0].1.value, pairs[1].1.value);
    }

    #[test]
    fn syntax_error_has_line() {
        let err = parse("domain: a\n  bad: [unclosed\n").unwrap_err();
        assert!(err.line >= 2, "{err:?}");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        // Flow style: yaml-rust2's scanner has its own limit.
        let deep = format!("a: {}x{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse(&deep).is_err());
        // Block style has none; ours applies.
        let block = format!("a:\n{}x\n", "- ".repeat(50_000));
        let err = parse(&block).unwrap_err();
        assert!(err.message.contains("nesting deeper than"), "{err:?}");
        let fine = format!("a:\n{}x\n", "- ".repeat(MAX_DEPTH - 2));
        assert!(parse(&fine).is_ok());
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut text = String::from("l0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..9 {
            let refs = vec![format!("*a{}", level - 1); 10].join(", ");
            text.push_str(&format!("l{level}: &a{level} [{refs}]\n"));
        }
        let err = parse(&text).unwrap_err();
        assert!(err.message.contains("excessive aliasing"), "{err:?}");
    }

    fn keys_and_values(node: &Node) -> Vec<(String, String)> {
        let Value::Mapping(pairs) = &node.value else {
            panic!("not a map")
        };
        pairs
            .iter()
            .map(|(k, v)| match (&k.value, &v.value) {
                (Value::Scalar { text: k, .. }, Value::Scalar { text: v, .. }) => {
                    (k.clone(), v.clone())
                }
                _ => panic!("not scalars"),
            })
            .collect()
    }

    #[test]
    fn merge_keys_resolve_as_in_yaml_1_1() {
        let doc = parse(
            "base: &base {unit: minute, requests_per_unit: 5}\n\
             other: &other {unit: hour, name: n}\n\
             one: {<<: *base, requests_per_unit: 7}\n\
             list:\n  <<: [*other, *base]\n  extra: x\n",
        )
        .unwrap()
        .unwrap();
        let Value::Mapping(top) = &doc.value else {
            panic!("not a map")
        };
        let pairs = |at: usize| keys_and_values(&top[at].1);
        let own = |k: &str, v: &str| (k.to_string(), v.to_string());
        // The map's own key wins over the merged one.
        assert_eq!(
            pairs(2),
            [own("requests_per_unit", "7"), own("unit", "minute")]
        );
        // In a list, the first map that sets a key wins.
        assert_eq!(
            pairs(3),
            [
                own("extra", "x"),
                own("unit", "hour"),
                own("name", "n"),
                own("requests_per_unit", "5")
            ]
        );
        let err = parse("a: {<<: 5}\n").unwrap_err();
        assert!(err.message.contains("merge key"), "{err:?}");
        // A quoted "<<" is an ordinary key.
        let doc = parse("'<<': x\n").unwrap().unwrap();
        assert_eq!(keys_and_values(&doc), [own("<<", "x")]);
    }

    #[test]
    fn empty_stream_is_none() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("# only a comment\n").unwrap(), None);
    }
}
