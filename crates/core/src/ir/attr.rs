//! Op attributes: `key=value` pairs with typed accessors that report bad values
//! by key.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};

use crate::dtype::{DType, Scalar, write_float};

/// An attribute value.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Attr {
    /// `true` / `false`
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float (compared by bits).
    Float(#[serde(with = "crate::dtype::json_float")] f64),
    /// A string; printed bare when it is a plain identifier, quoted otherwise.
    Str(String),
    /// A dtype name.
    DType(DType),
    /// `[a, b, ...]`
    List(Vec<Attr>),
}

impl PartialEq for Attr {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Attr::Bool(a), Attr::Bool(b)) => a == b,
            (Attr::Int(a), Attr::Int(b)) => a == b,
            (Attr::Float(a), Attr::Float(b)) => a.to_bits() == b.to_bits(),
            (Attr::Str(a), Attr::Str(b)) => a == b,
            (Attr::DType(a), Attr::DType(b)) => a == b,
            (Attr::List(a), Attr::List(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Attr {}

impl Hash for Attr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            Attr::Bool(b) => b.hash(state),
            Attr::Int(i) => i.hash(state),
            Attr::Float(f) => f.to_bits().hash(state),
            Attr::Str(s) => s.hash(state),
            Attr::DType(d) => d.hash(state),
            Attr::List(l) => l.hash(state),
        }
    }
}

impl From<i64> for Attr {
    fn from(v: i64) -> Self {
        Attr::Int(v)
    }
}
impl From<f64> for Attr {
    fn from(v: f64) -> Self {
        Attr::Float(v)
    }
}
impl From<bool> for Attr {
    fn from(v: bool) -> Self {
        Attr::Bool(v)
    }
}
impl From<DType> for Attr {
    fn from(v: DType) -> Self {
        Attr::DType(v)
    }
}
impl From<&str> for Attr {
    fn from(v: &str) -> Self {
        Attr::Str(v.to_string())
    }
}
impl From<Vec<i64>> for Attr {
    fn from(v: Vec<i64>) -> Self {
        Attr::List(v.into_iter().map(Attr::Int).collect())
    }
}
impl From<&[i64]> for Attr {
    fn from(v: &[i64]) -> Self {
        Attr::List(v.iter().map(|&x| Attr::Int(x)).collect())
    }
}
impl From<&[usize]> for Attr {
    fn from(v: &[usize]) -> Self {
        Attr::List(v.iter().map(|&x| Attr::Int(x as i64)).collect())
    }
}
impl From<Vec<f64>> for Attr {
    fn from(v: Vec<f64>) -> Self {
        Attr::List(v.into_iter().map(Attr::Float).collect())
    }
}
impl From<Vec<&str>> for Attr {
    fn from(v: Vec<&str>) -> Self {
        Attr::List(v.into_iter().map(Attr::from).collect())
    }
}
impl From<Scalar> for Attr {
    fn from(v: Scalar) -> Self {
        match v {
            Scalar::Bool(b) => Attr::Bool(b),
            Scalar::Int(i) => Attr::Int(i),
            Scalar::Float(f) => Attr::Float(f),
        }
    }
}

/// Words the text format reads as something other than a string when bare.
pub(crate) fn is_reserved_word(s: &str) -> bool {
    matches!(s, "true" | "false" | "inf" | "nan") || DType::from_name(s).is_some()
}

