//! The compiled region: a convolution and its epilogue.

use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use switchyard_core::executor::{Kernel, run_allocating};
use switchyard_core::ir::window::{ConvGeometry, Window};
use switchyard_core::kept::KeptByBuffer;
use switchyard_core::{DType, OutputBuffer, Result, Tensor};

use crate::direct::Direct;
use crate::epilogue::{At, Epilogue, Head, split_head};
use crate::gemm::{self, MR, NR, PackedWeights, fast_kernel, wide_kernel};
use crate::window::{self, Planes, Reduce, Windows};

/// Output positions per task, at most.
const NC: usize = 8 * NR;

/// Bytes of packed weights a task's tiles run over, at most (half of L2):
/// more, and each tile of positions reads them from L3 (a 320 -> 1280 1x1
/// convolution at 7 x 7 had 1.6 MB of them).
const WEIGHTS_BLOCK: usize = 256 << 10;

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
    /// For a convolution: the epilogue's [`Head`], applied as each tile is
    /// copied to the output, and the steps after it; otherwise no head and
    /// the whole epilogue.
    head: Head,
    tail: Epilogue,
    out_shape: Vec<usize>,
    /// For a convolution run as a GEMM: how it reads its input, and its
    /// tiles, one task each (batch item, group, first channel, first
    /// position `q`), of at most `mc` channels.
    direct: Option<Direct>,
    /// For a depthwise convolution or a pool with positions to compute:
    /// its layout, worked out once.
    windows: Option<Windows>,
    tasks: Vec<Task>,
    mc: usize,
    /// Positions `q` per task.
    nc: usize,
    /// Per chunk of `nc` positions `q`: where its output positions are
    /// ([`Direct::runs`]).
    runs: Vec<Vec<(usize, usize, usize)>>,
    /// Packed weights by their buffer: those prepared before the first run
    /// ([`Kernel::prepare_constant`]) for the kernel's life, those packed
    /// by a run up to [`PACKED_KEPT`].
    packed: KeptByBuffer<PackedWeights>,
    /// The source buffer of the last run, for the next one (a concurrent
    /// run allocates its own).
    source: Mutex<Vec<f32>>,
}

impl ConvKernel {
    pub(crate) fn new(anchor: Anchor, x: usize, epilogue: Epilogue, out_shape: Vec<usize>) -> ConvKernel {
        let (direct, (tasks, mc, nc)) = match &anchor {
            Anchor::Conv { geometry, .. } if runs_as_gemm(geometry) => {
                let direct = Direct::new(&geometry.window);
                let tiles = tiles(geometry, &direct, rayon::current_num_threads());
                (Some(direct), tiles)
            }
            _ => (None, (Vec::new(), 0, 0)),
        };
        let windows = match &anchor {
            Anchor::Conv { geometry, .. } if direct.is_none() => Windows::new(&geometry.window),
            Anchor::Pool { window, .. } => Windows::new(window),
            _ => None,
        };
        let (head, tail) = match &anchor {
            Anchor::Conv { .. } => split_head(epilogue),
            _ => (Head::default(), epilogue),
        };
        let runs = match &direct {
            Some(d) if nc > 0 => d.runs(nc),
            _ => Vec::new(),
        };
        ConvKernel {
            anchor,
            x,
            head,
            tail,
            out_shape,
            direct,
            windows,
            tasks,
            mc,
            nc,
            packed: KeptByBuffer::new(PACKED_KEPT),
            runs,
            source: Mutex::new(Vec::new()),
        }
    }

    /// The weights packed, as an earlier run packed them when the tensor is
    /// the same immutable buffer.
    fn packed(&self, g: &ConvGeometry, direct: &Direct, w: &Tensor, dense: &[f32]) -> Arc<PackedWeights> {
        if let Some(p) = self.packed.find(w) {
            return p;
        }
        let (m_per, c_per) = (g.out_channels / g.groups, g.in_channels / g.groups);
        let p = Arc::new(gemm::pack(direct, dense, g.groups, m_per, c_per));
        self.packed.keep(w, p.clone());
        p
    }
}

/// Whether a convolution runs as a GEMM: all but the depthwise ones (one
/// input channel per group, several groups), which run a plane at a time.
/// A convolution of one input channel into many (an audio front end's
/// strided filter bank) is a GEMM over its taps: a plane at a time, each
/// output channel would read the input again.
pub(crate) fn runs_as_gemm(g: &ConvGeometry) -> bool {
    g.groups == 1 || g.in_channels != g.groups
}

