//! Tokens of the trace text format, each with its line and column.

use crate::error::Error;

/// A token.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// Identifier: `[A-Za-z_][A-Za-z0-9_.]*`.
    Ident(String),
    /// Integer literal.
    Int(i64),
    /// Float literal, `inf`/`-inf`/`nan` included.
    Float(f64),
    /// Double-quoted string.
    Str(String),
    /// One of `= , ( ) [ ] { } :`.
    Punct(char),
    /// End of a line.
    Newline,
    /// End of input.
    Eof,
}

impl Tok {
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Int(i) => format!("`{i}`"),
            Tok::Float(f) => format!("`{f}`"),
            Tok::Str(s) => format!("\"{s}\""),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::Newline => "end of line".into(),
            Tok::Eof => "end of input".into(),
        }
    }
}

/// A token and where it starts (1-based).
#[derive(Clone, Debug)]
pub(crate) struct Spanned {
    pub tok: Tok,
    pub line: usize,
    pub col: usize,
}

pub(crate) fn lex(src: &str, source_name: Option<&str>) -> Result<Vec<Spanned>, Error> {
    let mut out = Vec::new();
    let chars: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut col) = (0usize, 1usize, 1usize);
    let error = |line, col, message: String| Error::Parse {
        source_name: source_name.map(str::to_string),
        line,
        col,
        message,
    };
    while i < chars.len() {
        let c = chars[i];
        let (tl, tc) = (line, col);
        let advance = |i: &mut usize, col: &mut usize, n: usize| {
            *i += n;
            *col += n;
        };
        match c {
            '\n' => {
                out.push(Spanned {
                    tok: Tok::Newline,
                    line,
                    col,
                });
                i += 1;
                line += 1;
                col = 1;
            }
            c if c.is_whitespace() => advance(&mut i, &mut col, 1),
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    advance(&mut i, &mut col, 1);
                }
            }
            '=' | ',' | '(' | ')' | '[' | ']' | '{' | '}' | ':' => {
                out.push(Spanned {
                    tok: Tok::Punct(c),
                    line,
                    col,
                });
                advance(&mut i, &mut col, 1);
            }
            '"' => {
                let mut s = String::new();
                advance(&mut i, &mut col, 1);
                loop {
                    match chars.get(i) {
                        None | Some('\n') => return Err(error(tl, tc, "unterminated string".into())),
                        Some('"') => {
                            advance(&mut i, &mut col, 1);
                            break;
                        }
                        Some('\\') => {
                            let e = match chars.get(i + 1) {
                                Some('n') => '\n',
                                Some('"') => '"',
                                Some('\\') => '\\',
                                other => {
                                    return Err(error(
                                        line,
                                        col,
                                        format!("unknown escape `\\{}`", other.copied().unwrap_or(' ')),
                                    ));
                                }
                            };
                            s.push(e);
                            advance(&mut i, &mut col, 2);
                        }
                        Some(&ch) => {
                            s.push(ch);
                            advance(&mut i, &mut col, 1);
                        }
                    }
                }
                out.push(Spanned {
                    tok: Tok::Str(s),
                    line: tl,
                    col: tc,
                });
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.')
                {
                    advance(&mut i, &mut col, 1);
                }
                let word: String = chars[start..i].iter().collect();
                let tok = match word.as_str() {
                    "inf" => Tok::Float(f64::INFINITY),
                    "nan" => Tok::Float(f64::NAN),
                    _ => Tok::Ident(word),
                };
                out.push(Spanned {
                    tok,
                    line: tl,
                    col: tc,
                });
            }
            c if c.is_ascii_digit() || c == '-' || c == '+' || c == '.' => {
                let start = i;
                advance(&mut i, &mut col, 1);
                while i < chars.len() {
                    let ch = chars[i];
                    let exp_sign = (ch == '-' || ch == '+') && matches!(chars[i - 1], 'e' | 'E');
                    if ch.is_ascii_alphanumeric() || ch == '.' || exp_sign {
                        advance(&mut i, &mut col, 1);
                    } else {
                        break;
                    }
                }
                let text: String = chars[start..i].iter().collect();
                let tok = match text.as_str() {
                    "-inf" => Tok::Float(f64::NEG_INFINITY),
                    "+inf" => Tok::Float(f64::INFINITY),
                    _ if text.contains(['.', 'e', 'E']) => Tok::Float(
                        text.parse()
                            .map_err(|_| error(tl, tc, format!("bad number `{text}`")))?,
                    ),
                    _ => Tok::Int(
                        text.parse()
                            .map_err(|_| error(tl, tc, format!("bad number `{text}`")))?,
                    ),
                };
                out.push(Spanned {
                    tok,
                    line: tl,
                    col: tc,
                });
            }
            other => return Err(error(tl, tc, format!("unexpected character `{other}`"))),
        }
    }
    out.push(Spanned {
        tok: Tok::Eof,
        line,
        col,
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        lex(s, None).unwrap().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn numbers() {
        assert_eq!(
            toks("1 -2 0.5 1e-6 -inf")[..5],
            [
                Tok::Int(1),
                Tok::Int(-2),
                Tok::Float(0.5),
                Tok::Float(1e-6),
                Tok::Float(f64::NEG_INFINITY)
            ]
        );
        assert!(lex("1x", None).is_err());
        assert!(lex("-", None).is_err());
    }

    #[test]
    fn positions() {
        let t = lex("a = b\n  c", None).unwrap();
        assert_eq!((t[4].line, t[4].col), (2, 3));
    }
}