/// Whether `s` can be written without quotes: an identifier that is not reserved.
pub(crate) fn is_bare_word(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && !is_reserved_word(s)
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Bool(b) => write!(f, "{b}"),
            Attr::Int(i) => write!(f, "{i}"),
            Attr::Float(x) => write_float(f, *x),
            Attr::Str(s) if is_bare_word(s) => f.write_str(s),
            Attr::Str(s) => {
                f.write_str("\"")?;
                for c in s.chars() {
                    match c {
                        '"' => f.write_str("\\\"")?,
                        '\\' => f.write_str("\\\\")?,
                        '\n' => f.write_str("\\n")?,
                        c => write!(f, "{c}")?,
                    }
                }
                f.write_str("\"")
            }
            Attr::DType(d) => write!(f, "{d}"),
            Attr::List(items) => {
                f.write_str("[")?;
                for (i, a) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// An op's attributes, ordered by key so printing and hashing are deterministic.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Attrs(pub BTreeMap<String, Attr>);

impl Attrs {
    /// No attributes.
    pub fn new() -> Attrs {
        Attrs::default()
    }

    /// Adds or replaces one attribute, builder style.
    pub fn with(mut self, key: &str, value: impl Into<Attr>) -> Attrs {
        self.0.insert(key.to_string(), value.into());
        self
    }

    /// The raw value of a key.
    pub fn get(&self, key: &str) -> Option<&Attr> {
        self.0.get(key)
    }

    /// Whether no attributes are set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Iterates in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Attr)> {
        self.0.iter()
    }

    /// Errors unless every key is one of `allowed`.
    pub fn check_keys(&self, allowed: &[&str]) -> Result<(), String> {
        for k in self.0.keys() {
            if !allowed.contains(&k.as_str()) {
                let expected = if allowed.is_empty() {
                    "it takes no attributes".to_string()
                } else {
                    format!("expected one of: {}", allowed.join(", "))
                };
                return Err(format!("unknown attribute `{k}` ({expected})"));
            }
        }
        Ok(())
    }

    fn missing(key: &str) -> String {
        format!("missing attribute `{key}`")
    }

    fn bad(key: &str, want: &str, got: &Attr) -> String {
        format!("attribute `{key}` must be {want}, got `{got}`")
    }

    /// An integer attribute, or `default` when absent.
    pub fn int_or(&self, key: &str, default: i64) -> Result<i64, String> {
        match self.get(key) {
            None => Ok(default),
            Some(Attr::Int(i)) => Ok(*i),
            Some(a) => Err(Self::bad(key, "an integer", a)),
        }
    }

    /// A required integer attribute.
    pub fn int(&self, key: &str) -> Result<i64, String> {
        match self.get(key) {
            None => Err(Self::missing(key)),
            Some(_) => self.int_or(key, 0),
        }
    }

    /// A float attribute (integers accepted), or `default` when absent.
    pub fn float_or(&self, key: &str, default: f64) -> Result<f64, String> {
        match self.get(key) {
            None => Ok(default),
            Some(Attr::Float(f)) => Ok(*f),
            Some(Attr::Int(i)) => Ok(*i as f64),
            Some(a) => Err(Self::bad(key, "a number", a)),
        }
    }

    /// A bool attribute, or `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, String> {
        match self.get(key) {
            None => Ok(default),
            Some(Attr::Bool(b)) => Ok(*b),
            Some(a) => Err(Self::bad(key, "true or false", a)),
        }
    }

    /// A string attribute, or `default` when absent.
    pub fn str_or<'a>(&'a self, key: &str, default: &'a str) -> Result<&'a str, String> {
        match self.get(key) {
            None => Ok(default),
            Some(Attr::Str(s)) => Ok(s),
            Some(a) => Err(Self::bad(key, "a string", a)),
        }
    }

    /// A dtype attribute, or `default` when absent.
    pub fn dtype_or(&self, key: &str, default: DType) -> Result<DType, String> {
        match self.get(key) {
            None => Ok(default),
            Some(Attr::DType(d)) => Ok(*d),
            Some(a) => Err(Self::bad(key, "a dtype (f32, f64, f16, bf16, i32, i64, bool)", a)),
        }
    }

    /// A list of integers, or `None` when absent.
    pub fn ints_opt(&self, key: &str) -> Result<Option<Vec<i64>>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Attr::List(items)) => items
                .iter()
                .map(|a| match a {
                    Attr::Int(i) => Ok(*i),
                    _ => Err(Self::bad(key, "a list of integers", &Attr::List(items.clone()))),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(a) => Err(Self::bad(key, "a list of integers", a)),
        }
    }

    /// A list of numbers (integers accepted), or `None` when absent.
    pub fn floats_opt(&self, key: &str) -> Result<Option<Vec<f64>>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Attr::List(items)) => items
                .iter()
                .map(|a| match a {
                    Attr::Float(f) => Ok(*f),
                    Attr::Int(i) => Ok(*i as f64),
                    _ => Err(Self::bad(key, "a list of numbers", &Attr::List(items.clone()))),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(a) => Err(Self::bad(key, "a list of numbers", a)),
        }
    }

    /// A list of strings, or `None` when absent.
    pub fn strs_opt(&self, key: &str) -> Result<Option<Vec<&str>>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Attr::List(items)) => items
                .iter()
                .map(|a| match a {
                    Attr::Str(s) => Ok(s.as_str()),
                    _ => Err(Self::bad(key, "a list of strings", &Attr::List(items.clone()))),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(a) => Err(Self::bad(key, "a list of strings", a)),
        }
    }

    /// A required list of integers.
    pub fn ints(&self, key: &str) -> Result<Vec<i64>, String> {
        self.ints_opt(key)?.ok_or_else(|| Self::missing(key))
    }

    /// A required list of non-negative integers (a shape).
    pub fn shape(&self, key: &str) -> Result<Vec<usize>, String> {
        self.ints(key)?
            .into_iter()
            .map(|d| usize::try_from(d).map_err(|_| format!("attribute `{key}` has negative size {d}")))
            .collect()
    }

    /// A scalar-valued attribute (bool, int or float), or `None` when absent.
    pub fn scalar_opt(&self, key: &str) -> Result<Option<Scalar>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Attr::Bool(b)) => Ok(Some(Scalar::Bool(*b))),
            Some(Attr::Int(i)) => Ok(Some(Scalar::Int(*i))),
            Some(Attr::Float(f)) => Ok(Some(Scalar::Float(*f))),
            Some(a) => Err(Self::bad(key, "a number or bool", a)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_print_bare_only_when_unambiguous() {
        assert_eq!(Attr::Str("tanh".into()).to_string(), "tanh");
        assert_eq!(Attr::Str("f32".into()).to_string(), "\"f32\"");
        assert_eq!(Attr::Str("bij,jk->bik".into()).to_string(), "\"bij,jk->bik\"");
        assert_eq!(Attr::Str("min-peak".into()).to_string(), "\"min-peak\"");
    }

    #[test]
    fn accessors_name_the_key() {
        let a = Attrs::new().with("perm", Attr::Str("x".into()));
        let e = a.ints("perm").unwrap_err();
        assert!(e.contains("`perm`"), "{e}");
        assert!(
            a.check_keys(&["dims"])
                .unwrap_err()
                .contains("unknown attribute `perm`")
        );
        assert!(
            a.int("missing")
                .unwrap_err()
                .contains("missing attribute `missing`")
        );
    }
}