/// The GEMM's tasks, their channel count and their position count, for
/// `threads` threads. Each task packs the input's windows for its positions
/// once and runs every channel of its group over them, so positions are
/// what is split: into chunks of up to [`NC`], sized so that the chunks
/// share out evenly over the threads (a 28 x 28 map is 49 tiles of 16:
/// 10 chunks of 5, not 7 of 8 that leave a thread idle an eighth of the
/// time). Only where there are fewer chunks than threads (a map of 16
/// positions or fewer) are the channels split too, each such task packing
/// the same windows again. A task's channels are at most as many as keep
/// its block of the packed weights in L2 ([`WEIGHTS_BLOCK`]): every tile of
/// positions streams through all of them.
fn tiles(g: &ConvGeometry, direct: &Direct, threads: usize) -> (Vec<Task>, usize, usize) {
    let positions = direct.span;
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
        threads.div_ceil(chunks.max(1))
    };
    let depth = gemm::block(direct, g.in_channels / g.groups) * direct.taps();
    let most = (WEIGHTS_BLOCK / (4 * depth * MR)).max(1) * MR;
    // As many blocks of channels as that takes, and where there are few
    // tasks, as many more as share them out evenly over the threads.
    let mut blocks_m = splits.max(m_per.div_ceil(most));
    while !(chunks * blocks_m).is_multiple_of(threads) && chunks * blocks_m < 4 * threads {
        blocks_m += 1;
    }
    let mc = m_per.div_ceil(blocks_m).div_ceil(MR).max(1) * MR;
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
pub(crate) struct Out(pub(crate) *mut f32);
// SAFETY: every task writes a set of elements no other task writes, and
// the run waits for all of them.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The element at `i`. A method, so that closures capture the whole
    /// (Send) wrapper rather than its raw pointer.
    pub(crate) fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

impl Kernel for ConvKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        run_allocating(self, inputs)
    }

    /// Packs a convolution's weight now, where it runs as a GEMM and the
    /// weight is a dense f32 tensor on the host that runs will be given.
    fn prepare_constant(&self, input: usize, value: &Tensor) -> Result<bool> {
        let (Anchor::Conv { geometry: g, w }, Some(direct)) = (&self.anchor, &self.direct) else {
            return Ok(false);
        };
        let expected = [g.out_channels, g.in_channels / g.groups.max(1)];
        let fits = value.rank() >= 2 && value.shape()[..2] == expected;
        if input != *w || !fits || value.may_change() || value.dtype() != DType::F32 {
            return Ok(false);
        }
        // Packed already for the plan of another input shape that shares
        // this kernel.
        if self.packed.holds(value) {
            return Ok(true);
        }
        let Some(dense) = value.contiguous_data::<f32>() else {
            return Ok(false);
        };
        let (m_per, c_per) = (g.out_channels / g.groups, g.in_channels / g.groups);
        let packed = Arc::new(gemm::pack(direct, dense, g.groups, m_per, c_per));
        Ok(self.packed.hold(value, packed))
    }

    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<()> {
        let mut buf = OutputBuffer::given_or_new(given, 0, DType::F32, &self.out_shape)?;
        let held: Vec<std::borrow::Cow<Tensor>> = inputs.iter().map(|t| dense(t)).collect::<Result<_>>()?;
        let data: Vec<&[f32]> = held.iter().map(|t| f32s(t)).collect::<Result<_>>()?;
        let out = buf.slice_mut::<f32>().expect("an f32 buffer");
        match (&self.anchor, &self.direct) {
            (Anchor::Conv { geometry, w }, Some(direct)) => {
                let packed = self.packed(geometry, direct, inputs[*w], data[*w]);
                if !direct.gemm_copies() {
                    self.gemm(geometry, direct, &packed, data[self.x], out, &data);
                } else {
                    let mut held = self.source.try_lock();
                    let mut own = Vec::new();
                    let buf = match held.as_deref_mut() {
                        Ok(b) => b,
                        Err(_) => &mut own,
                    };
                    let (x, channel) = (data[self.x], direct.channel);
                    let plane: usize = geometry.window.input.iter().product();
                    buf.resize(direct.source_len(geometry.batch * geometry.in_channels), 0.0);
                    buf.par_chunks_exact_mut(channel)
                        .zip(x.par_chunks(plane))
                        .for_each(|(dst, src)| direct.fill(src, dst, 0.0));
                    self.gemm(geometry, direct, &packed, buf, out, &data);
                }
            }
            (Anchor::Conv { geometry: g, w }, None) => {
                let planes = Planes {
                    inputs: g.in_channels,
                    outputs: g.out_channels,
                };
                self.window(planes, Reduce::Weighted(data[*w]), out, &data);
            }
            (Anchor::ConvTranspose { geometry, w }, _) => {
                crate::transpose::run(geometry, data[*w], data[self.x], out, &self.tail, &data);
            }
            (
                Anchor::Pool {
                    divisors, channels, ..
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
                self.window(planes, reduce, out, &data);
            }
        }
        outputs.push(buf.into_tensor());
        Ok(())
    }
}

