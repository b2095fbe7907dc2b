//! One run's matrix products: where the operands lie, and the blocked,
//! threaded loop over packed panels that computes them.
//!
//! The loop is the classic one (Goto's): per task, a block of rows and a
//! run of panels of `B`; per block of `k`, each panel of `B` meets every
//! tile of the task's rows (in L2) before the next panel. The microkernel
//! reads rows of `A` where they lie when each is contiguous (as ONNX
//! Runtime's MLAS does: packing them costs as much as the product when `B`
//! is narrow, attention's `P V`); a transposed `A`, or one whose rows
//! would crowd the L1's sets ([`rows_share_sets`]), is packed once per run
//! into panels of six rows. Tasks are as many as share the work out evenly
//! over the threads; a product too small to pay for waking them runs on
//! the calling thread.

use std::cell::RefCell;

use rayon::prelude::*;
use switchyard_core::epilogue::{At, Epilogue};

use crate::micro::{self, Finish, Isa, MR, NR, Rows};
use crate::pack::{PackedA, PackedB, Strided, aligned};

/// Multiply-adds below which a product runs on the calling thread: waking
/// the pool and waiting for it costs tens of microseconds on some machines,
/// what a million multiply-adds take on one core (measured from 2^18: a
/// 32 x 64 x 256 product took 17 us on two threads, and GPT-2 tiny, BERT
/// tiny and Llama tiny ran 9-10% faster with the threshold at 2^20; the
/// corpus' larger transformers within 1%).
const PARALLEL_MIN: usize = 1 << 20;

/// Whether a run of `work` multiply-adds is shared over the threads.
pub(crate) fn threaded(work: usize) -> bool {
    work >= PARALLEL_MIN
}

/// Rows of a task, at most: its block of packed `A` (`MC x KC`, 264 KiB)
/// stays in L2 while every panel of its run passes. A taller block reads
/// each panel of `B` into L1 for more tiles (measured: 132 rows against 66,
/// 10-15% faster).
const MC: usize = 132;

/// Tiles of rows a panel of `B` meets from which the next panel is
/// fetched ahead.
const PREFETCH_TILES: usize = 8;

/// Values an epilogue finishes at once: its registers stay in L1, and the
/// cost of a call is spread over many (whole rows of a narrow product are
/// finished several at once, where no step reads by column).
const EPILOGUE_CHUNK: usize = 1024;

thread_local! {
    /// An epilogue's registers, per thread (a task's rows are finished on
    /// the thread that computed them).
    static REGISTERS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The elementwise ops that finish each product's result, and the inputs
/// they read (dense f32, by the kernel's input slot).
#[derive(Clone, Copy)]
pub(crate) struct Finisher<'a> {
    pub(crate) epilogue: &'a Epilogue,
    pub(crate) inputs: &'a [&'a [f32]],
    /// Whether a step reads one value per column ([`Epilogue::reads_columns`]).
    pub(crate) by_column: bool,
    /// The calling thread's SIMD level, which the tasks compute at.
    pub(crate) simd: switchyard_simd::Simd,
}

/// The products of one run: `batches` of `C[m, n] = A[m, k] B[k, n]`.
pub(crate) struct Products<'a> {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    /// `A`'s buffer, and where each batch's `A` lies in it.
    pub(crate) a: &'a [f32],
    pub(crate) a_at: &'a [Strided],
    /// Each batch's packed `B` (one for all where they share it).
    pub(crate) b: &'a [&'a PackedB],
    /// `n` values added to every row of `C`, padded to whole panels.
    pub(crate) bias: Option<&'a [f32]>,
    /// What finishes `C` once its values are final.
    pub(crate) finish: Option<Finisher<'a>>,
}

/// Where a task reads its rows of `A`.
#[derive(Clone, Copy)]
enum A<'a> {
    /// Packed once for the run.
    Packed(&'a PackedA<'a>),
    /// Where they lie, each row contiguous.
    Direct(Strided),
}

/// A pointer the tasks of one run write disjoint tiles of `C` through.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: every task writes tiles no other task writes, and the run waits
// for all of them before the output is read.
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}

