//! A convolution's epilogue head: the bias and clamp its kernels apply as
//! they copy each result to the output, in the same pass. The rest of an
//! epilogue runs as the shared row program of
//! [`switchyard_core::epilogue`].

use switchyard_core::ir::{BinaryOp, UnaryOp};

pub(crate) use switchyard_core::epilogue::{At, Epilogue, Src, Step, nan_max};

/// The steps an epilogue starts with that a kernel applies as it copies
/// its result to the output, in the same pass: an addend (the bias, per
/// channel or one for all), then a clamp (Relu, or a Clip's `maximum` and
/// `minimum` by constants). Most convolutions' epilogues are this and no
/// more; what follows runs as [`Epilogue`] steps on the output row.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Head {
    /// Input slot of the addend and whether it is per channel.
    add: Option<(usize, bool)>,
    lo: f32,
    hi: f32,
}

impl Default for Head {
    fn default() -> Head {
        Head {
            add: None,
            lo: f32::NEG_INFINITY,
            hi: f32::INFINITY,
        }
    }
}

impl Head {
    /// For each run `(q, length, p)` of `runs`: `dst[p - dst0..][..length]
    /// = clamp(src[q - src0..][..length] + addend)`, NaN staying NaN as in
    /// the fallback; compiled for AVX2 with `fast` (see
    /// [`Epilogue::apply`]). One call for all the runs of a plane or a
    /// tile's row: they are often short (an output row of 7).
    pub(crate) fn scatter(
        &self,
        (src, src0): (&[f32], usize),
        (dst, dst0): (&mut [f32], usize),
        runs: &[(usize, usize, usize)],
        at: &At,
        fast: bool,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            if fast {
                // SAFETY: `fast_kernel` checked the CPU has AVX2 and FMA.
                unsafe { avx2::scatter(self, (src, src0), (dst, dst0), runs, at) };
                return;
            }
        }
        let _ = fast;
        self.scatter_on((src, src0), (dst, dst0), runs, at);
    }

    /// The head's parameters for output channels `channel..` of a tile,
    /// for a kernel that applies it in its own stores ([`HeadRows`]).
    pub(crate) fn rows<'a>(&self, inputs: &[&'a [f32]], channel: usize) -> HeadRows<'a> {
        HeadRows {
            add: self.add.map(|(slot, per_channel)| match per_channel {
                true => Addend::PerRow(&inputs[slot][channel..]),
                false => Addend::All(inputs[slot][0]),
            }),
            lo: self.lo,
            hi: self.hi,
        }
    }

    /// The addend for `at`'s channel, if any.
    fn addend(&self, at: &At) -> Option<f32> {
        self.add
            .map(|(slot, per_channel)| at.inputs[slot][if per_channel { at.channel } else { 0 }])
    }

    fn scatter_on(
        &self,
        (src, src0): (&[f32], usize),
        (dst, dst0): (&mut [f32], usize),
        runs: &[(usize, usize, usize)],
        at: &At,
    ) {
        let (lo, hi, b) = (self.lo, self.hi, self.addend(at));
        for &(q, len, p) in runs {
            let (s, d) = (&src[q - src0..][..len], &mut dst[p - dst0..][..len]);
            match b {
                None => d.iter_mut().zip(s).for_each(|(d, &v)| *d = clamp(v, lo, hi)),
                Some(b) => d.iter_mut().zip(s).for_each(|(d, &v)| *d = clamp(v + b, lo, hi)),
            }
        }
    }
}

/// A [`Head`] for consecutive output channels (rows of a tile): row `r`
/// gets `clamp(v + addend(r), lo, hi)`, exactly as [`Head::scatter`]
/// computes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadRows<'a> {
    pub(crate) add: Option<Addend<'a>>,
    pub(crate) lo: f32,
    pub(crate) hi: f32,
}

/// What a [`HeadRows`] adds: one value per row, or one for all.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Addend<'a> {
    PerRow(&'a [f32]),
    All(f32),
}

