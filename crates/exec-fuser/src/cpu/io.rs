//! Reading inputs through views, strides and masks, and writing outputs:
//! the edges of a kernel, typed by the stored dtype.

use half::{bf16, f16};
use switchyard_core::meta::same_dims;
use switchyard_core::{HostData, HostDataMut, OutputBuffer, Stored, Tensor};

use super::CpuKernel;
use super::math::Arith;
use crate::layout::resolve;
use crate::lower::MAX_RANK;
use crate::program::View;

impl CpuKernel {
    /// How a load reads `t` through `views` and `map`: strides per dim of
    /// the walk, checked to stay inside the buffer.
    // Out of line: the plain path inlines around it.
    #[inline(never)]
    pub(super) fn source<'a>(
        &self,
        t: &'a Tensor,
        views: &[View],
        map: &crate::program::IndexMap,
    ) -> Result<Source<'a>, String> {
        let len = t.host_data().map_or(0, |s| s.len());
        let r = resolve(t, len, views, map, &self.program.shape)?;
        let mut walk = [0isize; MAX_RANK];
        for (k, &d) in self.perm.iter().enumerate() {
            walk[k] = r.it[d];
        }
        let offset = r.offset;
        let masks: Vec<(usize, usize, usize)> = map
            .masks
            .iter()
            .map(|m| {
                (
                    self.perm.iter().position(|&d| d == m.dim).unwrap_or(0),
                    m.lo,
                    m.hi,
                )
            })
            .collect();
        let dense_walk = &self.walk_dense;
        let dense = masks.is_empty()
            && self
                .pshape
                .iter()
                .enumerate()
                .all(|(k, &s)| s == 1 || walk[k] == dense_walk[k]);
        Ok(Source {
            data: Data::of(t)?,
            walk,
            offset,
            dense,
            masks,
        })
    }

    /// The elements of `t`, if a load that reads it whole in the walk's
    /// order (see [`CpuKernel::plain`]) can read them where they lie: `t`
    /// dense in the iteration shape, as it nearly always is. Such a load
    /// needs no resolving; where the elements are of the compute type it
    /// needs no [`Source`] either, only where it starts ([`Data::at`]).
    #[inline]
    pub(super) fn plain_data<'a>(&self, t: &'a Tensor) -> Option<Data<'a>> {
        let p = &self.program;
        let data = t.host_data().and_then(Data::from_host)?;
        let fits = t.offset() + p.numel() <= data.len()
            && same_dims(t.shape(), &p.shape)
            && same_dims(t.strides(), &self.walk_dense);
        fits.then_some(data)
    }

    /// The source of a plain load over `data` (from
    /// [`CpuKernel::plain_data`]) starting at element `offset`.
    #[inline]
    pub(super) fn plain_source<'a>(&self, data: Data<'a>, offset: usize) -> Source<'a> {
        let mut walk = [0isize; MAX_RANK];
        walk[..self.walk_dense.len()].copy_from_slice(&self.walk_dense);
        Source {
            data,
            walk,
            offset: offset as isize,
            dense: true,
            masks: Vec::new(),
        }
    }
}

/// The multi-index of element `start` of a dense walk over `pshape`.
#[inline(always)]
fn unravel(pshape: &[usize], start: usize) -> [usize; MAX_RANK] {
    let mut idx = [0usize; MAX_RANK];
    let mut rem = start;
    for d in (0..pshape.len()).rev() {
        idx[d] = rem % pshape[d];
        rem /= pshape[d];
    }
    idx
}

/// An input's elements, typed.
#[derive(Clone, Copy)]
pub(super) enum Data<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    Bool(&'a [bool]),
}

impl<'a> Data<'a> {
    /// Where element `offset` is, if the elements are of the compute type
    /// `C` (`offset` in the buffer, as a plain load's is).
    #[inline]
    pub(super) fn at<C: Arith>(&self, offset: usize) -> Option<*const C> {
        self.elements::<C>().map(|e| e.wrapping_add(offset))
    }

    /// The elements, if they are of the compute type `C`.
    fn elements<C: Arith>(&self) -> Option<*const C> {
        match self {
            Data::F32(d) if same::<C, f32>() => Some(d.as_ptr().cast()),
            Data::F64(d) if same::<C, f64>() => Some(d.as_ptr().cast()),
            _ => None,
        }
    }

