//! The memory-timeline SVG, parsed: well formed, the fill closed to the
//! baseline, every label inside the drawing, and ticks on the step axis.

use super::{bin, example, ok, scratch};

/// An element: its name and attributes.
struct Element {
    name: String,
    attrs: Vec<(String, String)>,
}

impl Element {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
    fn num(&self, key: &str) -> f64 {
        self.attr(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("<{}> has no number `{key}`", self.name))
    }
}

/// Parses `svg` as XML: every element with its attributes and, for
/// `<text>`, its content; panics where it is not well formed (a tag not
/// closed, closed out of order, or an attribute without quotes).
fn parse(svg: &str) -> Vec<(Element, String)> {
    let mut out: Vec<(Element, String)> = Vec::new();
    let mut open: Vec<(String, usize)> = Vec::new();
    let mut rest = svg;
    while let Some(start) = rest.find('<') {
        let text = &rest[..start];
        if let Some((_, at)) = open.last() {
            out[*at].1.push_str(text);
        }
        let end = rest[start..].find('>').expect("a tag closes") + start;
        let tag = &rest[start + 1..end];
        rest = &rest[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let (opened, _) = open.pop().expect("a closing tag has an opening one");
            assert_eq!(opened, name.trim(), "tags close in order");
            continue;
        }
        let self_closing = tag.ends_with('/');
        let tag = tag.trim_end_matches('/');
        let (name, mut attrs_text) = tag.split_once(' ').unwrap_or((tag, ""));
        let mut attrs = Vec::new();
        while let Some(eq) = attrs_text.find('=') {
            let key = attrs_text[..eq].trim().to_string();
            let after = &attrs_text[eq + 1..];
            let quote = after.chars().next().expect("a value");
            assert!(quote == '"' || quote == '\'', "attribute `{key}` is quoted");
            let close = after[1..].find(quote).expect("a quoted value closes") + 1;
            attrs.push((key, after[1..close].to_string()));
            attrs_text = &after[close + 1..];
        }
        out.push((
            Element {
                name: name.to_string(),
                attrs,
            },
            String::new(),
        ));
        if !self_closing {
            open.push((name.to_string(), out.len() - 1));
        }
    }
    assert!(
        open.is_empty(),
        "unclosed: {:?}",
        open.iter().map(|o| &o.0).collect::<Vec<_>>()
    );
    out
}

#[test]
fn the_memory_timeline_is_drawn_inside_its_frame_with_a_closed_fill_and_ticks() {
    let path = scratch("timeline-parsed.svg");
    ok(sw!(
        "plan",
        example("parallel_paths_inefficient.trace"),
        "--executors",
        "fallback",
        "--schedule",
        "program",
        "--memory-timeline",
        &path
    ));
    let svg = std::fs::read_to_string(&path).unwrap();
    let elements = parse(&svg);
    let root = &elements[0].0;
    assert_eq!(root.name, "svg");
    let (w, h) = (root.num("width"), root.num("height"));
    // Every label lies inside the drawing, at about 7 px a character.
    for (e, text) in elements.iter().filter(|(e, _)| e.name == "text") {
        let (x, y) = (e.num("x"), e.num("y"));
        let width = 7.0 * text.chars().count() as f64;
        let (from, to) = match e.attr("text-anchor") {
            Some("end") => (x - width, x),
            Some("middle") => (x - width / 2.0, x + width / 2.0),
            _ => (x, x + width),
        };
        assert!(from >= 0.0 && to <= w, "`{text}` spans x {from}..{to} of {w}");
        assert!(y > 12.0 && y <= h, "`{text}` at y {y} of {h}");
    }
    // The filled step line is closed along the baseline.
    let fill = elements
        .iter()
        .find(|(e, _)| e.name == "path" && e.attr("fill").is_some_and(|f| f != "none"))
        .expect("a filled path");
    let d = fill.0.attr("d").unwrap();
    assert!(d.trim_end().ends_with('Z'), "{d}");
    let start_y = d.trim_start_matches('M').split_whitespace().nth(1).unwrap();
    let points: Vec<&str> = d.split('L').collect();
    let last = points
        .last()
        .unwrap()
        .trim_end_matches('Z')
        .split_whitespace()
        .nth(1)
        .unwrap();
    assert_eq!(
        start_y.parse::<f64>().unwrap(),
        last.parse::<f64>().unwrap(),
        "the fill ends on the baseline it starts on: {d}"
    );
    // Ticks on the step axis: labelled with whole steps, increasing.
    let ticks: Vec<f64> = elements
        .iter()
        .filter(|(e, t)| {
            e.name == "text" && e.attr("text-anchor") == Some("middle") && t.parse::<usize>().is_ok()
        })
        .map(|(_, t)| t.parse().unwrap())
        .collect();
    assert!(ticks.len() >= 3, "{ticks:?}");
    assert!(ticks.windows(2).all(|p| p[0] < p[1]), "{ticks:?}");
}
