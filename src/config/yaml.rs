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
    pub line: usize,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A scalar as written. `plain` is false for quoted and block scalars, which are always
    /// strings, never numbers, booleans or null.
    Scalar {
        text: String,
        plain: bool,
    },
    Sequence(Vec<Node>),
    /// Entries in document order (order matters: wildcard children match in file order).
    Mapping(Vec<(Node, Node)>),
}

/// A YAML syntax error with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    pub line: usize,
    pub message: String,
}

impl Node {
    /// True for an explicit or implicit YAML null (`~`, `null`, empty value).
    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, plain: true }
            if text.is_empty() || text == "~" || text.eq_ignore_ascii_case("null"))
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

/// Parses the first document of `text`. An empty stream gives `None`.
pub fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    let mut builder = TreeBuilder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, false).map_err(|e| SyntaxError {
        line: e.marker().line(),
        message: e.info().to_string(),
    })?;
    if let Some(err) = builder.error {
        return Err(err);
    }
    Ok(builder.document)
}

/// Builds the tree from parser events. Anchored nodes are remembered so aliases expand to a copy.
#[derive(Default)]
struct TreeBuilder {
    stack: Vec<Partial>,
    anchors: HashMap<usize, Node>,
    document: Option<Node>,
    done: bool,
    error: Option<SyntaxError>,
}

struct Partial {
    line: usize,
    anchor: usize,
    items: Vec<Node>,
    is_mapping: bool,
}

impl TreeBuilder {
    fn finish(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
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
                let plain = style == TScalarStyle::Plain;
                self.finish(
                    Node {
                        line,
                        value: Value::Scalar { text, plain },
                    },
                    anchor,
                );
            }
            Event::SequenceStart(anchor, _) => self.stack.push(Partial {
                line,
                anchor,
                items: Vec::new(),
                is_mapping: false,
            }),
            Event::MappingStart(anchor, _) => self.stack.push(Partial {
                line,
                anchor,
                items: Vec::new(),
                is_mapping: true,
            }),
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
                    Value::Mapping(pairs)
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
            Event::Alias(anchor) => match self.anchors.get(&anchor).cloned() {
                Some(node) => self.finish(node, 0),
                None => {
                    self.error = Some(SyntaxError {
                        line,
                        message: "alias refers to an unknown anchor".into(),
                    })
                }
            },
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
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
    fn empty_stream_is_none() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("# only a comment\n").unwrap(), None);
    }
}