impl HeadRows<'_> {
    /// The addend of row `r`, if any.
    #[inline(always)]
    pub(crate) fn addend(&self, r: usize) -> Option<f32> {
        self.add.map(|a| match a {
            Addend::PerRow(v) => v[r],
            Addend::All(v) => v,
        })
    }

    /// Rows `r..` of this.
    pub(crate) fn from(self, r: usize) -> Self {
        HeadRows {
            add: self.add.map(|a| match a {
                Addend::PerRow(v) => Addend::PerRow(&v[r..]),
                all => all,
            }),
            ..self
        }
    }

    /// `v` of row `r` finished, as the scalar path of [`Head::scatter`].
    #[inline(always)]
    pub(crate) fn apply(&self, r: usize, v: f32) -> f32 {
        finish(v, self.addend(r), self.lo, self.hi)
    }
}

/// `v` finished by a head: the addend, if any, then the clamp.
#[inline(always)]
fn finish(v: f32, addend: Option<f32>, lo: f32, hi: f32) -> f32 {
    clamp(addend.map_or(v, |b| v + b), lo, hi)
}

/// `v` clamped to `[lo, hi]` as x86's `maxps(lo, v)` then `minps(hi, _)`
/// compute it, so that the vector and scalar paths agree to the bit: a NaN
/// stays NaN, as in the fallback's Relu and Clip, and so does -0.0 through
/// a Relu.
#[inline(always)]
fn clamp(v: f32, lo: f32, hi: f32) -> f32 {
    let m = if lo > v { lo } else { v };
    if hi < m { hi } else { m }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{At, Head, finish};

    /// [`Head::scatter`] 8 lanes at a time.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scatter(
        h: &Head,
        (src, src0): (&[f32], usize),
        (dst, dst0): (&mut [f32], usize),
        runs: &[(usize, usize, usize)],
        at: &At,
    ) {
        let (lo, hi, b) = (h.lo, h.hi, h.addend(at));
        let (lo8, hi8) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
        let b8 = _mm256_set1_ps(b.unwrap_or(0.0));
        for &(q, len, p) in runs {
            let (s, d) = (&src[q - src0..][..len], &mut dst[p - dst0..][..len]);
            let (mut sc, mut dc) = (s.chunks_exact(8), d.chunks_exact_mut(8));
            for (s8, d8) in (&mut sc).zip(&mut dc) {
                // SAFETY: both chunks hold 8 floats.
                unsafe {
                    let mut v = _mm256_loadu_ps(s8.as_ptr());
                    if b.is_some() {
                        v = _mm256_add_ps(v, b8);
                    }
                    // The second operand is returned where either is NaN.
                    v = _mm256_min_ps(hi8, _mm256_max_ps(lo8, v));
                    _mm256_storeu_ps(d8.as_mut_ptr(), v);
                }
            }
            for (d, &v) in dc.into_remainder().iter_mut().zip(sc.remainder()) {
                *d = finish(v, b, lo, hi);
            }
        }
    }
}

