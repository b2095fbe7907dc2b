//! The parser of trace text format version 1 (see DESIGN.md).
//!
//! Ops go through [`TraceBuilder`], so a parsed trace is inferred and checked
//! exactly like one built in Rust; builder errors come back with the position of
//! the statement.

use foldhash::HashMap;

use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::ir::hint as hints;
use crate::ir::{Attr, Attrs, OpKind, Operand, Trace, TraceBuilder, ValueId, is_reserved_word};
use crate::meta::{Device, TensorMeta, contiguous_strides};
use crate::text::lexer::{Spanned, Tok, lex};

/// Words that cannot name a value.
fn reserved_value_name(name: &str) -> bool {
    is_reserved_word(name) || matches!(name, "input" | "output" | "hint")
}

struct Parser<'a> {
    toks: Vec<Spanned>,
    pos: usize,
    source: Option<&'a str>,
    b: TraceBuilder,
    defined_at: HashMap<String, usize>,
    open_hints: Vec<(usize, usize)>,
    output_seen: Option<usize>,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].tok
    }

    fn peek_at(&self, k: usize) -> &Tok {
        &self.toks[(self.pos + k).min(self.toks.len() - 1)].tok
    }

    fn here(&self) -> (usize, usize) {
        let t = &self.toks[self.pos];
        (t.line, t.col)
    }

    fn error_at(&self, (line, col): (usize, usize), message: impl Into<String>) -> Error {
        Error::Parse {
            source_name: self.source.map(str::to_string),
            line,
            col,
            message: message.into(),
        }
    }

    fn error(&self, message: impl Into<String>) -> Error {
        self.error_at(self.here(), message)
    }

    fn next(&mut self) -> Tok {
        let t = self.toks[self.pos].tok.clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn expect_punct(&mut self, c: char, context: &str) -> Result<()> {
        match self.peek() {
            Tok::Punct(p) if *p == c => {
                self.next();
                Ok(())
            }
            other => Err(self.error(format!("expected `{c}` {context}, found {}", other.describe()))),
        }
    }

    fn ident(&mut self, what: &str) -> Result<String> {
        match self.peek().clone() {
            Tok::Ident(s) => {
                self.next();
                Ok(s)
            }
            other => Err(self.error(format!("expected {what}, found {}", other.describe()))),
        }
    }

    fn end_of_statement(&mut self) -> Result<()> {
        match self.peek() {
            Tok::Newline => {
                self.next();
                Ok(())
            }
            Tok::Eof | Tok::Punct('}') => Ok(()),
            other => Err(self.error(format!("expected end of line, found {}", other.describe()))),
        }
    }

    fn uint(&mut self, what: &str) -> Result<usize> {
        match self.peek().clone() {
            Tok::Int(i) if i >= 0 => {
                self.next();
                Ok(i as usize)
            }
            other => Err(self.error(format!(
                "expected {what} (a non-negative integer), found {}",
                other.describe()
            ))),
        }
    }

    /// `[item, item, ...]`: the items between brackets, comma-separated.
    fn bracketed<T>(&mut self, what: &str, mut item: impl FnMut(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        self.expect_punct('[', &format!("to open {what}"))?;
        let mut v = Vec::new();
        loop {
            if let Tok::Punct(']') = self.peek() {
                self.next();
                return Ok(v);
            }
            v.push(item(self)?);
            match self.peek() {
                Tok::Punct(',') => {
                    self.next();
                }
                Tok::Punct(']') => {}
                other => {
                    return Err(self.error(format!(
                        "expected `,` or `]` in {what}, found {}",
                        other.describe()
                    )));
                }
            }
        }
    }

    fn int_list(&mut self, what: &str) -> Result<Vec<i64>> {
        self.bracketed(what, |p| match p.peek().clone() {
            Tok::Int(i) => {
                p.next();
                Ok(i)
            }
            other => Err(p.error(format!(
                "expected an integer in {what}, found {}",
                other.describe()
            ))),
        })
    }

    /// `f32[2, 3] strides=[1, 2] cuda:0`
    fn tensor_type(&mut self) -> Result<TensorMeta> {
        let at = self.here();
        let name = self.ident("a dtype")?;
        let dtype = DType::from_name(&name).ok_or_else(|| {
            self.error_at(
                at,
                format!("unknown dtype `{name}` (expected f32, f64, f16, bf16, i32, i64 or bool)"),
            )
        })?;
        let shape = self.bracketed("the shape", |p| p.uint("a dimension size"))?;
        let mut meta = TensorMeta::new(dtype, shape);
        if matches!(self.peek(), Tok::Ident(s) if s == "strides") {
            self.next();
            self.expect_punct('=', "after `strides`")?;
            let at = self.here();
            let strides = self.int_list("the strides")?;
            if strides.len() != meta.rank() {
                return Err(self.error_at(
                    at,
                    format!("{} strides given for rank {}", strides.len(), meta.rank()),
                ));
            }
            if strides.iter().any(|&s| s < 0) {
                return Err(self.error_at(at, "strides must be non-negative"));
            }
            meta.strides = strides.into_iter().map(|s| s as isize).collect();
        } else {
            meta.strides = contiguous_strides(&meta.shape);
        }
        if let Tok::Ident(dev) = self.peek().clone() {
            let at = self.here();
            self.next();
            let text = if matches!(self.peek(), Tok::Punct(':')) {
                self.next();
                let n = self.uint("a device ordinal")?;
                format!("{dev}:{n}")
            } else {
                dev
            };
            meta.device = Device::parse(&text).ok_or_else(|| {
                self.error_at(at, format!("unknown device `{text}` (expected cpu or cuda:N)"))
            })?;
        }
        Ok(meta)
    }

    fn attr_value(&mut self) -> Result<Attr> {
        self.attr_value_at(0)
    }

    fn attr_value_at(&mut self, depth: usize) -> Result<Attr> {
        // Lists nest, and the nesting comes from the user: bound it.
        if depth > 32 {
            return Err(self.error("lists nest more than 32 deep"));
        }
        match self.peek() {
            Tok::Punct('[') => {
                return Ok(Attr::List(
                    self.bracketed("a list", |p| p.attr_value_at(depth + 1))?,
                ));
            }
            Tok::Newline | Tok::Eof | Tok::Punct(_) => {
                return Err(self.error(format!(
                    "expected an attribute value, found {}",
                    self.peek().describe()
                )));
            }
            _ => {}
        }
        match self.next() {
            Tok::Int(i) => Ok(Attr::Int(i)),
            Tok::Float(f) => Ok(Attr::Float(f)),
            Tok::Str(s) => Ok(Attr::Str(s)),
            Tok::Ident(w) => Ok(match w.as_str() {
                "true" => Attr::Bool(true),
                "false" => Attr::Bool(false),
                _ => match DType::from_name(&w) {
                    Some(d) => Attr::DType(d),
                    None => Attr::Str(w),
                },
            }),
            other => Err(self.error(format!("expected an attribute value, found {}", other.describe()))),
        }
    }

    fn define_check(&self, name: &str, at: (usize, usize)) -> Result<()> {
        if reserved_value_name(name) {
            return Err(self.error_at(at, format!("`{name}` is a reserved word and cannot name a value")));
        }
        if let Some(line) = self.defined_at.get(name) {
            return Err(self.error_at(at, format!("`{name}` is already defined on line {line}")));
        }
        Ok(())
    }

    fn lookup(&self, name: &str, at: (usize, usize)) -> Result<ValueId> {
        self.b
            .lookup(name)
            .filter(|_| self.defined_at.contains_key(name))
            .ok_or_else(|| self.error_at(at, format!("undefined value `{name}`")))
    }

    fn statement(&mut self) -> Result<()> {
        let at = self.here();
        match self.peek().clone() {
            Tok::Newline => {
                self.next();
                Ok(())
            }
            Tok::Punct('}') => {
                self.next();
                if self.open_hints.pop().is_none() {
                    return Err(self.error_at(at, "`}` without an open `hint` block"));
                }
                self.b.close_span();
                self.end_of_statement()
            }
            Tok::Ident(w) if w == "input" && matches!(self.peek_at(1), Tok::Ident(_)) => {
                self.next();
                let name_at = self.here();
                let name = self.ident("an input name")?;
                self.define_check(&name, name_at)?;
                self.expect_punct(':', "after the input name")?;
                let meta = self.tensor_type()?;
                self.b
                    .input_meta(&name, meta)
                    .map_err(|e| self.error_at(name_at, e.to_string()))?;
                self.defined_at.insert(name, at.0);
                self.end_of_statement()
            }
            Tok::Ident(w) if w == "output" && matches!(self.peek_at(1), Tok::Ident(_)) => {
                self.next();
                if let Some(line) = self.output_seen {
                    return Err(self.error_at(
                        at,
                        format!("a second `output` statement (the first is on line {line})"),
                    ));
                }
                self.output_seen = Some(at.0);
                let mut outs = Vec::new();
                loop {
                    let name_at = self.here();
                    let name = self.ident("an output value")?;
                    // A value may be returned twice, as an importer's
                    // graph may return it: every valid trace prints as
                    // text that reads back.
                    let v = self.lookup(&name, name_at)?;
                    outs.push(v);
                    if let Tok::Punct(',') = self.peek() {
                        self.next();
                    } else {
                        break;
                    }
                }
                self.b.output(&outs);
                self.end_of_statement()
            }
            Tok::Ident(w) if w == "hint" && !matches!(self.peek_at(1), Tok::Punct('=') | Tok::Punct(',')) => {
                self.next();
                let mut hints = Attrs::new();
                loop {
                    match self.peek().clone() {
                        Tok::Punct('{') => {
                            self.next();
                            break;
                        }
                        Tok::Ident(key) => {
                            let key_at = self.here();
                            self.next();
                            if !hints::KEYS.contains(&key.as_str()) {
                                return Err(self.error_at(
                                    key_at,
                                    format!(
                                        "unknown hint `{key}` (expected one of: {})",
                                        hints::KEYS.join(", ")
                                    ),
                                ));
                            }
                            self.expect_punct('=', "after the hint key")?;
                            let val_at = self.here();
                            let value = self.attr_value()?;
                            hints::check(&key, &value).map_err(|m| self.error_at(val_at, m))?;
                            if hints.0.insert(key.clone(), value).is_some() {
                                return Err(self.error_at(key_at, format!("hint `{key}` is given twice")));
                            }
                        }
                        other => {
                            return Err(self.error(format!(
                                "expected a hint `key=value` or `{{`, found {}",
                                other.describe()
                            )));
                        }
                    }
                }
                self.b.open_span(hints);
                self.open_hints.push(at);
                // A statement may follow `{` on the same line.
                if let Tok::Newline = self.peek() {
                    self.next();
                }
                Ok(())
            }
            Tok::Ident(_) => self.op_statement(),
            other => Err(self.error(format!("expected a statement, found {}", other.describe()))),
        }
    }

    /// `a, b = op(x, 0.5, key=value, ...)`
    fn op_statement(&mut self) -> Result<()> {
        let mut names = Vec::new();
        loop {
            let at = self.here();
            let name = self.ident("a value name")?;
            self.define_check(&name, at)?;
            if names.iter().any(|(n, _)| *n == name) {
                return Err(self.error_at(at, format!("`{name}` is assigned twice in one statement")));
            }
            names.push((name, at));
            match self.peek() {
                Tok::Punct(',') => {
                    self.next();
                }
                Tok::Punct('=') => {
                    self.next();
                    break;
                }
                other => {
                    return Err(self.error(format!(
                        "expected `=` or `,` after a value name, found {}",
                        other.describe()
                    )));
                }
            }
        }
        let op_at = self.here();
        let op_name = self.ident("an op name")?;
        let kind = OpKind::from_name(&op_name)
            .ok_or_else(|| self.error_at(op_at, format!("unknown op `{op_name}`")))?;
        self.expect_punct('(', "after the op name")?;
        let mut operands = Vec::new();
        let mut attrs = Attrs::new();
        loop {
            let arg_at = self.here();
            match self.peek().clone() {
                Tok::Punct(')') => {
                    self.next();
                    break;
                }
                Tok::Ident(key) if matches!(self.peek_at(1), Tok::Punct('=')) => {
                    self.next();
                    self.next();
                    let value = self.attr_value()?;
                    if attrs.0.insert(key.clone(), value).is_some() {
                        return Err(self.error_at(arg_at, format!("attribute `{key}` is given twice")));
                    }
                }
                tok => {
                    if !attrs.is_empty() {
                        return Err(self.error_at(arg_at, "operands must come before attributes"));
                    }
                    self.next();
                    operands.push(match tok {
                        Tok::Ident(w) if w == "true" => Operand::Scalar(Scalar::Bool(true)),
                        Tok::Ident(w) if w == "false" => Operand::Scalar(Scalar::Bool(false)),
                        Tok::Ident(w) => Operand::Value(self.lookup(&w, arg_at)?),
                        Tok::Int(i) => Operand::Scalar(Scalar::Int(i)),
                        Tok::Float(f) => Operand::Scalar(Scalar::Float(f)),
                        other => {
                            return Err(self.error_at(
                                arg_at,
                                format!("expected an operand, found {}", other.describe()),
                            ));
                        }
                    });
                }
            }
            match self.peek() {
                Tok::Punct(',') => {
                    self.next();
                }
                Tok::Punct(')') => {}
                other => {
                    return Err(self.error(format!(
                        "expected `,` or `)` in the arguments, found {}",
                        other.describe()
                    )));
                }
            }
        }
        let name_refs: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
        self.b.set_line(Some(op_at.0));
        self.b
            .op_named(&name_refs, kind, &operands, attrs)
            .map_err(|e| match e {
                Error::Op { op, message, .. } => {
                    self.error_at(op_at, format!("{op_name}: {message} (in `{op}`)"))
                }
                other => self.error_at(op_at, other.to_string()),
            })?;
        for (n, _) in names {
            self.defined_at.insert(n, op_at.0);
        }
        self.end_of_statement()
    }
}

/// Parses a trace from text. `source_name` (a file name) is used in messages.
pub fn parse_named(src: &str, source_name: Option<&str>) -> Result<Trace> {
    let toks = lex(src, source_name)?;
    let mut p = Parser {
        toks,
        pos: 0,
        source: source_name,
        b: TraceBuilder::new(),
        defined_at: HashMap::default(),
        open_hints: Vec::new(),
        output_seen: None,
    };
    while !matches!(p.peek(), Tok::Eof) {
        p.statement()?;
    }
    if let Some(&at) = p.open_hints.last() {
        return Err(p.error_at(at, "this `hint` block is never closed with `}`"));
    }
    if p.output_seen.is_none() {
        return Err(p.error("the trace has no `output` statement"));
    }
    let end = p.here();
    let trace = p.b.finish().map_err(|e| Error::Parse {
        source_name: source_name.map(str::to_string),
        line: end.0,
        col: end.1,
        message: e.to_string(),
    })?;
    Ok(trace)
}

/// Parses a trace from text.
pub fn parse(src: &str) -> Result<Trace> {
    parse_named(src, None)
}
