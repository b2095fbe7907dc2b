//! The compiled kernel of one `matmul` or `linear`: the operands' layout
//! read on each run, the weights packed at compile time where they are
//! declared constant, else kept from their second run on, the product
//! computed into the output buffer the runtime gives.

use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use switchyard_core::epilogue::Epilogue;
use switchyard_core::executor::Kernel;
use switchyard_core::kept::KeptByBuffer;
use switchyard_core::meta::batch_offsets;
use switchyard_core::{DType, Error, OutputBuffer, Result, Tensor};

use crate::micro::NR;
use crate::pack::{PackedB, Strided};
use crate::product::{Finisher, Products, threaded};

/// Weights a kernel keeps packed at once: the kernel cache gives one
/// kernel to every product of the same shapes (each layer's), each with
/// weights of its own.
pub(crate) const PACKED_KEPT: usize = 64;

/// Whether `batches` `B`s of `values` values each, packed per run, are
/// packed over the threads.
fn packed_in_parallel(batches: usize, values: usize) -> bool {
    batches > 1 && batches.saturating_mul(values) >= 1 << 16
}

/// What the kernel computes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Form {
    /// `matmul(a, b)`: inputs `a` and `b`, batch dims broadcast.
    Matmul { a: usize, b: usize },
    /// `linear(x, w, [bias])`: `x @ w^T (+ bias)`, `w` `[n, k]`.
    Linear { x: usize, w: usize, bias: Option<usize> },
}

/// The kernel of one product.
pub(crate) struct GemmKernel {
    pub(crate) form: Form,
    /// The elementwise ops that finish the product (none: the product).
    pub(crate) epilogue: Epilogue,
    /// The kernel inputs `epilogue` reads ([`Epilogue::inputs`]), and
    /// whether it reads one value per column: worked out once, not per run.
    pub(crate) epilogue_reads: (Vec<usize>, bool),
    pub(crate) out_shape: Vec<usize>,
    /// The depth of the product (`A`'s columns).
    pub(crate) k: usize,
    /// Whether `B` is a weight (a trace input, through views at most), whose
    /// packed panels are kept from one run to the next.
    pub(crate) b_is_weight: bool,
    /// Packed weights by their buffer: those prepared before the first run
    /// ([`Kernel::prepare_constant`]) for the kernel's life, those kept from
    /// a second run up to [`PACKED_KEPT`].
    pub(crate) packed: KeptByBuffer<PackedB>,
    /// Buffers of `B` read once and not yet kept.
    pub(crate) seen: Mutex<Vec<Seen>>,
    /// What a run packs, kept for the next.
    pub(crate) scratch: Mutex<Scratch>,
}

/// A buffer of `B` as a run saw it, by identity.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    storage: usize,
    offset: usize,
    strides: Vec<isize>,
    /// The bits of a few of its values.
    sample: [u32; 16],
}

/// The bits of 16 values of the `[k, n]` matrix at `at`, spread over it.
fn sample(src: &[f32], at: Strided, k: usize, n: usize) -> [u32; 16] {
    let count = k * n;
    std::array::from_fn(|i| match count {
        0 => 0,
        _ => {
            let e = i * (count - 1) / 15;
            src[at.at(e / n, e % n)].to_bits()
        }
    })
}

/// Buffers a run packs its operands into.
#[derive(Default)]
pub(crate) struct Scratch {
    /// `A`, every batch's.
    a: Vec<f32>,
    /// `B`s that are not weights, one buffer each.
    b: Vec<Vec<f32>>,
    /// A `linear`'s bias, padded to whole panels.
    bias: Vec<f32>,
}

fn fail(message: String) -> Error {
    Error::Kernel {
        executor: crate::NAME.into(),
        op: "matmul".into(),
        message,
    }
}

/// The operands' matrices: sizes, and where each batch's lie.
struct Layout {
    m: usize,
    n: usize,
    k: usize,
    a: Vec<Strided>,
    /// One per batch, or one for all.
    b: Vec<Strided>,
}

/// `B`'s columns, and its strides along a row of the product's `B` (`k`)
/// and a column (`n`).
fn b_matrix(b: &Tensor, b_transposed: bool) -> (usize, isize, isize) {
    let br = b.rank();
    match b_transposed {
        false => (b.shape()[br - 1], b.strides()[br - 2], b.strides()[br - 1]),
        true => (b.shape()[br - 2], b.strides()[br - 1], b.strides()[br - 2]),
    }
}

