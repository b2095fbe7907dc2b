//! Window geometry: what `conv`, `conv_transpose` and the pools share.
//!
//! All three slide a window over the spatial dims of an `[N, C, S0, S1, ...]`
//! tensor (any number of spatial dims, one or more). Output position `o` and
//! kernel tap `k` of spatial dim `d` meet input position
//! `o * stride[d] + k * dilation[d] - pad_lo[d]`; positions outside
//! `[0, input[d])` are padding. A `conv_transpose` is the adjoint of a
//! `conv`: its [`Window`] is that of the convolution whose input has the
//! transpose's output shape, so the same formula says which input element
//! each of its output elements gathers from (`input` and `output` swap
//! roles). Executors read the geometry from here, so every executor agrees
//! on it with shape inference.

use crate::ir::attr::Attrs;
use crate::meta::ShapeDisplay;

/// The geometry of a window sliding over the spatial dims.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    /// Kernel extent per spatial dim.
    pub kernel: Vec<usize>,
    /// Step between output positions, per spatial dim.
    pub stride: Vec<usize>,
    /// Step between kernel taps, per spatial dim.
    pub dilation: Vec<usize>,
    /// Padding before the input, per spatial dim.
    pub pad_lo: Vec<usize>,
    /// Padding after the input, per spatial dim.
    pub pad_hi: Vec<usize>,
    /// Spatial extents the window reads.
    pub input: Vec<usize>,
    /// Spatial extents of the result, one position per window placement.
    pub output: Vec<usize>,
}

impl Window {
    /// The number of spatial dims.
    pub fn rank(&self) -> usize {
        self.kernel.len()
    }

    /// The input position of output `o`, tap `k` in spatial dim `d` (which
    /// may fall in the padding: negative or past the input).
    pub fn position(&self, d: usize, o: usize, k: usize) -> isize {
        (o * self.stride[d] + k * self.dilation[d]) as isize - self.pad_lo[d] as isize
    }

    /// The output positions of spatial dim `d` whose tap `k` falls inside
    /// the input (not in the padding): one run, since the position grows
    /// with the output's.
    pub fn inside(&self, d: usize, k: usize) -> std::ops::Range<usize> {
        let within = |o: usize| (0..self.input[d] as isize).contains(&self.position(d, o, k));
        match (0..self.output[d]).find(|&o| within(o)) {
            None => 0..0,
            Some(lo) => lo..lo + (lo..self.output[d]).take_while(|&o| within(o)).count(),
        }
    }

    /// The spread of the dilated kernel in spatial dim `d`.
    pub fn span(&self, d: usize) -> usize {
        self.dilation[d] * (self.kernel[d] - 1) + 1
    }

    /// Kernel taps per window.
    pub fn taps(&self) -> usize {
        self.kernel.iter().product()
    }

    /// What an average pool divides each output position by, row-major:
    /// its taps inside the input, or with `include_pad` inside the input
    /// and its explicit padding (taps past the end padding, which a
    /// `ceil_mode` window may have, never count). A window is a product of
    /// per-dim ranges, so the count is the product of per-dim counts.
    pub fn divisors(&self, include_pad: bool) -> Vec<f64> {
        let per_dim: Vec<Vec<usize>> = (0..self.rank())
            .map(|d| {
                let (lo, hi) = if include_pad {
                    (
                        -(self.pad_lo[d] as isize),
                        (self.input[d] + self.pad_hi[d]) as isize,
                    )
                } else {
                    (0, self.input[d] as isize)
                };
                (0..self.output[d])
                    .map(|o| {
                        (0..self.kernel[d])
                            .filter(|&k| (lo..hi).contains(&self.position(d, o, k)))
                            .count()
                    })
                    .collect()
            })
            .collect();
        let mut out = vec![1.0; self.output.iter().product()];
        // Each dim's counts repeat over the dims after it.
        let mut inner = out.len();
        for (d, counts) in per_dim.iter().enumerate() {
            inner /= self.output[d].max(1);
            for (i, v) in out.iter_mut().enumerate() {
                *v *= counts[(i / inner) % self.output[d]] as f64;
            }
        }
        out
    }
}

/// The geometry of a `conv` or `conv_transpose`, from its operands' shapes
/// and its attributes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvGeometry {
    /// Batch size.
    pub batch: usize,
    /// Channels of the operand `x`.
    pub in_channels: usize,
    /// Channels of the result.
    pub out_channels: usize,
    /// Channel groups: each group of result channels reads one group of
    /// input channels.
    pub groups: usize,
    /// The window; for `conv_transpose`, that of the convolution it is the
    /// adjoint of (its `input` is the transpose's output).
    pub window: Window,
    /// Whether this is a `conv_transpose`.
    pub transposed: bool,
}

