//! The compiled region: a convolution and its epilogue.

use std::sync::{Arc, RwLock};

use rayon::prelude::*;
use switchyard_core::executor::{Kernel, run_allocating};
use switchyard_core::ir::window::{ConvGeometry, Window};
use switchyard_core::{DType, OutputBuffer, Result, Tensor};

use crate::epilogue::{At, Epilogue};
use crate::gemm::{Im2col, MR, NR, PackedWeights, conv_tile, fast_kernel};
use crate::window::{self, Planes, Reduce};

/// Output positions per task, at most.
const NC: usize = 8 * NR;

/// Packed weights and the tensor they were packed from, held so that its
/// buffer cannot change or be freed while it is the key.
type Packed = Vec<(Tensor, Arc<PackedWeights>)>;

/// Weight tensors a kernel keeps packed at once: the kernel cache gives
/// one kernel to every convolution of the same shape (a ResNet stage's
/// convolutions), each with weights of its own.
const PACKED_KEPT: usize = 64;

/// One GEMM task: batch item, group, first channel, first position.
type Task = (usize, usize, usize, usize);

/// The op a kernel is built around.
pub(crate) enum Anchor {
    /// A convolution; `w` is the weight's region input.
    Conv { geometry: ConvGeometry, w: usize },
    /// A transposed convolution; `w` is the weight's region input.
    ConvTranspose { geometry: ConvGeometry, w: usize },
    /// A max pool, or an average pool dividing each output position by its
    /// divisor.
    Pool {
        window: Window,
        divisors: Option<Vec<f32>>,
        channels: usize,
    },
}

pub(crate) struct ConvKernel {
    anchor: Anchor,
    /// The region input the anchor reads.
    x: usize,
    epilogue: Epilogue,
    out_shape: Vec<usize>,
    /// For a convolution run as a GEMM: its windows, and its tiles, one
    /// task each (batch item, group, first channel, first position), of at
    /// most `mc` channels.
    im: Option<Im2col>,
    tasks: Vec<Task>,
    mc: usize,
    /// Output positions per task.
    nc: usize,
    packed: RwLock<Packed>,
}

impl ConvKernel {
    pub(crate) fn new(anchor: Anchor, x: usize, epilogue: Epilogue, out_shape: Vec<usize>) -> ConvKernel {
        let (im, (tasks, mc, nc)) = match &anchor {
            Anchor::Conv { geometry, .. } if geometry.in_channels != geometry.groups => {
                let im = Im2col::new(&geometry.window);
                let tiles = tiles(geometry, im.positions, rayon::current_num_threads());
                (Some(im), tiles)
            }
            _ => (None, (Vec::new(), 0, 0)),
        };
        ConvKernel {
            anchor,
            x,
            epilogue,
            out_shape,
            im,
            tasks,
            mc,
            nc,
            packed: RwLock::new(Vec::new()),
        }
    }

    /// The weights packed, as an earlier run packed them when the tensor is
    /// the same immutable buffer.
    fn packed(&self, g: &ConvGeometry, w: &Tensor, dense: &[f32]) -> Arc<PackedWeights> {
        let same = |held: &Tensor| {
            held.storage_id() == w.storage_id()
                && held.offset() == w.offset()
                && held.strides() == w.strides()
                && !w.is_arena()
        };
        if let Ok(guard) = self.packed.read()
            && let Some((_, p)) = guard.iter().find(|(held, _)| same(held))
        {
            return p.clone();
        }
        let m_per = g.out_channels / g.groups;
        let k = g.in_channels / g.groups * g.window.taps();
        let p = Arc::new(PackedWeights::pack(dense, g.groups, m_per, k));
        if !w.is_arena()
            && let Ok(mut guard) = self.packed.write()
        {
            if guard.len() == PACKED_KEPT {
                // The oldest goes: a kernel shared by more weights than
                // this packs some of them on every run.
                guard.remove(0);
            }
            guard.push((w.clone(), p.clone()));
        }
        p
    }
}

/// The GEMM's tasks, their channel count and their position count, for
/// `threads` threads. Each task packs the input's windows for its positions
/// once and runs every channel of its group over them, so positions are
/// what is split: into chunks of up to [`NC`], sized so that the chunks
/// share out evenly over the threads (a 28 x 28 map is 49 tiles of 16:
/// 10 chunks of 5, not 7 of 8 that leave a thread idle an eighth of the
/// time). Only where there are fewer chunks than threads (a map of 16
/// positions or fewer) are the channels split too, each such task packing
/// the same windows again.
fn tiles(g: &ConvGeometry, positions: usize, threads: usize) -> (Vec<Task>, usize, usize) {
    let m_per = g.out_channels / g.groups;
    let items = g.batch * g.groups;
    let blocks = positions.div_ceil(NR).max(1);
    let threads = threads.max(1);
    // Blocks per chunk: the best share-out, larger chunks among equals.
    let share = |per: usize| {
        let chunks = items * blocks.div_ceil(per);
        let rounds = chunks.div_ceil(threads);
        (items * blocks) as f64 / (threads * rounds * per) as f64
    };
    let most = NC / NR;
    let mut per = most.min(blocks);
    let least = if blocks <= most { 1 } else { most.div_ceil(2) };
    for p in (least..=most.min(blocks)).rev() {
        if share(p) > share(per) + 1e-9 {
            per = p;
        }
    }
    let nc = per * NR;
    let chunks = items * positions.div_ceil(nc);
    let splits = if chunks >= threads {
        1
    } else {
        threads.div_ceil(chunks)
    };
    let mc = m_per.div_ceil(splits).div_ceil(MR).max(1) * MR;
    let mut tasks = Vec::new();
    for n in 0..g.batch {
        for grp in 0..g.groups {
            for m0 in (0..m_per).step_by(mc) {
                for p0 in (0..positions).step_by(nc) {
                    tasks.push((n, grp, m0, p0));
                }
            }
        }
    }
    (tasks, mc, nc)
}

