//! Kubernetes label syntax (keys, values, DNS-1123 names) and label selectors in their string
//! form, parsed and matched as the API server does.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

fn is_alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// RFC 1123 label: what Kubernetes requires of a namespace name.
pub(crate) fn dns1123_label(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|&c| is_alnum_lower(c) || c == b'-')
        && is_alnum_lower(b[0])
        && is_alnum_lower(b[b.len() - 1]);
    if ok {
        return Ok(());
    }
    Err(
        "expected at most 63 lowercase letters, digits and '-', starting and ending with a \
         letter or digit"
            .to_owned(),
    )
}

/// RFC 1123 subdomain: what Kubernetes requires of most object names.
pub(crate) fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.len() <= 253 && s.split('.').all(|part| dns1123_label(part).is_ok()) {
        return Ok(());
    }
    Err(
        "expected at most 253 characters of dot-separated lowercase letters, digits and '-', \
         each part starting and ending with a letter or digit"
            .to_owned(),
    )
}

/// The name part of a label key, and a non-empty label value.
pub(crate) fn label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b.iter()).all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// `[prefix/]name`: prefix a DNS subdomain, name up to 63 of `[A-Za-z0-9_.-]`.
pub(crate) fn label_key(s: &str) -> Result<(), String> {
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    if label_name(name) && prefix.is_none_or(|p| dns1123_subdomain(p).is_ok()) {
        return Ok(());
    }
    Err(
        "expected an optional DNS subdomain prefix and '/', then at most 63 letters, digits, \
         '-', '_' and '.', starting and ending with a letter or digit"
            .to_owned(),
    )
}

pub(crate) fn label_value(s: &str) -> Result<(), String> {
    if s.is_empty() || label_name(s) {
        return Ok(());
    }
    Err(
        "expected at most 63 letters, digits, '-', '_' and '.', starting and ending with a \
         letter or digit, or nothing"
            .to_owned(),
    )
}

// ---------------------------------------------------------------------------------------------
// Label selectors

/// A Kubernetes label selector in its string form: comma-separated requirements, each
/// `key=value` (or `==`), `key!=value`, `key in (v1,v2)`, `key notin (v1,v2)`, `key`, `!key`.
/// `Display` gives the canonical form, suitable for the API's `labelSelector` parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    DoesNotExist,
}

impl LabelSelector {
    /// `key=value`.
    pub fn equals(key: &str, value: &str) -> Self {
        LabelSelector(vec![Requirement {
            key: key.to_owned(),
            op: Op::Equals(value.to_owned()),
        }])
    }

    /// Whether some requirement needs a label to be present (`=`, `in` or a bare key): a
    /// selector without one also selects objects that carry none of the named labels.
    pub fn requires_a_label(&self) -> bool {
        self.0
            .iter()
            .any(|r| matches!(r.op, Op::Equals(_) | Op::In(_) | Op::Exists))
    }

    /// Whether an object with `labels` is selected, with the API server's semantics (`!=` and
    /// `notin` also select objects without the key).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|Requirement { key, op }| {
            let value = labels.get(key);
            match op {
                Op::Equals(v) => value == Some(v),
                Op::NotEquals(v) => value != Some(v),
                Op::In(set) => value.is_some_and(|v| set.contains(v)),
                Op::NotIn(set) => value.is_none_or(|v| !set.contains(v)),
                Op::Exists => value.is_some(),
                Op::DoesNotExist => value.is_none(),
            }
        })
    }
}

impl LabelSelector {
    /// The selector as a CEL expression over `labels`, a CEL `map(string, string)`, with the
    /// semantics of [`LabelSelector::matches`]: what the admission guard evaluates on the API
    /// server (`src/surface/admission.rs`).
    pub fn to_cel(&self, labels: &str) -> String {
        let has = |key: &str| format!("{} in {labels}", cel_string(key));
        let value = |key: &str| format!("{labels}[{}]", cel_string(key));
        let terms: Vec<String> = self
            .0
            .iter()
            .map(|Requirement { key, op }| match op {
                Op::Equals(v) => format!("({} && {} == {})", has(key), value(key), cel_string(v)),
                Op::NotEquals(v) => {
                    format!("(!({}) || {} != {})", has(key), value(key), cel_string(v))
                }
                Op::In(set) => format!("({} && {} in {})", has(key), value(key), cel_list(set)),
                Op::NotIn(set) => {
                    format!(
                        "(!({}) || !({} in {}))",
                        has(key),
                        value(key),
                        cel_list(set)
                    )
                }
                Op::Exists => format!("({})", has(key)),
                Op::DoesNotExist => format!("!({})", has(key)),
            })
            .collect();
        terms.join(" && ")
    }
}

/// A CEL list of string literals.
pub(crate) fn cel_list<'a>(values: impl IntoIterator<Item = &'a String>) -> String {
    let items: Vec<String> = values.into_iter().map(|v| cel_string(v)).collect();
    format!("[{}]", items.join(", "))
}

/// A CEL string literal. Label keys, values and namespace names need no escape; escaping anyway
/// keeps a literal a literal whatever it holds.
pub(crate) fn cel_string(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |values: &BTreeSet<String>| {
            values
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(",")
        };
        for (i, Requirement { key, op }) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match op {
                Op::Equals(v) => write!(f, "{key}={v}")?,
                Op::NotEquals(v) => write!(f, "{key}!={v}")?,
                Op::In(values) => write!(f, "{key} in ({})", set(values))?,
                Op::NotIn(values) => write!(f, "{key} notin ({})", set(values))?,
                Op::Exists => write!(f, "{key}")?,
                Op::DoesNotExist => write!(f, "!{key}")?,
            }
        }
        Ok(())
    }
}