/// The [`Head`] of `epilogue`'s steps, and the steps after it.
pub(crate) fn split_head(mut epilogue: Epilogue) -> (Head, Epilogue) {
    let mut head = Head::default();
    let mut taken = 0;
    let on_result = |a: Src, b: Src| match (a, b) {
        (Src::Reg(0), other) | (other, Src::Reg(0)) => Some(other),
        _ => None,
    };
    for step in &epilogue.steps {
        let clamped = head.lo != f32::NEG_INFINITY || head.hi != f32::INFINITY;
        match *step {
            Step::Binary {
                op: BinaryOp::Add,
                a,
                b,
                dst: 0,
            } if head.add.is_none() && !clamped => match on_result(a, b) {
                Some(Src::Channel { slot, per_channel }) => head.add = Some((slot, per_channel)),
                _ => break,
            },
            Step::Unary {
                op: UnaryOp::Relu,
                a: Src::Reg(0),
                dst: 0,
            } if !clamped => head.lo = 0.0,
            Step::Binary {
                op: BinaryOp::Maximum,
                a,
                b,
                dst: 0,
            } if !clamped => match on_result(a, b) {
                Some(Src::Scalar(c)) if !c.is_nan() => head.lo = c,
                _ => break,
            },
            Step::Binary {
                op: BinaryOp::Minimum,
                a,
                b,
                dst: 0,
            } if head.hi == f32::INFINITY => match on_result(a, b) {
                Some(Src::Scalar(c)) if !c.is_nan() => head.hi = c,
                _ => break,
            },
            _ => break,
        }
        taken += 1;
    }
    epilogue.steps.drain(..taken);
    (head, epilogue)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(op: BinaryOp, a: Src, b: Src) -> Step {
        Step::Binary { op, a, b, dst: 0 }
    }

    fn epilogue(steps: Vec<Step>) -> Epilogue {
        Epilogue {
            steps,
            registers: 1,
            result: 0,
        }
    }

    const BIAS: Src = Src::Channel {
        slot: 2,
        per_channel: true,
    };

    #[test]
    fn a_bias_and_a_clip_are_the_head_and_what_follows_stays() {
        let tail = Step::Unary {
            op: UnaryOp::Tanh,
            a: Src::Reg(0),
            dst: 0,
        };
        let (head, rest) = split_head(epilogue(vec![
            binary(BinaryOp::Add, BIAS, Src::Reg(0)),
            binary(BinaryOp::Maximum, Src::Reg(0), Src::Scalar(0.0)),
            binary(BinaryOp::Minimum, Src::Scalar(6.0), Src::Reg(0)),
            tail,
        ]));
        assert_eq!(
            head,
            Head {
                add: Some((2, true)),
                lo: 0.0,
                hi: 6.0
            }
        );
        assert_eq!(rest.steps, vec![tail]);
    }

    #[test]
    fn steps_the_head_cannot_reorder_end_it() {
        let relu = Step::Unary {
            op: UnaryOp::Relu,
            a: Src::Reg(0),
            dst: 0,
        };
        let cases = [
            // A bias after the clamp, a max after the min, a NaN bound, a
            // second addend: each stays a step.
            vec![relu, binary(BinaryOp::Add, Src::Reg(0), BIAS)],
            vec![
                binary(BinaryOp::Minimum, Src::Reg(0), Src::Scalar(6.0)),
                binary(BinaryOp::Maximum, Src::Reg(0), Src::Scalar(0.0)),
            ],
            vec![binary(BinaryOp::Maximum, Src::Reg(0), Src::Scalar(f32::NAN))],
            vec![
                binary(BinaryOp::Add, Src::Reg(0), BIAS),
                binary(BinaryOp::Add, Src::Reg(0), BIAS),
            ],
        ];
        for steps in cases {
            // (Compared by length: a NaN bound is not equal to itself.)
            let (_, rest) = split_head(epilogue(steps.clone()));
            assert_eq!(rest.steps.len(), 1, "{steps:?}");
        }
    }

    #[test]
    fn the_head_adds_then_clamps_and_keeps_nans() {
        let bias = [0.0, 0.0, 0.5];
        let inputs: Vec<&[f32]> = vec![&[], &[], &bias];
        let at = At {
            inputs: &inputs,
            channel: 2,
            offset: 0,
        };
        let (head, _) = split_head(epilogue(vec![
            binary(BinaryOp::Add, Src::Reg(0), BIAS),
            binary(BinaryOp::Maximum, Src::Reg(0), Src::Scalar(0.0)),
            binary(BinaryOp::Minimum, Src::Reg(0), Src::Scalar(6.0)),
        ]));
        // Two runs, from q 10 and 14 of the source into positions 3 and
        // 5 of the destination.
        let src = [-1.0, 1.0, 0.0, 0.0, 7.0, f32::NAN];
        for fast in [
            false,
            super::super::gemm::fast_kernel(switchyard_simd::Simd::best()),
        ] {
            let mut dst = [9f32; 4];
            head.scatter((&src, 10), (&mut dst, 3), &[(10, 2, 3), (14, 2, 5)], &at, fast);
            assert_eq!(dst[..3], [0.0, 1.5, 6.0]);
            assert!(dst[3].is_nan());
        }
    }
}