    fn of(t: &'a Tensor) -> Result<Data<'a>, String> {
        t.host_data()
            .and_then(Data::from_host)
            .ok_or_else(|| format!("an input is {}, which the fuser does not read", t.dtype()))
    }

    /// The elements of host data of a dtype the fuser reads.
    #[inline]
    fn from_host(d: HostData<'a>) -> Option<Data<'a>> {
        match d {
            HostData::F32(v) => Some(Data::F32(v)),
            HostData::F64(v) => Some(Data::F64(v)),
            HostData::F16(v) => Some(Data::F16(v)),
            HostData::BF16(v) => Some(Data::BF16(v)),
            HostData::Bool(v) => Some(Data::Bool(v)),
            _ => None,
        }
    }

    /// The number of elements.
    #[inline]
    fn len(&self) -> usize {
        match self {
            Data::F32(d) => d.len(),
            Data::F64(d) => d.len(),
            Data::F16(d) => d.len(),
            Data::BF16(d) => d.len(),
            Data::Bool(d) => d.len(),
        }
    }
}

/// A stored type the backend reads and writes in compute type `C`.
trait Port: Stored + Copy {
    fn get<C: Arith>(self) -> C;
    fn put<C: Arith>(c: C) -> Self;
}

impl Port for f32 {
    #[inline(always)]
    fn get<C: Arith>(self) -> C {
        C::from_f32(self)
    }
    #[inline(always)]
    fn put<C: Arith>(c: C) -> Self {
        c.to_f32()
    }
}
impl Port for f64 {
    #[inline(always)]
    fn get<C: Arith>(self) -> C {
        C::from_f64(self)
    }
    #[inline(always)]
    fn put<C: Arith>(c: C) -> Self {
        c.to_f64()
    }
}
impl Port for f16 {
    #[inline(always)]
    fn get<C: Arith>(self) -> C {
        C::from_f32(self.to_f32())
    }
    #[inline(always)]
    fn put<C: Arith>(c: C) -> Self {
        f16::from_f64(c.to_f64())
    }
}
impl Port for bf16 {
    #[inline(always)]
    fn get<C: Arith>(self) -> C {
        C::from_f32(self.to_f32())
    }
    #[inline(always)]
    fn put<C: Arith>(c: C) -> Self {
        bf16::from_f64(c.to_f64())
    }
}
impl Port for bool {
    #[inline(always)]
    fn get<C: Arith>(self) -> C {
        if self { C::one() } else { C::zero() }
    }
    #[inline(always)]
    fn put<C: Arith>(c: C) -> Self {
        c != C::zero()
    }
}

/// An input as one load reads it: strides per walk dim, offset, masks.
#[derive(Clone)]
pub(super) struct Source<'a> {
    data: Data<'a>,
    walk: [isize; MAX_RANK],
    offset: isize,
    dense: bool,
    /// `(walk dim, lo, hi)`: outside, the load yields 0 without reading.
    masks: Vec<(usize, usize, usize)>,
}

impl Source<'_> {
    /// Where element 0 of the walk is, if the load is a plain dense read of
    /// elements of the compute type `C`, which the kernel can then use in place.
    pub(super) fn direct<C: Arith>(&self) -> Option<*const C> {
        if !self.dense {
            return None;
        }
        // `offset` is in the buffer, which the walk stays inside.
        self.data.elements::<C>().map(|p| p.wrapping_offset(self.offset))
    }

    /// Where element 0 of the walk's innermost run would be, if the load
    /// reads each such run contiguously (a broadcast weight, say: strides
    /// 0 and 1) in elements of the compute type `C`; a tile that lies in
    /// one run is then read in place from [`Source::run_at`].
    pub(super) fn runs_direct<C: Arith>(&self, pshape: &[usize]) -> Option<*const C> {
        let rank = pshape.len();
        if rank == 0 || !self.masks.is_empty() || self.walk[rank - 1] != 1 {
            return None;
        }
        self.data.elements::<C>()
    }

