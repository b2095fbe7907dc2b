//! Trace text format, version 1: one statement a line, `#` comments.
//!
//! ```text
//! input t0: f32[256, 256]
//! t1 = relu(t0)
//! t2 = matmul(t1, t1)
//! s = sum(t2, dims=[1], keepdim=true)
//! y = mul(s, 0.5)
//! hint executor=fallback {
//!   z = exp(y)
//! }
//! output z, t2
//! ```

mod lexer;
mod parser;
mod printer;

pub use parser::{parse, parse_named};
pub use printer::print;