/// The matrices of `a` (`[.., m, k]`) and `b` (`[.., k, n]`, or `[.., n, k]`
/// when `b_transposed`) for an output of `out_shape`, batch dims broadcast;
/// rows of `a` that follow on evenly from one batch to the next are one
/// taller matrix, so a product with a shared `B` is one product.
fn layout(a: &Tensor, b: &Tensor, b_transposed: bool, out_shape: &[usize]) -> Layout {
    let rank = out_shape.len();
    let batch_shape = &out_shape[..rank - 2];
    let ar = a.rank();
    let (m, k) = (a.shape()[ar - 2], a.shape()[ar - 1]);
    let (n, b_row, b_col) = b_matrix(b, b_transposed);
    let (a_row, a_col) = (a.strides()[ar - 2], a.strides()[ar - 1]);
    let strided = |offset: isize, row: isize, col: isize| Strided {
        offset: offset as usize,
        row,
        col,
    };
    let at_a: Vec<Strided> = batch_offsets(a.shape(), a.strides(), a.offset(), batch_shape)
        .into_iter()
        .map(|o| strided(o, a_row, a_col))
        .collect();
    let mut at_b: Vec<Strided> = batch_offsets(b.shape(), b.strides(), b.offset(), batch_shape)
        .into_iter()
        .map(|o| strided(o, b_row, b_col))
        .collect();
    let batches = at_a.len();
    let shared_b = at_b.windows(2).all(|w| w[0] == w[1]);
    if shared_b {
        at_b.truncate(1);
    }
    let rows_follow_on = at_a
        .iter()
        .enumerate()
        .all(|(i, s)| s.offset as isize == at_a[0].offset as isize + (i * m) as isize * a_row);
    if shared_b && batches > 1 && rows_follow_on {
        return Layout {
            m: m * batches,
            n,
            k,
            a: vec![at_a[0]],
            b: at_b,
        };
    }
    Layout {
        m,
        n,
        k,
        a: at_a,
        b: at_b,
    }
}

impl GemmKernel {
    /// The packed `B`s of this run: kept ones where `B` is a weight packed
    /// before, else packed now into buffers from `pool` (into `fresh`).
    fn packed_b(
        &self,
        b: &Tensor,
        src: &[f32],
        l: &Layout,
        pool: &mut Vec<Vec<f32>>,
        fresh: &mut Vec<PackedB>,
    ) -> Option<Arc<PackedB>> {
        let keep = self.b_is_weight && !b.may_change() && l.b.len() == 1;
        if keep {
            if let Some(p) = self.packed.find(b) {
                return Some(p);
            }
            // Kept from the second run that reads this buffer on: a model
            // input fed anew on every call (a decoder's past keys) is never
            // held, and a weight is packed twice in all. Only the buffer's
            // identity and a few of its values are remembered meanwhile,
            // nothing that keeps it alive: a new tensor the allocator puts
            // where a freed one was differs in its values (if it does not, it
            // is kept and held, which costs memory, never a wrong result).
            let key = Seen {
                storage: b.storage_id(),
                offset: b.offset(),
                strides: b.strides().to_vec(),
                sample: sample(src, l.b[0], l.k, l.n),
            };
            let second = match self.seen.lock() {
                Ok(mut seen) => match seen.iter().position(|s| *s == key) {
                    Some(i) => {
                        seen.remove(i);
                        true
                    }
                    None => {
                        if seen.len() == PACKED_KEPT {
                            seen.remove(0);
                        }
                        seen.push(key);
                        false
                    }
                },
                Err(_) => false,
            };
            if !second {
                let buf = pool.pop().unwrap_or_default();
                fresh.push(PackedB::pack(src, l.b[0], l.k, l.n, buf));
                return None;
            }
            let p = Arc::new(PackedB::pack(src, l.b[0], l.k, l.n, Vec::new()));
            self.packed.keep(b, p.clone());
            return Some(p);
        }
        let buffers: Vec<Vec<f32>> = (0..l.b.len()).map(|_| pool.pop().unwrap_or_default()).collect();
        let (k, n) = (l.k, l.n);
        if packed_in_parallel(l.b.len(), PackedB::len(k, n)) {
            buffers
                .into_par_iter()
                .zip(l.b.par_iter())
                .map(|(buf, &at)| PackedB::pack(src, at, k, n, buf))
                .collect_into_vec(fresh);
        } else {
            fresh.extend(
                buffers
                    .into_iter()
                    .zip(&l.b)
                    .map(|(buf, &at)| PackedB::pack(src, at, k, n, buf)),
            );
        }
        None
    }
}