impl Serialize for LabelSelector {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    Word(&'a str),
    Not,
    Eq,
    NotEq,
    Open,
    Close,
    Comma,
}

impl fmt::Display for Token<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Word(w) => write!(f, "{w:?}"),
            Token::Not => f.write_str("'!'"),
            Token::Eq => f.write_str("'='"),
            Token::NotEq => f.write_str("'!='"),
            Token::Open => f.write_str("'('"),
            Token::Close => f.write_str("')'"),
            Token::Comma => f.write_str("','"),
        }
    }
}

fn tokenize(s: &str) -> Result<Vec<Token<'_>>, String> {
    let mut tokens = Vec::new();
    let mut rest = s.trim_start();
    while let Some(c) = rest.chars().next() {
        let (token, len) = match c {
            '(' => (Token::Open, 1),
            ')' => (Token::Close, 1),
            ',' => (Token::Comma, 1),
            '=' if rest.starts_with("==") => (Token::Eq, 2),
            '=' => (Token::Eq, 1),
            '!' if rest.starts_with("!=") => (Token::NotEq, 2),
            '!' => (Token::Not, 1),
            '<' | '>' => return Err("the '<' and '>' operators are not supported".to_owned()),
            _ => {
                let len = rest
                    .find(|c: char| c.is_whitespace() || "!=,()<>".contains(c))
                    .unwrap_or(rest.len());
                (Token::Word(&rest[..len]), len)
            }
        };
        tokens.push(token);
        rest = rest[len..].trim_start();
    }
    Ok(tokens)
}

impl FromStr for LabelSelector {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_selector(s).map_err(|why| format!("{s:?} is not a valid label selector: {why}"))
    }
}

fn parse_selector(s: &str) -> Result<LabelSelector, String> {
    let tokens = tokenize(s)?;
    let mut tokens = tokens.into_iter().peekable();
    let mut requirements = Vec::new();
    if tokens.peek().is_none() {
        return Err("it is empty, and would select every object".to_owned());
    }
    loop {
        requirements.push(parse_requirement(&mut tokens)?);
        match tokens.next() {
            None => return Ok(LabelSelector(requirements)),
            Some(Token::Comma) => {}
            Some(other) => return Err(format!("expected ',' or the end, found {other}")),
        }
    }
}

type Tokens<'a> = std::iter::Peekable<std::vec::IntoIter<Token<'a>>>;

fn parse_requirement(tokens: &mut Tokens<'_>) -> Result<Requirement, String> {
    let negated = tokens.next_if_eq(&Token::Not).is_some();
    let key = match tokens.next() {
        Some(Token::Word(key)) => {
            label_key(key).map_err(|why| format!("{key:?} is not a valid label key: {why}"))?;
            key.to_owned()
        }
        Some(other) => return Err(format!("expected a label key, found {other}")),
        None => return Err("expected a label key, found the end".to_owned()),
    };
    let op = match (negated, tokens.peek().copied()) {
        (true, _) => Op::DoesNotExist,
        (false, None | Some(Token::Comma)) => Op::Exists,
        (false, Some(Token::Eq)) => {
            tokens.next();
            Op::Equals(parse_value(tokens)?)
        }
        (false, Some(Token::NotEq)) => {
            tokens.next();
            Op::NotEquals(parse_value(tokens)?)
        }
        (false, Some(Token::Word("in"))) => {
            tokens.next();
            Op::In(parse_set(tokens)?)
        }
        (false, Some(Token::Word("notin"))) => {
            tokens.next();
            Op::NotIn(parse_set(tokens)?)
        }
        (false, Some(other)) => {
            return Err(format!(
                "expected an operator (=, ==, !=, in, notin) after {key:?}, found {other}"
            ));
        }
    };
    Ok(Requirement { key, op })
}

/// A single value; absent (`key=`) means the empty value.
fn parse_value(tokens: &mut Tokens<'_>) -> Result<String, String> {
    match tokens.peek().copied() {
        Some(Token::Word(value)) => {
            tokens.next();
            label_value(value)
                .map_err(|why| format!("{value:?} is not a valid label value: {why}"))?;
            Ok(value.to_owned())
        }
        _ => Ok(String::new()),
    }
}

fn parse_set(tokens: &mut Tokens<'_>) -> Result<BTreeSet<String>, String> {
    if tokens.next() != Some(Token::Open) {
        return Err("expected '(' after in or notin".to_owned());
    }
    let mut values = BTreeSet::new();
    loop {
        match tokens.next() {
            Some(Token::Word(value)) => {
                label_value(value)
                    .map_err(|why| format!("{value:?} is not a valid label value: {why}"))?;
                values.insert(value.to_owned());
            }
            _ => return Err("expected a value inside ( )".to_owned()),
        }
        match tokens.next() {
            Some(Token::Comma) => {}
            Some(Token::Close) => return Ok(values),
            _ => return Err("expected ',' or ')' in a value set".to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CEL of every operator, with `!=` and `notin` true where the key is absent, as the API
    /// server's matching is; tests/cluster/admission.rs evaluates it on the real server.
    #[test]
    fn selectors_become_cel_with_the_api_servers_semantics() {
        let selector: LabelSelector = "a=1,b!=2,c in (y,x),d notin (z),e,!f".parse().unwrap();
        assert_eq!(
            selector.to_cel("l"),
            "('a' in l && l['a'] == '1') && (!('b' in l) || l['b'] != '2') && \
             ('c' in l && l['c'] in ['x', 'y']) && (!('d' in l) || !(l['d'] in ['z'])) && \
             ('e' in l) && !('f' in l)"
        );
        assert_eq!(cel_string(r"it's \ odd"), r"'it\'s \\ odd'");
    }
}
