//! The printer of trace text format version 1: `parse(print(t)) == t`.

use std::fmt::Write;

use crate::ir::{Operand, SpanId, Trace};

/// A trace prints as its text ([`print`]).
impl std::fmt::Display for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&print(self))
    }
}

fn span_chain(trace: &Trace, span: Option<SpanId>) -> Vec<SpanId> {
    let mut chain = Vec::new();
    let mut s = span;
    while let Some(id) = s {
        chain.push(id);
        s = trace.spans[id.index()].parent;
    }
    chain.reverse();
    chain
}

/// Prints a trace in the text format.
pub fn print(trace: &Trace) -> String {
    let mut out = String::new();
    for &i in &trace.inputs {
        let v = trace.value(i);
        let _ = writeln!(out, "input {}: {}", v.name, v.meta);
    }
    let mut open: Vec<SpanId> = Vec::new();
    for op in &trace.ops {
        let chain = span_chain(trace, op.span);
        let common = open.iter().zip(&chain).take_while(|(a, b)| a == b).count();
        while open.len() > common {
            open.pop();
            let _ = writeln!(out, "{}}}", "  ".repeat(open.len()));
        }
        for &s in &chain[common..] {
            let _ = write!(out, "{}hint", "  ".repeat(open.len()));
            for (k, v) in trace.spans[s.index()].hints.iter() {
                let _ = write!(out, " {k}={v}");
            }
            out.push_str(" {\n");
            open.push(s);
        }
        out.push_str(&"  ".repeat(open.len()));
        let names: Vec<&str> = op.outputs.iter().map(|v| trace.value(*v).name.as_str()).collect();
        let _ = write!(out, "{} = {}(", names.join(", "), op.kind.name());
        let mut first = true;
        for o in &op.operands {
            if !first {
                out.push_str(", ");
            }
            first = false;
            match o {
                Operand::Value(v) => out.push_str(&trace.value(*v).name),
                Operand::Scalar(s) => {
                    let _ = write!(out, "{s}");
                }
            }
        }
        for (k, v) in op.attrs.iter() {
            if !first {
                out.push_str(", ");
            }
            first = false;
            let _ = write!(out, "{k}={v}");
        }
        out.push_str(")\n");
    }
    while !open.is_empty() {
        open.pop();
        let _ = writeln!(out, "{}}}", "  ".repeat(open.len()));
    }
    let outs: Vec<&str> = trace
        .outputs
        .iter()
        .map(|v| trace.value(*v).name.as_str())
        .collect();
    let _ = writeln!(out, "output {}", outs.join(", "));
    out
}