    /// The buffer index of walk element `start`.
    #[inline(always)]
    pub(super) fn run_at(&self, pshape: &[usize], start: usize) -> isize {
        let idx = unravel(pshape, start);
        self.offset
            + (0..pshape.len())
                .map(|d| idx[d] as isize * self.walk[d])
                .sum::<isize>()
    }

    #[inline(always)]
    pub(super) fn load<C: Arith>(&self, pshape: &[usize], start: usize, dst: &mut [C]) {
        match self.data {
            Data::F32(d) => self.load_typed(d, pshape, start, dst),
            Data::F64(d) => self.load_typed(d, pshape, start, dst),
            Data::F16(d) => self.load_typed(d, pshape, start, dst),
            Data::BF16(d) => self.load_typed(d, pshape, start, dst),
            Data::Bool(d) => self.load_typed(d, pshape, start, dst),
        }
    }

    #[inline(always)]
    fn load_typed<T: Port, C: Arith>(&self, data: &[T], pshape: &[usize], start: usize, dst: &mut [C]) {
        if dst.is_empty() {
            return;
        }
        if self.dense {
            let s = self.offset as usize + start;
            let n = dst.len();
            for (d, &v) in dst.iter_mut().zip(&data[s..s + n]) {
                *d = v.get();
            }
            return;
        }
        let rank = pshape.len();
        let mut idx = unravel(pshape, start);
        let at = |idx: &[usize; MAX_RANK]| -> isize {
            self.offset + (0..rank).map(|d| idx[d] as isize * self.walk[d]).sum::<isize>()
        };
        let inside_outer = |idx: &[usize; MAX_RANK]| {
            self.masks
                .iter()
                .all(|&(d, lo, hi)| d + 1 == rank || (lo..hi).contains(&idx[d]))
        };
        let inner = if rank == 0 { 1 } else { pshape[rank - 1] };
        let step = if rank == 0 { 0 } else { self.walk[rank - 1] };
        let mut k = 0;
        while k < dst.len() {
            // One run along the innermost dim.
            let run = if rank == 0 {
                1
            } else {
                (inner - idx[rank - 1]).min(dst.len() - k)
            };
            let off = at(&idx);
            let out = &mut dst[k..k + run];
            if self.masks.is_empty() {
                read_run(data, off, step, out);
            } else {
                // Along the run only the innermost coordinate moves: masks on
                // other dims hold for all of it or none, and those on the
                // innermost dim leave one window of it to read.
                let (mut lo, mut hi) = (0, run);
                if !inside_outer(&idx) {
                    hi = 0;
                }
                if rank > 0 {
                    let c0 = idx[rank - 1];
                    for &(d, mlo, mhi) in &self.masks {
                        if d == rank - 1 {
                            lo = lo.max(mlo.saturating_sub(c0));
                            hi = hi.min(mhi.saturating_sub(c0));
                        }
                    }
                }
                // A run cut short by the tile's end may stop before the window.
                let lo = lo.min(run);
                let hi = hi.max(lo);
                out[..lo].fill(C::zero());
                read_run(data, off + lo as isize * step, step, &mut out[lo..hi]);
                out[hi..].fill(C::zero());
            }
            k += run;
            // Carry into the outer dims.
            if rank == 0 {
                break;
            }
            idx[rank - 1] += run;
            let mut d = rank - 1;
            while idx[d] >= pshape[d] && d > 0 {
                idx[d] = 0;
                d -= 1;
                idx[d] += 1;
            }
        }
    }
}

/// `out[j] = data[off + j * step]`: a copy when the run is contiguous, a
/// fill when it is broadcast.
#[inline(always)]
fn read_run<T: Port, C: Arith>(data: &[T], off: isize, step: isize, out: &mut [C]) {
    if out.is_empty() {
        return;
    }
    let off = off as usize;
    match step {
        1 => {
            let n = out.len();
            for (d, &v) in out.iter_mut().zip(&data[off..off + n]) {
                *d = v.get();
            }
        }
        0 => out.fill(data[off].get()),
        _ => {
            for (j, d) in out.iter_mut().enumerate() {
                *d = data[(off as isize + j as isize * step) as usize].get();
            }
        }
    }
}