impl ConvGeometry {
    /// The result's shape.
    pub fn out_shape(&self) -> Vec<usize> {
        let spatial = if self.transposed {
            &self.window.input
        } else {
            &self.window.output
        };
        let mut s = vec![self.batch, self.out_channels];
        s.extend_from_slice(spatial);
        s
    }

    /// Multiply-adds of the whole op.
    pub fn macs(&self) -> usize {
        let positions: usize = self.window.output.iter().product();
        let per_group_in = self.in_channels / self.groups.max(1);
        let per_group_out = self.out_channels / self.groups.max(1);
        // A transpose does the same products as the conv it is the adjoint of.
        let (a, b) = if self.transposed {
            (per_group_out, self.in_channels)
        } else {
            (per_group_in, self.out_channels)
        };
        self.batch * b * positions * a * self.window.taps()
    }
}

/// Per-dim list attribute `key`, `default` in every dim when absent, each
/// entry at least `min`.
fn per_dim(attrs: &Attrs, key: &str, rank: usize, default: usize, min: usize) -> Result<Vec<usize>, String> {
    let Some(v) = attrs.ints_opt(key)? else {
        return Ok(vec![default; rank]);
    };
    if v.len() != rank {
        return Err(format!(
            "attribute `{key}` has {} entries for {rank} spatial dim(s)",
            v.len()
        ));
    }
    v.iter()
        .map(|&x| {
            usize::try_from(x)
                .ok()
                .filter(|&u| u >= min)
                .ok_or_else(|| format!("attribute `{key}` must hold integers >= {min}, got {x}"))
        })
        .collect()
}