fn dense(t: &Tensor) -> Result<std::borrow::Cow<'_, Tensor>> {
    Ok(if t.is_contiguous() && t.offset() == 0 {
        std::borrow::Cow::Borrowed(t)
    } else {
        std::borrow::Cow::Owned(t.contiguous()?)
    })
}

fn f32s(t: &Tensor) -> Result<&[f32]> {
    t.contiguous_data::<f32>()
        .ok_or_else(|| switchyard_core::Error::Kernel {
            executor: crate::NAME.into(),
            op: "conv".into(),
            message: format!("expected a dense f32 tensor, got {}", t.dtype()),
        })
}

/// A pointer the tasks of one run write disjoint parts of the output through.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: every task writes a set of elements no other task writes, and
// the run waits for all of them.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The element at `i`. A method, so that closures capture the whole
    /// (Send) wrapper rather than its raw pointer.
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

impl Kernel for ConvKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        run_allocating(self, inputs)
    }

    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<()> {
        let fits = |b: &OutputBuffer| b.dtype() == DType::F32 && b.shape() == self.out_shape.as_slice();
        let mut buf = match given.first_mut().and_then(Option::take).filter(fits) {
            Some(b) => b,
            None => OutputBuffer::new(DType::F32, &self.out_shape)?,
        };
        let held: Vec<std::borrow::Cow<Tensor>> = inputs.iter().map(|t| dense(t)).collect::<Result<_>>()?;
        let data: Vec<&[f32]> = held.iter().map(|t| f32s(t)).collect::<Result<_>>()?;
        let out = buf.slice_mut::<f32>().expect("an f32 buffer");
        match (&self.anchor, &self.im) {
            (Anchor::Conv { geometry, w }, Some(im)) => {
                let packed = self.packed(geometry, inputs[*w], data[*w]);
                let mut phased = Vec::new();
                let planes = geometry.batch * geometry.in_channels;
                let x = im.source(data[self.x], planes, &mut phased);
                self.gemm(geometry, im, &packed, x, out, &data);
            }
            (Anchor::Conv { geometry: g, w }, None) => {
                let planes = Planes {
                    inputs: g.in_channels,
                    outputs: g.out_channels,
                };
                let reduce = Reduce::Weighted(data[*w]);
                window::run(
                    &g.window,
                    planes,
                    reduce,
                    data[self.x],
                    out,
                    &self.epilogue,
                    &data,
                );
            }
            (Anchor::ConvTranspose { geometry, w }, _) => {
                crate::transpose::run(geometry, data[*w], data[self.x], out, &self.epilogue, &data);
            }
            (
                Anchor::Pool {
                    window: win,
                    divisors,
                    channels,
                },
                _,
            ) => {
                let planes = Planes {
                    inputs: *channels,
                    outputs: *channels,
                };
                let reduce = match divisors {
                    Some(d) => Reduce::Mean(d),
                    None => Reduce::Max,
                };
                window::run(win, planes, reduce, data[self.x], out, &self.epilogue, &data);
            }
        }
        outputs.push(buf.into_tensor());
        Ok(())
    }
}

impl ConvKernel {
    fn gemm(
        &self,
        g: &ConvGeometry,
        im: &Im2col,
        packed: &PackedWeights,
        x: &[f32],
        out: &mut [f32],
        data: &[&[f32]],
    ) {
        let (m, groups) = (g.out_channels, g.groups);
        let m_per = m / groups;
        let c_per = g.in_channels / groups;
        let positions = im.positions;
        let plane = im.plane;
        let (mc, nc, tasks) = (self.mc, self.nc, &self.tasks);
        let ptr = Out(out.as_mut_ptr());
        let total = out.len();
        let fast = fast_kernel(switchyard_simd::Simd::current());
        tasks.par_iter().for_each_init(
            || (Vec::new(), Vec::new()),
            |(scratch, regs), &(n, grp, m0, p0)| {
                let rows = mc.min(m_per - m0);
                let cols = nc.min(positions - p0);
                let xs = &x[(n * g.in_channels + grp * c_per) * plane..][..c_per * plane];
                let first = (n * m + grp * m_per + m0) * positions + p0;
                assert!(first + (rows - 1) * positions + cols <= total);
                // SAFETY: in bounds (asserted); tasks write disjoint
                // (channel, position) ranges of the output.
                unsafe {
                    conv_tile(
                        packed,
                        im,
                        grp,
                        (m0, rows),
                        xs,
                        (p0, cols),
                        ptr.at(first),
                        positions,
                        scratch,
                        fast,
                    )
                };
                for r in 0..rows {
                    let offset = first + r * positions;
                    // SAFETY: this task's own row segment, written above.
                    let row = unsafe { std::slice::from_raw_parts_mut(ptr.at(offset), cols) };
                    let at = At {
                        inputs: data,
                        channel: grp * m_per + m0 + r,
                        offset,
                    };
                    self.epilogue.apply(row, &at, regs, fast);
                }
            },
        );
    }
}