/// A raw pointer to an output's elements, shared by the threads; each writes
/// its own tiles.
#[derive(Clone, Copy)]
pub(super) enum OutPtr {
    F32(*mut f32),
    F64(*mut f64),
    F16(*mut f16),
    BF16(*mut bf16),
    Bool(*mut bool),
}
// SAFETY: threads write disjoint index ranges (their own tiles) of the buffers.
unsafe impl Send for OutPtr {}
// SAFETY: as above; the pointers themselves are never mutated.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The elements of `b`, which the fuser writes in its dtypes only.
    pub(super) fn of(b: &mut OutputBuffer) -> Result<OutPtr, String> {
        let dtype = b.dtype();
        Ok(match b.data_mut().ok_or("an output buffer off the host")? {
            HostDataMut::F32(v) => OutPtr::F32(v.as_mut_ptr()),
            HostDataMut::F64(v) => OutPtr::F64(v.as_mut_ptr()),
            HostDataMut::F16(v) => OutPtr::F16(v.as_mut_ptr()),
            HostDataMut::BF16(v) => OutPtr::BF16(v.as_mut_ptr()),
            HostDataMut::Bool(v) => OutPtr::Bool(v.as_mut_ptr()),
            _ => return Err(format!("the fuser does not write {dtype}")),
        })
    }
}

/// Whether `A` and `B` are one type.
fn same<A: 'static, B: 'static>() -> bool {
    std::any::TypeId::of::<A>() == std::any::TypeId::of::<B>()
}

impl OutPtr {
    /// The elements, if they are of the compute type `C`, which the kernel
    /// can then write in place.
    pub(super) fn direct<C: Arith>(self) -> Option<*mut C> {
        match self {
            OutPtr::F32(p) if same::<C, f32>() => Some(p.cast()),
            OutPtr::F64(p) if same::<C, f64>() => Some(p.cast()),
            _ => None,
        }
    }

    /// Writes `vals` at element `at` onwards.
    #[inline(always)]
    pub(super) fn write<C: Arith>(self, at: usize, vals: &[C]) {
        #[inline(always)]
        fn go<T: Port, C: Arith>(p: *mut T, at: usize, vals: &[C]) {
            for (i, &v) in vals.iter().enumerate() {
                // SAFETY: `at + i` is within the buffer (the caller writes its own
                // tile's range) and no other thread writes it.
                unsafe { p.add(at + i).write(T::put(v)) };
            }
        }
        match self {
            OutPtr::F32(p) => go(p, at, vals),
            OutPtr::F64(p) => go(p, at, vals),
            OutPtr::F16(p) => go(p, at, vals),
            OutPtr::BF16(p) => go(p, at, vals),
            OutPtr::Bool(p) => go(p, at, vals),
        }
    }

    /// Writes `vals`, the walk's elements `start..`, through `strides` per walk dim.
    #[inline(always)]
    pub(super) fn scatter<C: Arith>(self, pshape: &[usize], strides: &[isize], start: usize, vals: &[C]) {
        #[inline(always)]
        fn go<T: Port, C: Arith>(p: *mut T, pshape: &[usize], strides: &[isize], start: usize, vals: &[C]) {
            if vals.is_empty() {
                return;
            }
            let rank = pshape.len();
            let mut idx = unravel(pshape, start);
            for &v in vals {
                let off: isize = (0..rank).map(|d| idx[d] as isize * strides[d]).sum();
                // SAFETY: the strides are the dense strides of the output's
                // shape, so every index of the walk lands inside it, once.
                unsafe { p.offset(off).write(T::put(v)) };
                let mut d = rank;
                while d > 0 {
                    d -= 1;
                    idx[d] += 1;
                    if idx[d] < pshape[d] {
                        break;
                    }
                    idx[d] = 0;
                }
            }
        }
        match self {
            OutPtr::F32(p) => go(p, pshape, strides, start, vals),
            OutPtr::F64(p) => go(p, pshape, strides, start, vals),
            OutPtr::F16(p) => go(p, pshape, strides, start, vals),
            OutPtr::BF16(p) => go(p, pshape, strides, start, vals),
            OutPtr::Bool(p) => go(p, pshape, strides, start, vals),
        }
    }
}
