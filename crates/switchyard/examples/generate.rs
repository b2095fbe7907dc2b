//! A greedy decoding loop through a `Session`: a decoder with a key/value
//! cache (inputs `input_ids`, `attention_mask`, `position_ids` and
//! `past_key_values.N.key` / `.value`; outputs `logits` and
//! `present.N.key` / `.value`, as Hugging Face exports GPT-2), fed its own
//! presents back for `steps` tokens. Prints the time of the whole loop and
//! how much of it went to importing, planning and compiling.
//!
//! ```text
//! cargo run --release -p switchyard --example generate -- MODEL.onnx [STEPS] [PROMPT,TOKENS]
//! ```

use std::time::Instant;

use switchyard::{Dim, Session, SessionOptions, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .ok_or("usage: generate MODEL.onnx [STEPS] [PROMPT,TOKENS]")?;
    let steps: usize = args.next().map_or(Ok(256), |s| s.parse())?;
    let prompt: Vec<i64> = match args.next() {
        Some(p) => p.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![177, 24, 171, 137, 5, 234, 30, 251],
    };
    let session = Session::from_onnx(&model, &SessionOptions::default())?;
    let past_names: Vec<String> = session
        .inputs()
        .iter()
        .filter(|i| i.name.starts_with("past_key_values."))
        .map(|i| i.name.clone())
        .collect();
    // Heads and head size are the fixed dims of a past: [batch, heads, past, size].
    let fixed = |d: &Dim| match d {
        Dim::Fixed(n) => Ok(*n),
        other => Err(format!("a past's heads and size must be fixed, not {other}")),
    };
    let dims = session
        .inputs()
        .iter()
        .find(|i| i.name.starts_with("past_key_values."))
        .and_then(|i| i.dims.clone())
        .ok_or("the model has no past_key_values inputs with declared dims")?;
    let (heads, size) = (fixed(&dims[1])?, fixed(&dims[3])?);
    let ids = |v: Vec<i64>| {
        let n = v.len();
        Tensor::from_vec(v, &[1, n])
    };
    let mut past: Vec<Tensor> = past_names
        .iter()
        .map(|_| Tensor::from_vec(Vec::<f32>::new(), &[1, heads, 0, size]))
        .collect::<Result<_, _>>()?;
    let mut tokens = prompt.clone();
    let t0 = Instant::now();
    for step in 0..steps {
        let past_len = past[0].shape()[2];
        let new = match step {
            0 => prompt.clone(),
            _ => vec![*tokens.last().expect("the prompt is not empty")],
        };
        let positions = (past_len as i64..(past_len + new.len()) as i64).collect();
        let mut feeds = vec![
            ("input_ids", ids(new.clone())?),
            ("attention_mask", ids(vec![1; past_len + new.len()])?),
            ("position_ids", ids(positions)?),
        ];
        feeds.extend(past_names.iter().map(|n| n.as_str()).zip(past.iter().cloned()));
        let out = session.run(&feeds)?;
        let logits = &out
            .iter()
            .find(|(n, _)| n == "logits")
            .ok_or("no `logits` output")?
            .1;
        let vocab = *logits.shape().last().ok_or("scalar logits")?;
        let row = logits.to_vec::<f32>().ok_or("logits are not f32")?;
        let last = &row[row.len() - vocab..];
        let best = (0..vocab).fold(0, |b, i| if last[i] > last[b] { i } else { b });
        tokens.push(best as i64);
        past = past_names
            .iter()
            .map(|n| {
                let present = n.replace("past_key_values", "present");
                out.iter()
                    .find(|(o, _)| *o == present)
                    .map(|(_, t)| t.clone())
                    .ok_or(format!("no `{present}` output"))
            })
            .collect::<Result<_, _>>()?;
    }
    let total = t0.elapsed();
    let stats = session.stats();
    println!(
        "{steps} steps in {:.1} ms ({:.1} us a step); importing, planning and compiling {} signatures: {:.1} ms, {:.1}% of the loop",
        total.as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e6 / steps as f64,
        stats.compiles,
        stats.compile_time.as_secs_f64() * 1e3,
        100.0 * stats.compile_time.as_secs_f64() / total.as_secs_f64()
    );
    let phase = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!(
        "of which importing {:.1} ms, planning {:.1} ms, compiling kernels {:.1} ms",
        phase(stats.phases.import),
        phase(stats.phases.plan),
        phase(stats.phases.compile)
    );
    println!("tokens: {:?}", &tokens[prompt.len()..]);
    Ok(())
}
