//! Resize and Upsample, decomposed at import.
//!
//! Every mode of Resize is separable: along each resized axis, output
//! position `o` is a weighted sum of a few input positions, the taps, whose
//! indices and weights depend only on the shapes and attributes, all known
//! at import. So each axis becomes `sum_t index_select(x, idx_t) * w_t`
//! with constant index lists and weight columns (nearest: one
//! `index_select`), axis after axis, and nothing new is needed from
//! executors. The taps follow ONNX's reference implementation: the source
//! coordinate from `coordinate_transformation_mode`, then the nearest taps
//! to it (edge positions repeated past the input), weighted by the mode's
//! coefficients (`exclude_outside` drops those past the input and
//! renormalises; `antialias` widens linear and cubic filters when
//! downsampling). `tf_crop_and_resize` gives `extrapolation_value` where the
//! source coordinate falls outside the input: such rows take no taps and a
//! constant instead, which later axes carry through since their weights sum
//! to one.

use switchyard_core::ir::{Attrs, OpKind, ValueId};
use switchyard_core::meta::ShapeDisplay;
use switchyard_core::{DType, Tensor};

use super::{LowerFn, Node, Out, axis, err, one, pass};

pub(super) const OPS: &[(&str, LowerFn)] = &[("Resize", resize), ("Upsample", upsample)];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coordinates {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Nearest {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

/// How one Resize interpolates.
#[derive(Clone, Copy, Debug)]
struct Spec {
    mode: Mode,
    coordinates: Coordinates,
    nearest: Nearest,
    cubic_a: f64,
    exclude_outside: bool,
    extrapolation: f64,
    antialias: bool,
}

/// One axis's taps: for output `o`, `n` input indices (edge-clamped) and
/// weights at `o * n ..`, and whether its source lies outside the input
/// (`tf_crop_and_resize`).
#[derive(Debug)]
struct Taps {
    n: usize,
    index: Vec<i64>,
    weight: Vec<f64>,
    outside: Vec<bool>,
}

fn nearest_coeffs(ratio: f64, integral: bool, mode: Nearest) -> Vec<f64> {
    let b = |x: bool| f64::from(u8::from(x));
    if integral {
        return vec![0.0, 1.0];
    }
    match mode {
        Nearest::RoundPreferFloor => vec![b(ratio <= 0.5), b(ratio > 0.5)],
        Nearest::RoundPreferCeil => vec![b(ratio < 0.5), b(ratio >= 0.5)],
        Nearest::Floor => vec![1.0, 0.0],
        Nearest::Ceil => vec![0.0, 1.0],
    }
}

fn cubic_kernel(x: f64, a: f64) -> f64 {
    let x = x.abs();
    let (x2, x3) = (x * x, x * x * x);
    if x <= 1.0 {
        (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
    } else if x < 2.0 {
        a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
    } else {
        0.0
    }
}

/// The mode's coefficients for a source coordinate `ratio` past its floor
/// (in (0, 1]), at `scale`.
fn coeffs(spec: &Spec, ratio: f64, integral: bool, scale: f64) -> Vec<f64> {
    match (spec.mode, spec.antialias) {
        (Mode::Nearest, _) => nearest_coeffs(ratio, integral, spec.nearest),
        (Mode::Linear, false) => vec![1.0 - ratio, ratio],
        (Mode::Cubic, false) => [ratio + 1.0, ratio, 1.0 - ratio, 2.0 - ratio]
            .iter()
            .map(|&x| cubic_kernel(x, spec.cubic_a))
            .collect(),
        (mode, true) => {
            // The filter stretched by 1 / scale when downsampling.
            let s = scale.min(1.0);
            let (reach, f): (f64, &dyn Fn(f64) -> f64) = match mode {
                Mode::Linear => (1.0, &|x: f64| (1.0 - x.abs()).clamp(0.0, 1.0)),
                _ => (2.0, &|x: f64| cubic_kernel(x, spec.cubic_a)),
            };
            let start = (-reach / s).floor() as i64 + 1;
            // Taps at start..2 - start around the source.
            let v: Vec<f64> = (start..2 - start).map(|i| f(s * (i as f64 - ratio))).collect();
            let total: f64 = v.iter().sum();
            v.into_iter().map(|c| c / total).collect()
        }
    }
}

/// The taps of one axis from `input` to `output` positions at `scale`.
fn axis_taps(spec: &Spec, input: usize, output: usize, scale: f64, roi: (f64, f64)) -> Taps {
    let (w_in, w_out) = (input as f64, scale * input as f64);
    let mut taps = Taps {
        n: 0,
        index: Vec::new(),
        weight: Vec::new(),
        outside: Vec::with_capacity(output),
    };
    for o in 0..output {
        let x = o as f64;
        let src = match spec.coordinates {
            Coordinates::AlignCorners if w_out == 1.0 => 0.0,
            Coordinates::AlignCorners => x * (w_in - 1.0) / (w_out - 1.0),
            Coordinates::Asymmetric => x / scale,
            Coordinates::TfCropAndResize => {
                let span = (roi.1 - roi.0) * (w_in - 1.0);
                let at = if w_out == 1.0 {
                    span / 2.0
                } else {
                    x * span / (w_out - 1.0)
                };
                at + roi.0 * (w_in - 1.0)
            }
            Coordinates::PytorchHalfPixel if w_out == 1.0 => -0.5,
            Coordinates::PytorchHalfPixel | Coordinates::HalfPixel => (x + 0.5) / scale - 0.5,
            Coordinates::HalfPixelSymmetric => {
                let adjustment = output as f64 / w_out;
                let offset = w_in / 2.0 * (1.0 - adjustment);
                offset + (x + 0.5) / scale - 0.5
            }
        };
        let outside = spec.coordinates == Coordinates::TfCropAndResize && (src < 0.0 || src > w_in - 1.0);
        taps.outside.push(outside);
        let integral = src.fract() == 0.0;
        let ratio = if integral { 1.0 } else { src - src.floor() };
        let mut c = coeffs(spec, ratio, integral, scale);
        let n = c.len();
        // The n nearest positions, nearer ones below on ties: from
        // ceil(src) - n/2 (n is even for every mode).
        let first = src.ceil() as i64 - (n / 2) as i64;
        if spec.exclude_outside {
            for (j, cj) in c.iter_mut().enumerate() {
                let i = first + j as i64;
                if i < 0 || i >= input as i64 {
                    *cj = 0.0;
                }
            }
            let total: f64 = c.iter().sum();
            if total != 0.0 {
                c.iter_mut().for_each(|cj| *cj /= total);
            }
        }
        if outside {
            c.iter_mut().for_each(|cj| *cj = 0.0);
        }
        taps.n = n;
        for (j, cj) in c.into_iter().enumerate() {
            taps.index.push((first + j as i64).clamp(0, input as i64 - 1));
            taps.weight.push(cj);
        }
    }
    taps
}

/// `x` resampled along `d` by `taps`.
fn apply_axis(
    n: &mut Node,
    x: ValueId,
    d: usize,
    taps: &Taps,
    extrapolation: f64,
) -> Result<ValueId, String> {
    let shape = n.b.meta(x).shape.clone();
    let dtype = n.b.meta(x).dtype;
    let out_len = taps.outside.len();
    let rows = |t: usize| -> (Vec<i64>, Vec<f64>) {
        (0..out_len)
            .map(|o| (taps.index[o * taps.n + t], taps.weight[o * taps.n + t]))
            .unzip()
    };
    let select = |n: &mut Node, idx: Vec<i64>| -> Result<ValueId, String> {
        let len = idx.len();
        let iv = n.constant_value(Tensor::from_vec(idx, &[len]).map_err(err)?)?;
        n.b.op(
            OpKind::IndexSelect,
            &[x.into(), iv.into()],
            Attrs::new().with("dim", d as i64),
        )
        .map_err(err)
    };
    // A column along `d`, broadcasting over the dims after it.
    let mut column_shape = vec![out_len];
    column_shape.resize(shape.len() - d, 1);
    let any_outside = taps.outside.iter().any(|&o| o) && extrapolation != 0.0;
    // Rows that each take one input position whole (nearest, or a scale of
    // one) are one index_select.
    let picks: Option<Vec<i64>> = (0..out_len)
        .map(|o| {
            let row = &taps.weight[o * taps.n..][..taps.n];
            let ones: Vec<usize> = (0..taps.n).filter(|&t| row[t] == 1.0).collect();
            let zeros = row.iter().filter(|&&w| w == 0.0).count();
            (ones.len() == 1 && zeros == taps.n - 1).then(|| taps.index[o * taps.n + ones[0]])
        })
        .collect();
    if let Some(idx) = picks.filter(|_| !any_outside) {
        if idx.len() == shape[d] && idx.iter().enumerate().all(|(i, &v)| v == i as i64) {
            return Ok(x);
        }
        return select(n, idx);
    }
    if !dtype.is_float() {
        return Err(format!(
            "linear and cubic modes need a floating-point input, got {dtype}"
        ));
    }
    let mut acc: Option<ValueId> = None;
    for t in 0..taps.n {
        let (idx, w) = rows(t);
        if w.iter().all(|&v| v == 0.0) {
            continue;
        }
        let sel = select(n, idx)?;
        let wv = n.constant_value(Tensor::from_f64s(dtype, &w, &column_shape).map_err(err)?)?;
        let term = n.b.mul(sel, wv).map_err(err)?;
        acc = Some(match acc {
            None => term,
            Some(a) => n.b.add(a, term).map_err(err)?,
        });
    }
    let mut out_shape = shape.clone();
    out_shape[d] = out_len;
    if any_outside {
        let e: Vec<f64> = taps
            .outside
            .iter()
            .map(|&o| if o { extrapolation } else { 0.0 })
            .collect();
        let ev = n.constant_value(Tensor::from_f64s(dtype, &e, &column_shape).map_err(err)?)?;
        acc = Some(match acc {
            Some(a) => n.b.add(a, ev).map_err(err)?,
            None => n.b.broadcast(ev, &out_shape).map_err(err)?,
        });
    }
    match acc {
        Some(a) => Ok(a),
        None => {
            n.b.op(
                OpKind::Full,
                &[],
                Attrs::new()
                    .with("shape", &out_shape[..])
                    .with("value", 0.0)
                    .with("dtype", dtype),
            )
            .map_err(err)
        }
    }
}

/// Resamples input 0 to `sizes` at `scales`, axis by axis.
fn resample(
    n: &mut Node,
    spec: &Spec,
    sizes: &[usize],
    scales: &[f64],
    roi: &[(f64, f64)],
) -> Result<Vec<Out>, String> {
    let shape = n.shape(0)?;
    if sizes.iter().zip(&shape).all(|(a, b)| a == b) && scales.iter().all(|&s| s == 1.0) {
        return Ok(vec![pass(n, 0)?]);
    }
    if shape.contains(&0) || sizes.contains(&0) {
        return Err(format!(
            "cannot resize {} to {}: a dim is empty",
            ShapeDisplay(&shape),
            ShapeDisplay(sizes)
        ));
    }
    let mut y = n.value(0)?;
    for d in 0..shape.len() {
        if sizes[d] == shape[d] && scales[d] == 1.0 && spec.coordinates != Coordinates::TfCropAndResize {
            continue;
        }
        let taps = axis_taps(spec, shape[d], sizes[d], scales[d], roi[d]);
        y = apply_axis(n, y, d, &taps, spec.extrapolation)?;
    }
    one(y)
}

/// A list input given as a tensor that may be empty (absent).
fn optional_list(n: &Node, i: usize, what: &str) -> Result<Option<Vec<f64>>, String> {
    if !n.has(i) {
        return Ok(None);
    }
    let v = n.const_floats(i, what)?;
    Ok((!v.is_empty()).then_some(v))
}

fn resize(n: &mut Node) -> Result<Vec<Out>, String> {
    let shape = n.shape(0)?;
    let r = shape.len();
    let mode = match n.string("mode", "nearest")?.as_str() {
        "nearest" => Mode::Nearest,
        "linear" | "bilinear" | "trilinear" => Mode::Linear,
        "cubic" | "bicubic" => Mode::Cubic,
        other => {
            return Err(format!(
                "attribute `mode` must be nearest, linear or cubic, got `{other}`"
            ));
        }
    };
    let (coordinates, nearest) = if n.opset < 11 {
        (Coordinates::Asymmetric, Nearest::Floor)
    } else {
        let c = match n.string("coordinate_transformation_mode", "half_pixel")?.as_str() {
            "half_pixel" => Coordinates::HalfPixel,
            "half_pixel_symmetric" => Coordinates::HalfPixelSymmetric,
            "pytorch_half_pixel" => Coordinates::PytorchHalfPixel,
            "align_corners" => Coordinates::AlignCorners,
            "asymmetric" => Coordinates::Asymmetric,
            "tf_crop_and_resize" => Coordinates::TfCropAndResize,
            other => {
                return Err(format!(
                    "attribute `coordinate_transformation_mode` `{other}` is not one of half_pixel, \
                     half_pixel_symmetric, pytorch_half_pixel, align_corners, asymmetric, tf_crop_and_resize"
                ));
            }
        };
        let m = match n.string("nearest_mode", "round_prefer_floor")?.as_str() {
            "round_prefer_floor" => Nearest::RoundPreferFloor,
            "round_prefer_ceil" => Nearest::RoundPreferCeil,
            "floor" => Nearest::Floor,
            "ceil" => Nearest::Ceil,
            other => {
                return Err(format!(
                    "attribute `nearest_mode` must be round_prefer_floor, round_prefer_ceil, floor or ceil, got `{other}`"
                ));
            }
        };
        (c, m)
    };
    let spec = Spec {
        mode,
        coordinates,
        nearest,
        cubic_a: f64::from(n.float("cubic_coeff_a", -0.75)),
        exclude_outside: n.int("exclude_outside", 0) != 0,
        extrapolation: f64::from(n.float("extrapolation_value", 0.0)),
        antialias: n.int("antialias", 0) != 0,
    };
    if spec.antialias && mode == Mode::Nearest {
        return Err("attribute `antialias` applies to linear and cubic modes, not nearest".into());
    }
    let axes: Vec<usize> = match n.ints("axes") {
        Some(a) => {
            let v = a.iter().map(|&x| axis(x, r)).collect::<Result<Vec<_>, _>>()?;
            let mut sorted = v.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != v.len() {
                return Err("attribute `axes` lists an axis twice".into());
            }
            v
        }
        None => (0..r).collect(),
    };
    let k = axes.len();
    let (scales_in, sizes_in, roi_in) = if n.opset < 11 {
        n.arity(2, 2)?;
        (optional_list(n, 1, "scales")?, None, None)
    } else {
        n.arity(1, 4)?;
        let sizes = if n.has(3) {
            let v = n.const_ints(3, "sizes")?;
            (!v.is_empty()).then_some(v)
        } else {
            None
        };
        (optional_list(n, 2, "scales")?, sizes, optional_list(n, 1, "roi")?)
    };
    let mut roi = vec![(0.0, 1.0); r];
    if let Some(v) = roi_in.filter(|_| coordinates == Coordinates::TfCropAndResize) {
        if v.len() != 2 * k {
            return Err(format!(
                "input 1 (roi) has {} entries for {k} axes; it takes {}",
                v.len(),
                2 * k
            ));
        }
        for (i, &a) in axes.iter().enumerate() {
            roi[a] = (v[i], v[k + i]);
        }
    }
    let mut sizes = shape.clone();
    let mut scales = vec![1.0; r];
    match (scales_in, sizes_in) {
        (Some(_), Some(_)) => return Err("give scales or sizes, not both".into()),
        (None, None) => return Err("one of scales and sizes is needed".into()),
        (Some(s), None) => {
            if s.len() != k {
                return Err(format!("input `scales` has {} entries for {k} axes", s.len()));
            }
            for (i, &a) in axes.iter().enumerate() {
                if !(s[i].is_finite() && s[i] > 0.0) {
                    return Err(format!("input `scales` holds {}; scales must be positive", s[i]));
                }
                scales[a] = s[i];
                // Truncated, as ONNX's reference does.
                sizes[a] = (s[i] * shape[a] as f64) as usize;
            }
        }
        (None, Some(z)) => {
            if z.len() != k {
                return Err(format!("input `sizes` has {} entries for {k} axes", z.len()));
            }
            if let Some(bad) = z.iter().find(|&&v| v < 1) {
                return Err(format!("input `sizes` holds {bad}; sizes must be 1 or more"));
            }
            for (i, &a) in axes.iter().enumerate() {
                scales[a] = z[i] as f64 / shape[a] as f64;
                sizes[a] = z[i] as usize;
            }
            let policy = n.string("keep_aspect_ratio_policy", "stretch")?;
            let pick = match policy.as_str() {
                "stretch" => None,
                "not_larger" => Some(f64::min as fn(f64, f64) -> f64),
                "not_smaller" => Some(f64::max as fn(f64, f64) -> f64),
                other => {
                    return Err(format!(
                        "attribute `keep_aspect_ratio_policy` must be stretch, not_larger or not_smaller, got `{other}`"
                    ));
                }
            };
            if let Some(pick) = pick {
                let s = axes.iter().map(|&a| scales[a]).reduce(pick).unwrap_or(1.0);
                for &a in &axes {
                    scales[a] = s;
                    // Rounded half up, as ONNX's reference does.
                    sizes[a] = (s * shape[a] as f64 + 0.5) as usize;
                }
            }
        }
    }
    resample(n, &spec, &sizes, &scales, &roi)
}

fn upsample(n: &mut Node) -> Result<Vec<Out>, String> {
    let shape = n.shape(0)?;
    let scales: Vec<f64> = if n.opset < 9 {
        n.arity(1, 1)?;
        n.floats("scales")
            .ok_or("missing attribute `scales`")?
            .into_iter()
            .map(f64::from)
            .collect()
    } else {
        n.arity(2, 2)?;
        n.const_floats(1, "scales")?
    };
    if scales.len() != shape.len() {
        return Err(format!(
            "`scales` has {} entries for rank {}",
            scales.len(),
            shape.len()
        ));
    }
    if let Some(s) = scales.iter().find(|&&s| !(s.is_finite() && s >= 1.0)) {
        return Err(format!("`scales` holds {s}; Upsample scales must be 1 or more"));
    }
    let mode = match n.string("mode", "nearest")?.as_str() {
        "nearest" => Mode::Nearest,
        "linear" | "bilinear" => Mode::Linear,
        other => {
            return Err(format!(
                "attribute `mode` must be nearest or linear, got `{other}`"
            ));
        }
    };
    let spec = Spec {
        mode,
        coordinates: Coordinates::Asymmetric,
        nearest: Nearest::Floor,
        cubic_a: -0.75,
        exclude_outside: false,
        extrapolation: 0.0,
        antialias: false,
    };
    let sizes: Vec<usize> = shape
        .iter()
        .zip(&scales)
        .map(|(&d, &s)| (d as f64 * s) as usize)
        .collect();
    let roi = vec![(0.0, 1.0); shape.len()];
    if n.dtype(0)? == DType::Bool {
        return Err("Upsample of bool tensors is not supported".into());
    }
    resample(n, &spec, &sizes, &scales, &roi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mode: Mode, coordinates: Coordinates) -> Spec {
        Spec {
            mode,
            coordinates,
            nearest: Nearest::RoundPreferFloor,
            cubic_a: -0.75,
            exclude_outside: false,
            extrapolation: 0.0,
            antialias: false,
        }
    }

    #[test]
    fn linear_half_pixel_upsampling_by_two_weights_a_quarter_and_three_quarters() {
        let t = axis_taps(&spec(Mode::Linear, Coordinates::HalfPixel), 4, 8, 2.0, (0.0, 1.0));
        assert_eq!(t.n, 2);
        // Output 0 sits at -0.25: the edge repeated, all of input 0.
        assert_eq!(&t.index[0..2], &[0, 0]);
        assert_eq!(&t.weight[0..2], &[0.25, 0.75]);
        // Output 3 sits at 1.25: three quarters of 1, a quarter of 2.
        assert_eq!(&t.index[6..8], &[1, 2]);
        assert_eq!(&t.weight[6..8], &[0.75, 0.25]);
    }

    #[test]
    fn nearest_rounds_halves_as_the_mode_says() {
        let mut s = spec(Mode::Nearest, Coordinates::Asymmetric);
        let t = axis_taps(&s, 2, 4, 2.0, (0.0, 1.0));
        // Sources 0, 0.5, 1, 1.5: halves round down.
        let picked: Vec<i64> = (0..4)
            .map(|o| t.index[o * 2 + usize::from(t.weight[o * 2 + 1] == 1.0)])
            .collect();
        assert_eq!(picked, vec![0, 0, 1, 1]);
        s.nearest = Nearest::RoundPreferCeil;
        let t = axis_taps(&s, 2, 4, 2.0, (0.0, 1.0));
        let picked: Vec<i64> = (0..4)
            .map(|o| t.index[o * 2 + usize::from(t.weight[o * 2 + 1] == 1.0)])
            .collect();
        assert_eq!(picked, vec![0, 1, 1, 1]);
    }

    #[test]
    fn cubic_weights_sum_to_one_and_antialias_widens_when_downsampling() {
        let t = axis_taps(
            &spec(Mode::Cubic, Coordinates::HalfPixel),
            8,
            3,
            0.375,
            (0.0, 1.0),
        );
        assert_eq!(t.n, 4);
        for o in 0..3 {
            let s: f64 = t.weight[o * 4..][..4].iter().sum();
            assert!((s - 1.0).abs() < 1e-12, "{s}");
        }
        let mut a = spec(Mode::Linear, Coordinates::HalfPixel);
        a.antialias = true;
        let t = axis_taps(&a, 8, 4, 0.5, (0.0, 1.0));
        assert_eq!(t.n, 4);
    }
}