impl Out {
    /// Element `i` of the output (a method, so that closures capture the
    /// whole `Out`, which is `Sync`, and not its pointer).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// Bytes of packed `A` a run of `batches` products of `[m, k]` rows takes.
pub(crate) fn packed_a_bytes(batches: usize, m: usize, k: usize) -> usize {
    (batches * PackedA::len(m, k) + 16) * std::mem::size_of::<f32>()
}

impl Products<'_> {
    /// Computes every product into `c` (`batches * m * n`, dense), packing
    /// `A` into `scratch` (reused from run to run).
    pub(crate) fn run(&self, c: &mut [f32], scratch: &mut Vec<f32>) {
        let (m, n, k) = (self.m, self.n, self.k);
        let batches = self.a_at.len();
        assert_eq!(c.len(), batches * m * n, "the output holds every product");
        assert!(
            self.b.len() == batches || self.b.len() == 1,
            "a packed B per batch, or one"
        );
        if m == 0 || n == 0 {
            return;
        }
        let panels = n.div_ceil(NR);
        if let Some(bias) = self.bias {
            assert!(bias.len() >= panels * NR, "the bias is padded to whole panels");
        }
        if k == 0 {
            for row in c.chunks_exact_mut(n) {
                match self.bias {
                    Some(bias) => row.copy_from_slice(&bias[..n]),
                    None => row.fill(0.0),
                }
            }
            let rows = c.len() / n;
            self.finish_rows(0, (0, rows), (0, n), c.as_mut_ptr());
            return;
        }
        let work = batches.saturating_mul(m).saturating_mul(n).saturating_mul(k);
        let threads = match threaded(work) {
            false => 1,
            true => rayon::current_num_threads().max(1),
        };
        let kc = self.b[0].kc;
        let isa = micro::isa();
        // A transposed A, or (below AVX-512) one whose rows share L1 sets,
        // packed once for every task.
        let direct = self.a_at.iter().all(|at| {
            at.col == 1 && at.row >= 0 && (isa == Isa::Avx512 || !rows_share_sets(at.row as usize, m.min(MR)))
        });
        let packed: Vec<PackedA> = match direct {
            true => Vec::new(),
            false => {
                let per = PackedA::len(m, k);
                let start = aligned(scratch, batches * per);
                let dst = &mut scratch[start..][..batches * per];
                // Each batch's panels shared over the threads, where the
                // product is shared over them.
                dst.chunks_exact_mut(per)
                    .zip(self.a_at)
                    .map(|(dst, at)| PackedA::pack(self.a, *at, (m, k, kc), dst, threads > 1))
                    .collect()
            }
        };
        let (row_blocks, mc) = {
            let blocks = m.div_ceil(MC);
            (blocks, m.div_ceil(blocks).div_ceil(MR) * MR)
        };
        // Runs of panels per block of rows: enough tasks to share out
        // evenly (at least four per thread where there are panels for it).
        let per_batch = batches * row_blocks;
        let runs = (4 * threads).div_ceil(per_batch).clamp(1, panels);
        let run_len = panels.div_ceil(runs);
        let runs = panels.div_ceil(run_len);
        let tasks = per_batch * runs;
        let out = Out(c.as_mut_ptr());
        let task = |t: usize| {
            let (batch, rest) = (t / (row_blocks * runs), t % (row_blocks * runs));
            let (rb, run) = (rest / runs, rest % runs);
            let r0 = rb * mc;
            let rows = mc.min(m - r0);
            let p0 = run * run_len;
            let p1 = (p0 + run_len).min(panels);
            let b = self.b[batch.min(self.b.len() - 1)];
            // This task's tiles are rows [r0, r0 + rows) of panels [p0, p1)
            // of batch `batch`, which no other task writes.
            let c = out.at(batch * m * n);
            let a = match direct {
                true => A::Direct(self.a_at[batch]),
                false => A::Packed(&packed[batch]),
            };
            self.block(a, b, (r0, rows), (p0, p1), c, isa);
            // Its values final, while they are in cache; on one thread,
            // once at the end, in a few long spans rather than many short
            // ones (a call costs what tens of values do).
            if threads > 1 && tasks > 1 {
                let cols = (p0 * NR, (p1 * NR).min(n));
                self.finish_rows(batch * m * n, (r0, rows), cols, c);
            }
        };
        if threads == 1 || tasks == 1 {
            (0..tasks).for_each(task);
            self.finish_rows(0, (0, batches * m), (0, n), c.as_mut_ptr());
        } else {
            (0..tasks).into_par_iter().for_each(task);
        }
    }