/// `t`, copied where its elements are not dense in its buffer.
fn dense(t: &Tensor) -> Result<std::borrow::Cow<'_, Tensor>> {
    Ok(match t.contiguous_data::<f32>() {
        Some(_) => std::borrow::Cow::Borrowed(t),
        None => std::borrow::Cow::Owned(t.contiguous()?),
    })
}

/// A tensor's whole buffer as f32s.
fn f32s<'a>(t: &'a Tensor, what: &str) -> Result<&'a [f32]> {
    if t.dtype() != DType::F32 {
        return Err(fail(format!("{what} is {}, not f32", t.dtype())));
    }
    t.buffer::<f32>()
        .ok_or_else(|| fail(format!("{what} is not in host memory")))
}

impl Kernel for GemmKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        switchyard_core::executor::run_allocating(self, inputs)
    }

    /// By the rules a run follows: the product's multiply-adds
    /// ([`threaded`]) and the `B`s it packs ([`packed_in_parallel`]).
    fn uses_threads(&self) -> bool {
        let rank = self.out_shape.len();
        let cells: usize = self.out_shape.iter().product();
        let batches: usize = self.out_shape[..rank.saturating_sub(2)].iter().product();
        let n = self.out_shape.last().copied().unwrap_or(1);
        threaded(cells.saturating_mul(self.k)) || packed_in_parallel(batches, PackedB::len(self.k, n))
    }

    /// Packs `B` now where it is a weight that the runs will find kept:
    /// one matrix (no batch dims, or all of them 1), f32 on the host.
    fn prepare_constant(&self, input: usize, value: &Tensor) -> Result<bool> {
        let (b, b_transposed) = match self.form {
            Form::Matmul { b, .. } => (b, false),
            Form::Linear { w, .. } => (w, true),
        };
        let rank = value.rank();
        let one_matrix = rank >= 2 && value.shape()[..rank - 2].iter().all(|&d| d == 1);
        if input != b || !self.b_is_weight || !one_matrix || value.may_change() || value.dtype() != DType::F32
        {
            return Ok(false);
        }
        // Packed already for the plan of another input shape that shares
        // this kernel.
        if self.packed.holds(value) {
            return Ok(true);
        }
        let Some(src) = value.buffer::<f32>() else {
            return Ok(false);
        };
        let (n, row, col) = b_matrix(value, b_transposed);
        let depth = value.shape()[rank - 2 + b_transposed as usize];
        if depth != self.k || self.out_shape.last() != Some(&n) {
            return Ok(false);
        }
        let at = Strided {
            offset: value.offset(),
            row,
            col,
        };
        let packed = Arc::new(PackedB::pack(src, at, self.k, n, Vec::new()));
        Ok(self.packed.hold(value, packed))
    }

    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<()> {
        let (a, b, b_transposed, bias) = match self.form {
            Form::Matmul { a, b } => (inputs[a], inputs[b], false, None),
            Form::Linear { x, w, bias } => (inputs[x], inputs[w], true, bias.map(|i| inputs[i])),
        };
        if a.rank() < 2 || b.rank() < 2 {
            return Err(fail(format!(
                "operands of rank {} and {}; this kernel multiplies matrices",
                a.rank(),
                b.rank()
            )));
        }
        let l = layout(a, b, b_transposed, &self.out_shape);
        let (a_src, b_src) = (f32s(a, "the left operand")?, f32s(b, "the right operand")?);
        // A run from another thread meanwhile packs into buffers of its own.
        let mut held = self.scratch.try_lock();
        let mut own = Scratch::default();
        let scratch = match held.as_deref_mut() {
            Ok(s) => s,
            Err(_) => &mut own,
        };
        // The bias, padded with zeros to whole panels, in a buffer kept
        // from run to run.
        if let Some(t) = bias {
            let padded = &mut scratch.bias;
            padded.clear();
            match t.contiguous_data::<f32>() {
                Some(values) => padded.extend_from_slice(values),
                None => padded.extend(
                    t.to_vec::<f32>()
                        .ok_or_else(|| fail(format!("the bias is {}, not f32", t.dtype())))?,
                ),
            }
            if padded.len() != l.n {
                return Err(fail(format!(
                    "a bias of {} values for {} columns",
                    padded.len(),
                    l.n
                )));
            }
            padded.resize(l.n.div_ceil(NR) * NR, 0.0);
        }
        let mut fresh = Vec::new();
        let kept = self.packed_b(b, b_src, &l, &mut scratch.b, &mut fresh);
        let packed: Vec<&PackedB> = match &kept {
            Some(p) => vec![p.as_ref()],
            None => fresh.iter().collect(),
        };
        // The inputs the epilogue reads, dense; the others are not looked at
        // (and nothing is gathered for a product alone).
        let finishing = !self.epilogue.steps.is_empty();
        let (read, by_column) = &self.epilogue_reads;
        let dense: Vec<(usize, std::borrow::Cow<Tensor>)> = read
            .iter()
            .map(|&i| dense(inputs[i]).map(|t| (i, t)))
            .collect::<Result<_>>()?;
        let mut finish_inputs: Vec<&[f32]> = vec![&[]; if finishing { inputs.len() } else { 0 }];
        for (i, t) in &dense {
            finish_inputs[*i] = t
                .contiguous_data::<f32>()
                .ok_or_else(|| fail(format!("input {i} of the epilogue is {}, not f32", t.dtype())))?;
        }
        let mut buf = OutputBuffer::given_or_new(given, 0, DType::F32, &self.out_shape)?;
        let c = buf.slice_mut::<f32>().expect("an f32 buffer");
        Products {
            m: l.m,
            n: l.n,
            k: l.k,
            a: a_src,
            a_at: &l.a,
            b: &packed,
            bias: bias.map(|_| scratch.bias.as_slice()),
            finish: finishing.then(|| Finisher {
                epilogue: &self.epilogue,
                inputs: &finish_inputs,
                by_column: *by_column,
                simd: switchyard_simd::Simd::current(),
            }),
        }
        .run(c, &mut scratch.a);
        drop(packed);
        scratch.b.extend(fresh.into_iter().map(|p| p.data));
        outputs.push(buf.into_tensor());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel() -> GemmKernel {
        GemmKernel {
            form: Form::Matmul { a: 0, b: 1 },
            epilogue: Epilogue::default(),
            epilogue_reads: (Vec::new(), false),
            out_shape: vec![3, 5],
            k: 4,
            b_is_weight: true,
            packed: KeptByBuffer::new(PACKED_KEPT),
            seen: Mutex::new(Vec::new()),
            scratch: Mutex::new(Scratch::default()),
        }
    }

    fn tensor(seed: usize, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_vec((0..n).map(|i| ((i * 7 + seed) % 11) as f32).collect(), shape).unwrap()
    }

    #[test]
    fn a_weight_is_kept_from_its_second_run_and_an_input_fed_anew_never() {
        let k = kernel();
        let a = tensor(1, &[3, 4]);
        // A new right operand on every run: packed per run, never held.
        for seed in 0..5 {
            k.run(&[&a, &tensor(seed, &[4, 5])]).unwrap();
        }
        assert_eq!(k.packed.kept_len(), 0);
        // The same one twice: kept, and the same result from it.
        let w = tensor(9, &[4, 5]);
        let first = k.run(&[&a, &w]).unwrap();
        assert_eq!(k.packed.kept_len(), 0);
        let second = k.run(&[&a, &w]).unwrap();
        assert_eq!(k.packed.kept_len(), 1);
        let third = k.run(&[&a, &w]).unwrap();
        let values = |t: &[Tensor]| t[0].to_vec::<f32>().unwrap();
        assert_eq!(values(&first), values(&second));
        assert_eq!(values(&first), values(&third));
    }

    #[test]
    fn a_weight_prepared_before_the_first_run_is_read_packed_from_it() {
        let k = kernel();
        let a = tensor(1, &[3, 4]);
        let w = tensor(9, &[4, 5]);
        let want = kernel().run(&[&a, &w]).unwrap()[0].to_vec::<f32>().unwrap();
        assert!(
            !k.prepare_constant(0, &a).unwrap(),
            "the left operand is not packed"
        );
        assert!(
            !k.prepare_constant(1, &tensor(2, &[4, 6])).unwrap(),
            "nor a matrix of other shape"
        );
        assert!(k.prepare_constant(1, &w).unwrap());
        for _ in 0..3 {
            assert_eq!(k.run(&[&a, &w]).unwrap()[0].to_vec::<f32>().unwrap(), want);
        }
        // Found among the constants from the first run: nothing remembered
        // or packed again for a second.
        assert!(k.seen.lock().unwrap().is_empty());
        assert_eq!(k.packed.kept_len(), 0);
        // Another tensor of the same values is not that buffer: packed per run.
        let other = tensor(9, &[4, 5]);
        assert_eq!(k.run(&[&a, &other]).unwrap()[0].to_vec::<f32>().unwrap(), want);
        assert_eq!(k.seen.lock().unwrap().len(), 1);
    }
}
