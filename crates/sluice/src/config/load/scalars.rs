//! Plain YAML scalars as upstream reads them: its loader (Go's yaml.v2) resolves them by YAML
//! 1.1, where `yes` and `off` are booleans and `0x10`, `010` and `1_000` are integers. Kept apart
//! from validation so that every field (flags, counts, `unit_multiplier`, `metadata`) reads a
//! scalar the one way upstream does.

use prost_types::value::Kind;

use crate::config::yaml::{Node, Value};

/// YAML 1.1 booleans, as upstream's yaml.v2 reads them.
pub(super) fn yaml11_bool(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "y" => Some(true),
        "false" | "no" | "off" | "n" => Some(false),
        _ => None,
    }
}

/// A value as an error message shows it: a scalar quoted, anything else by its kind.
pub(super) fn describe(node: &Node) -> String {
    match &node.value {
        Value::Scalar { text, .. } => format!("'{text}'"),
        _ => format!("a {}", node.kind()),
    }
}

/// A plain scalar that YAML 1.1, as yaml.v2 resolves it, reads as a number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Number {
    Int(i128),
    Float(f64),
}

/// yaml.v2's number resolution (upstream reads its files with it): underscores are dropped
/// anywhere (`1_000`), a sign may lead (`+5`), Go's integer prefixes apply (`0x10`, `0o17`,
/// `0b101`, and a leading `0` for octal: `010` is 8), and else a decimal float (`1e3`, `2.5`,
/// `08`). Anything else (`.inf`, `1:30`, `ten`) is not a number.
pub(super) fn yaml11_number(text: &str) -> Option<Number> {
    if !text.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-') {
        return None;
    }
    let plain = text.replace('_', "");
    let (negative, unsigned) = match plain.as_bytes().first() {
        Some(b'-') => (true, &plain[1..]),
        Some(b'+') => (false, &plain[1..]),
        _ => (false, plain.as_str()),
    };
    let lower = unsigned.to_ascii_lowercase();
    let (radix, digits) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    // `from_str_radix` would take a second sign after the prefix; Go does not.
    if !digits.is_empty()
        && !digits.starts_with(['+', '-'])
        && let Ok(n) = i128::from_str_radix(digits, radix)
    {
        return Some(Number::Int(if negative { -n } else { n }));
    }
    let float = plain.strip_prefix(['+', '-']).unwrap_or(&plain);
    let (mantissa, exponent) = match float.find(['e', 'E']) {
        Some(at) => (&float[..at], Some(&float[at + 1..])),
        None => (float, None),
    };
    let digits_only = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some((whole, fraction)) => {
            (whole.is_empty() && digits_only(fraction))
                || (digits_only(whole) && (fraction.is_empty() || digits_only(fraction)))
        }
        None => digits_only(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits_only(e.strip_prefix(['+', '-']).unwrap_or(e)));
    if mantissa_ok && exponent_ok {
        return plain.parse().ok().map(Number::Float);
    }
    None
}

/// Converts free-form YAML (descriptor `metadata`) into a protobuf `Value`, typing plain scalars
/// the way yaml.v2 does (null, YAML 1.1 booleans, numbers, else strings). Errors carry the
/// offending line.
pub(super) fn to_proto_value(node: &Node) -> Result<prost_types::Value, usize> {
    let kind = match &node.value {
        _ if node.is_null() => Kind::NullValue(0),
        Value::Scalar { text, plain: false } => Kind::StringValue(text.clone()),
        Value::Scalar { text, plain: true } => match yaml11_bool(text) {
            Some(b) => Kind::BoolValue(b),
            None => match yaml11_number(text) {
                Some(Number::Int(n)) => Kind::NumberValue(n as f64),
                Some(Number::Float(f)) if f.is_finite() => Kind::NumberValue(f),
                _ => Kind::StringValue(text.clone()),
            },
        },
        Value::Sequence(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(to_proto_value).collect::<Result<_, _>>()?,
        }),
        Value::Mapping(pairs) => {
            let mut fields = std::collections::BTreeMap::new();
            for (k, v) in pairs {
                let Value::Scalar { text, .. } = &k.value else {
                    return Err(k.line);
                };
                fields.insert(text.clone(), to_proto_value(v)?);
            }
            Kind::StructValue(prost_types::Struct { fields })
        }
    };
    Ok(prost_types::Value { kind: Some(kind) })
}