    /// Applies the epilogue, if any, to rows `[r0, r0 + rows)` and columns
    /// `[c0, c1)` of the product at `c` (its `m x n`), which lies at
    /// `base` in the output.
    fn finish_rows(&self, base: usize, (r0, rows): (usize, usize), (c0, c1): (usize, usize), c: *mut f32) {
        let Some(f) = self.finish else { return };
        if f.epilogue.steps.is_empty() {
            return;
        }
        let n = self.n;
        REGISTERS.with(|registers| {
            let mut registers = registers.borrow_mut();
            // The `len` values from `start` of the product, which lie in
            // `c`; no other task writes them.
            let mut span = |start: usize, len: usize| {
                for j in (0..len).step_by(EPILOGUE_CHUNK) {
                    let chunk = EPILOGUE_CHUNK.min(len - j);
                    // SAFETY: as said above.
                    let row = unsafe { std::slice::from_raw_parts_mut(c.add(start + j), chunk) };
                    let at = At {
                        inputs: f.inputs,
                        channel: 0,
                        offset: base + start + j,
                    };
                    f.epilogue.apply(row, &at, &mut registers, f.simd);
                }
            };
            // Whole rows lie one after another: one span, where no step
            // reads by column (which ties a span to one row).
            if c0 == 0 && c1 == n && !f.by_column {
                span(r0 * n, rows * n);
            } else {
                for r in r0..r0 + rows {
                    span(r * n + c0, c1 - c0);
                }
            }
        });
    }

    /// Rows `[r0, r0 + rows)` (`r0` a multiple of [`MR`]) of panels
    /// `[p0, p1)` of one product into `c` (its `m x n`).
    fn block(
        &self,
        a: A,
        b: &PackedB,
        (r0, rows): (usize, usize),
        (p0, p1): (usize, usize),
        c: *mut f32,
        isa: Isa,
    ) {
        let (n, k) = (self.n, self.k);
        debug_assert_eq!((b.k, b.n), (k, n));
        let kc = b.kc;
        let tiles = rows.div_ceil(MR);
        for k0 in (0..k).step_by(kc) {
            let kl = kc.min(k - k0);
            let last = k0 + kl == k;
            let rows_of = |t: usize| match a {
                A::Packed(a) => Rows {
                    at: a.tiles(k0, kl, (r0 / MR + t, 1)).as_ptr(),
                    row: 1,
                    step: MR,
                },
                A::Direct(at) => Rows {
                    at: self.a[at.at(r0 + t * MR, k0)..].as_ptr(),
                    row: at.row as usize,
                    step: 1,
                },
            };
            for p in p0..p1 {
                let bp = b.panel(k0, kl, p).as_ptr();
                let cols = NR.min(n - p * NR);
                let finish = Finish {
                    accumulate: k0 > 0,
                    bias: self.bias.filter(|_| last).map(|bias| bias[p * NR..].as_ptr()),
                };
                // The next panel (`kl` lines) comes from L3 or memory: where
                // a panel meets many tiles, its lines are fetched into L2 a
                // share per tile of this one, so that its first tile does
                // not wait for them (measured at 128 x 768 x 2304: 3-7%
                // faster; at 2 and 24 rows, where the panels stream past a
                // tile or four, the hardware's prefetch does better alone).
                let next = (p + 1 < p1 && tiles >= PREFETCH_TILES).then(|| b.panel(k0, kl, p + 1));
                let share = kl.div_ceil(tiles);
                for t in 0..tiles {
                    if let Some(next) = next {
                        for line in next.chunks(NR).skip(t * share).take(share) {
                            micro::prefetch_l2(line.as_ptr());
                        }
                    }
                    let tile_rows = MR.min(rows - t * MR);
                    let ap = rows_of(t);
                    // SAFETY: the tile's rows and columns lie in `c`.
                    let at = unsafe { c.add((r0 + t * MR) * n + p * NR) };
                    if cols == NR {
                        // SAFETY: the packed panels hold `kl` steps; the
                        // tile is `tile_rows x NR` of `c`, rows `n` apart.
                        unsafe { tile(isa, tile_rows, kl, ap, bp, at, n, finish) };
                    } else {
                        // The last panel, narrower than a tile: through a
                        // tile of its own.
                        let mut local = [0f32; MR * NR];
                        for r in 0..tile_rows {
                            if finish.accumulate {
                                // SAFETY: row `r`'s `cols` values lie in `c`.
                                let src = unsafe { std::slice::from_raw_parts(at.add(r * n), cols) };
                                local[r * NR..][..cols].copy_from_slice(src);
                            }
                        }
                        // SAFETY: `local` is `MR x NR`.
                        unsafe { tile(isa, tile_rows, kl, ap, bp, local.as_mut_ptr(), NR, finish) };
                        for r in 0..tile_rows {
                            // SAFETY: as above.
                            let dst = unsafe { std::slice::from_raw_parts_mut(at.add(r * n), cols) };
                            dst.copy_from_slice(&local[r * NR..][..cols]);
                        }
                    }
                }
            }
        }
    }
}