/// `pad=[lo_0, ..., lo_{r-1}, hi_0, ..., hi_{r-1}]`, zeros when absent.
fn pads(attrs: &Attrs, rank: usize) -> Result<(Vec<usize>, Vec<usize>), String> {
    let Some(v) = attrs.ints_opt("pad")? else {
        return Ok((vec![0; rank], vec![0; rank]));
    };
    if v.len() != 2 * rank {
        return Err(format!(
            "attribute `pad` has {} entries; {rank} spatial dim(s) take {} (the starts, then the ends)",
            v.len(),
            2 * rank
        ));
    }
    let v = v
        .iter()
        .map(|&p| usize::try_from(p).map_err(|_| format!("attribute `pad` must not be negative, got {p}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((v[..rank].to_vec(), v[rank..].to_vec()))
}

fn spatial_rank(x: &[usize], what: &str) -> Result<usize, String> {
    if x.len() < 3 {
        return Err(format!(
            "{what} must be [N, C, spatial...] with one or more spatial dims, got {}",
            ShapeDisplay(x)
        ));
    }
    Ok(x.len() - 2)
}

/// Output extents of a window over `input`, padded, with the floor rule, or
/// with `ceil_mode` the ceiling rule that drops a last window starting in
/// the end padding.
fn slide(
    input: &[usize],
    kernel: &[usize],
    stride: &[usize],
    dilation: &[usize],
    pad_lo: &[usize],
    pad_hi: &[usize],
    ceil_mode: bool,
) -> Result<Vec<usize>, String> {
    let mut out = Vec::with_capacity(input.len());
    for d in 0..input.len() {
        let span = dilation[d]
            .checked_mul(kernel[d] - 1)
            .and_then(|s| s.checked_add(1))
            .ok_or("the kernel's extent overflows")?;
        let padded = input[d]
            .checked_add(pad_lo[d])
            .and_then(|s| s.checked_add(pad_hi[d]))
            .ok_or("the padded extent overflows")?;
        if span > padded {
            return Err(format!(
                "the kernel spans {span} in spatial dim {d} (kernel {}, dilation {}) but the padded input has {padded}",
                kernel[d], dilation[d]
            ));
        }
        let room = padded - span;
        let mut n = if ceil_mode {
            room.div_ceil(stride[d]) + 1
        } else {
            room / stride[d] + 1
        };
        if ceil_mode && n > 1 && (n - 1) * stride[d] >= input[d] + pad_lo[d] {
            n -= 1;
        }
        out.push(n);
    }
    Ok(out)
}

/// The geometry of `conv(x, w, [bias])` or `conv_transpose(x, w, [bias])`
/// over operands of shapes `x` and `w`.
///
/// `conv`: `x` is `[N, C, S...]`, `w` is `[M, C / groups, K...]`, the
/// result `[N, M, O...]`. `conv_transpose`: `w` is `[C, M / groups, K...]`
/// and the result `[N, M, O...]` with
/// `O = stride * (S - 1) + output_padding + dilation * (K - 1) + 1 - pad_lo - pad_hi`.
pub fn conv_geometry(
    attrs: &Attrs,
    x: &[usize],
    w: &[usize],
    transposed: bool,
) -> Result<ConvGeometry, String> {
    let rank = spatial_rank(x, "the input (operand 1)")?;
    if w.len() != x.len() {
        return Err(format!(
            "the weight (operand 2) {} must have the input's rank {}",
            ShapeDisplay(w),
            x.len()
        ));
    }
    let groups = usize::try_from(attrs.int_or("groups", 1)?)
        .ok()
        .filter(|&g| g >= 1)
        .ok_or("attribute `groups` must be 1 or more")?;
    let kernel = w[2..].to_vec();
    if kernel.contains(&0) {
        return Err(format!("the weight {} has an empty kernel", ShapeDisplay(w)));
    }
    let stride = per_dim(attrs, "stride", rank, 1, 1)?;
    let dilation = per_dim(attrs, "dilation", rank, 1, 1)?;
    let (pad_lo, pad_hi) = pads(attrs, rank)?;
    let c = x[1];
    if !c.is_multiple_of(groups) {
        return Err(format!(
            "the input's {c} channels do not divide into {groups} groups"
        ));
    }
    let spatial = x[2..].to_vec();
    let (m, input, output) = if !transposed {
        attrs.check_keys(&["stride", "dilation", "pad", "groups"])?;
        let m = w[0];
        if w[1] * groups != c {
            return Err(format!(
                "the weight {} takes {} channels per group, {} in all over {groups} group(s), but the input has {c}",
                ShapeDisplay(w),
                w[1],
                w[1] * groups
            ));
        }
        if !m.is_multiple_of(groups) {
            return Err(format!(
                "the weight's {m} output channels do not divide into {groups} groups"
            ));
        }
        let output = slide(&spatial, &kernel, &stride, &dilation, &pad_lo, &pad_hi, false)?;
        (m, spatial, output)
    } else {
        attrs.check_keys(&["stride", "dilation", "pad", "groups", "output_padding"])?;
        if w[0] != c {
            return Err(format!(
                "the weight {} is for {} input channels but the input has {c}",
                ShapeDisplay(w),
                w[0]
            ));
        }
        let output_padding = per_dim(attrs, "output_padding", rank, 0, 0)?;
        let mut full = Vec::with_capacity(rank);
        for d in 0..rank {
            let grown = spatial[d]
                .checked_sub(1)
                .and_then(|s| s.checked_mul(stride[d]))
                .and_then(|s| s.checked_add(output_padding[d]))
                .and_then(|s| s.checked_add(dilation[d] * (kernel[d] - 1) + 1));
            let Some(grown) = grown else {
                return Err(format!("spatial dim {d} of the input is empty or too large"));
            };
            let cut = pad_lo[d] + pad_hi[d];
            if grown <= cut {
                return Err(format!(
                    "the pads remove all {grown} positions of spatial dim {d} (pad {} + {})",
                    pad_lo[d], pad_hi[d]
                ));
            }
            full.push(grown - cut);
        }
        (w[1] * groups, full, spatial)
    };
    Ok(ConvGeometry {
        batch: x[0],
        in_channels: c,
        out_channels: m,
        groups,
        window: Window {
            kernel,
            stride,
            dilation,
            pad_lo,
            pad_hi,
            input,
            output,
        },
        transposed,
    })
}

/// The window of a pool over `x` (`[N, C, S...]`): attributes `kernel`
/// (required), `stride`, `dilation`, `pad`, `ceil_mode`.
pub fn pool_window(attrs: &Attrs, x: &[usize]) -> Result<Window, String> {
    let rank = spatial_rank(x, "the input")?;
    let kernel = attrs.ints("kernel")?;
    if kernel.len() != rank {
        return Err(format!(
            "attribute `kernel` has {} entries for {rank} spatial dim(s)",
            kernel.len()
        ));
    }
    let kernel = per_dim(attrs, "kernel", rank, 1, 1)?;
    let stride = per_dim(attrs, "stride", rank, 1, 1)?;
    let dilation = per_dim(attrs, "dilation", rank, 1, 1)?;
    let (pad_lo, pad_hi) = pads(attrs, rank)?;
    for d in 0..rank {
        let span = dilation[d].saturating_mul(kernel[d] - 1).saturating_add(1);
        if pad_lo[d] >= span || pad_hi[d] >= span {
            // Such a pad gives windows made only of padding.
            return Err(format!(
                "attribute `pad` ({}, {}) in spatial dim {d} must be smaller than the kernel's extent {span}",
                pad_lo[d], pad_hi[d]
            ));
        }
    }
    let spatial = x[2..].to_vec();
    let output = slide(
        &spatial,
        &kernel,
        &stride,
        &dilation,
        &pad_lo,
        &pad_hi,
        attrs.bool_or("ceil_mode", false)?,
    )?;
    Ok(Window {
        kernel,
        stride,
        dilation,
        pad_lo,
        pad_hi,
        input: spatial,
        output,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(pairs: &[(&str, &[i64])]) -> Attrs {
        let mut x = Attrs::new();
        for (k, v) in pairs {
            x = x.with(k, *v);
        }
        x
    }

    #[test]
    fn conv_output_follows_the_floor_rule() {
        let g = conv_geometry(
            &a(&[("stride", &[2, 2]), ("pad", &[1, 1, 1, 1])]),
            &[1, 3, 7, 8],
            &[4, 3, 3, 3],
            false,
        )
        .unwrap();
        assert_eq!(g.out_shape(), vec![1, 4, 4, 4]);
        assert_eq!(g.window.position(0, 0, 0), -1);
        assert_eq!(g.macs(), 4 * 16 * 3 * 9);
    }

    #[test]
    fn grouped_conv_checks_channels() {
        let e = conv_geometry(
            &Attrs::new().with("groups", 2i64),
            &[1, 3, 5, 5],
            &[4, 1, 3, 3],
            false,
        )
        .unwrap_err();
        assert!(e.contains("3 channels do not divide into 2 groups"), "{e}");
        let e = conv_geometry(&Attrs::new(), &[1, 4, 5, 5], &[4, 2, 3, 3], false).unwrap_err();
        assert!(e.contains("takes 2 channels per group"), "{e}");
        let e = conv_geometry(&Attrs::new(), &[1, 2, 2, 2], &[4, 2, 3, 3], false).unwrap_err();
        assert!(e.contains("the kernel spans 3"), "{e}");
    }

    #[test]
    fn conv_transpose_output_grows_by_the_stride() {
        let g = conv_geometry(
            &a(&[("stride", &[3, 2]), ("output_padding", &[1, 1])]),
            &[1, 1, 3, 3],
            &[1, 2, 3, 3],
            true,
        )
        .unwrap();
        assert_eq!(g.out_shape(), vec![1, 2, 10, 8]);
        // The conv it is the adjoint of maps [10, 8] back to [3, 3].
        let w = &g.window;
        assert_eq!(
            slide(
                &w.input,
                &w.kernel,
                &w.stride,
                &w.dilation,
                &w.pad_lo,
                &w.pad_hi,
                false
            )
            .unwrap(),
            vec![3, 3]
        );
    }

    #[test]
    fn average_divisors_count_the_taps_inside_the_input_or_its_padding() {
        // 2x3 input, 2x2 windows at stride 1 with one pad before and after
        // each dim: 3x4 outputs.
        let w = pool_window(&a(&[("kernel", &[2, 2]), ("pad", &[1, 1, 1, 1])]), &[1, 1, 2, 3]).unwrap();
        assert_eq!(w.output, vec![3, 4]);
        // Inside the input: corners 1 tap, edges 2, the middle 4.
        assert_eq!(
            w.divisors(false),
            vec![1.0, 2.0, 2.0, 1.0, 2.0, 4.0, 4.0, 2.0, 1.0, 2.0, 2.0, 1.0]
        );
        assert!(w.divisors(true).iter().all(|&d| d == 4.0));
    }

    #[test]
    fn ceil_mode_drops_a_window_starting_in_the_end_padding() {
        let w = pool_window(
            &a(&[("kernel", &[3, 3]), ("stride", &[2, 2])]).with("ceil_mode", true),
            &[1, 1, 48, 47],
        )
        .unwrap();
        assert_eq!(w.output, vec![24, 23]);
        let w = pool_window(
            &a(&[("kernel", &[2]), ("stride", &[2]), ("pad", &[1, 1])]).with("ceil_mode", true),
            &[1, 1, 4],
        )
        .unwrap();
        // ceil((4 + 2 - 2) / 2) + 1 = 3 windows, starting at -1, 1 and 3.
        assert_eq!(w.output, vec![3]);
        let w = pool_window(
            &a(&[("kernel", &[3]), ("stride", &[2]), ("pad", &[1, 1])]).with("ceil_mode", true),
            &[1, 1, 4],
        )
        .unwrap();
        // ceil((4 + 2 - 3) / 2) + 1 = 3 windows, starting at -1, 1 and 3: all kept.
        assert_eq!(w.output, vec![3]);
        let w = pool_window(
            &a(&[("kernel", &[2]), ("stride", &[2]), ("pad", &[0, 1])]).with("ceil_mode", true),
            &[1, 1, 4],
        )
        .unwrap();
        // ceil((4 + 1 - 2) / 2) + 1 = 3, but the third would start at 4, in the end padding.
        assert_eq!(w.output, vec![2]);
    }
}