impl ConvKernel {
    /// A depthwise convolution or a pool ([`window::run`]) with the
    /// kernel's epilogue; nothing to compute for an empty output.
    fn window(&self, planes: Planes, reduce: Reduce, out: &mut [f32], data: &[&[f32]]) {
        let Some(windows) = &self.windows else { return };
        window::run(
            windows,
            planes,
            reduce,
            data[self.x],
            out,
            (&self.head, &self.tail),
            data,
        );
    }

    /// The convolution over `src`, its source ([`Direct`]), into `out`,
    /// each task's tile finished by the epilogue.
    fn gemm(
        &self,
        g: &ConvGeometry,
        direct: &Direct,
        packed: &PackedWeights,
        src: &[f32],
        out: &mut [f32],
        data: &[&[f32]],
    ) {
        let (m, groups) = (g.out_channels, g.groups);
        let (m_per, c_per) = (m / groups, g.in_channels / groups);
        let positions: usize = g.window.output.iter().product();
        let (mc, nc, tasks) = (self.mc, self.nc, &self.tasks);
        let ptr = Out(out.as_mut_ptr());
        let total = out.len();
        let simd = switchyard_simd::Simd::current();
        let fast = fast_kernel(simd);
        let wide = wide_kernel(simd);
        tasks.par_iter().for_each(|&(n, grp, m0, q0)| {
            crate::scratch::with(|[acc, regs, scratch]| {
                let rows = mc.min(m_per - m0);
                let width = nc.min(direct.span - q0);
                let ldc = width.div_ceil(NR) * NR;
                acc.resize(rows.div_ceil(MR) * MR * ldc, 0.0);
                let at = (n * g.in_channels + grp * c_per) * direct.channel;
                let channel0 = grp * m_per + m0;
                let row0 = (n * m + channel0) * positions;
                // Positions `q` that are the output's own: whole tiles are
                // stored there directly, finished by the head.
                let store = (direct.q_is_output() && c_per > 0).then(|| {
                    assert!(row0 + (rows - 1) * positions + q0 + width <= total);
                    gemm::Store {
                        at: ptr.at(row0 + q0),
                        stride: positions,
                        head: self.head.rows(data, channel0),
                    }
                });
                // SAFETY: the store's rows and positions lie in the output
                // (asserted) and are this task's alone.
                unsafe {
                    gemm::tile(
                        direct,
                        packed,
                        grp,
                        (m0, rows),
                        (src, at, c_per),
                        (q0, width),
                        (acc, ldc),
                        store.as_ref(),
                        scratch,
                        (fast, wide),
                    )
                };
                let runs = &self.runs[q0 / nc];
                let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
                    return;
                };
                let (p0, cols) = (first.2, last.2 + last.1 - first.2);
                let (full_rows, full_n) = match store {
                    Some(_) => gemm::Store::covers(rows, width),
                    None => (0, 0),
                };
                for r in 0..rows {
                    let offset = row0 + r * positions + p0;
                    assert!(offset + cols <= total);
                    // SAFETY: in bounds (asserted); tasks write disjoint
                    // (channel, position) ranges of the output.
                    let row = unsafe { std::slice::from_raw_parts_mut(ptr.at(offset), cols) };
                    let at = At {
                        inputs: data,
                        channel: channel0 + r,
                        offset,
                    };
                    // A stored row's whole tiles are in place; the rest of
                    // it (q is p here) is in the accumulators.
                    let rest = [(q0 + full_n, width - full_n, q0 + full_n)];
                    let runs = if r < full_rows { &rest[..] } else { runs };
                    self.head
                        .scatter((&acc[r * ldc..], q0), (row, p0), runs, &at, fast);
                    self.tail.apply(row, &at, regs, simd);
                }
            })
        });
    }
}