/// Whether the `rows` rows of a tile (at most [`MR`]), `row` elements
/// apart, crowd the sets of a 32 KiB 8-way L1 (64 sets of 64-byte lines,
/// one every 4 KiB): three or more in one set, with the panel of `B`
/// streaming through it, evict each other (rows of 3 072 floats, 12 KiB
/// apart, all share one set). Such rows are packed. Measured at 128 x 3072
/// x 768, one thread: packed 77% of the FMA peak, read in place 63%; at 128
/// x 768 x 2304 (rows two to a set) in place is as fast or faster. A
/// product of two rows never crowds a set, and packing them would pad each
/// step to six. The AVX-512 tile, a register per row, reads rows in place
/// faster on a Zen 4 core (128 x 3072 x 768, one thread: 104 GFLOP/s
/// against 100 packed), so it never packs them.
fn rows_share_sets(row: usize, rows: usize) -> bool {
    const LINE: usize = 64;
    const SETS: usize = 64;
    let mut count = [0u8; SETS];
    (0..rows.min(MR)).any(|r| {
        let set = (r * row * std::mem::size_of::<f32>() / LINE) % SETS;
        count[set] += 1;
        count[set] >= 3
    })
}

/// [`micro::tile`] for `rows` rows.
///
/// # Safety
/// As [`micro::tile`].
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn tile(
    isa: Isa,
    rows: usize,
    kl: usize,
    a: Rows,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    finish: Finish,
) {
    // SAFETY: the caller's.
    unsafe {
        match rows {
            1 => micro::tile::<1>(isa, kl, a, b, c, ldc, finish),
            2 => micro::tile::<2>(isa, kl, a, b, c, ldc, finish),
            3 => micro::tile::<3>(isa, kl, a, b, c, ldc, finish),
            4 => micro::tile::<4>(isa, kl, a, b, c, ldc, finish),
            5 => micro::tile::<5>(isa, kl, a, b, c, ldc, finish),
            _ => micro::tile::<6>(isa, kl, a, b, c, ldc, finish),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rows_share_sets;

    #[test]
    fn rows_a_multiple_of_four_kib_apart_share_sets_and_others_spread() {
        // 12 KiB, 4 KiB and 2 KiB apart: three or more rows to a set.
        assert!(rows_share_sets(3072, 6) && rows_share_sets(1024, 6) && rows_share_sets(512, 6));
        // 3 KiB apart: two to a set at most; 256 bytes: a set each.
        assert!(!rows_share_sets(768, 6) && !rows_share_sets(64, 6) && !rows_share_sets(771, 6));
        // Two rows (a decoder's step) share a set at most two to one.
        assert!(!rows_share_sets(3072, 2) && !rows_share_sets(512, 2));
        assert!(rows_share_sets(3072, 3));
    }
}
