//! Region geometry: the values a set of ops reads from outside it and the
//! values it leaves for later, and the device an op works on. The
//! partitioner, the memory fitter and executors (through
//! [`crate::executor::Context`]) all draw region boundaries with these.

use crate::ir::{OpId, Trace, Uses, ValueId};
use crate::meta::Device;

impl Trace {
    /// The inputs and outputs of a region made of `ops`, in first-use and
    /// definition order.
    ///
    /// `uses` is [`Trace::uses`]. A value the region defines is an output
    /// when the trace returns it, when an op outside the region reads it, or
    /// when nothing reads it (it is still produced, and must be accounted
    /// for).
    pub fn region_boundary(&self, ops: &[OpId], uses: &Uses) -> (Vec<ValueId>, Vec<ValueId>) {
        crate::work::add(ops.len());
        // Sorted vectors and binary searches, not hash sets: the memory
        // fitter draws thousands of boundaries of large regions.
        let mut sorted = ops.to_vec();
        sorted.sort_unstable();
        let inside = |o: OpId| sorted.binary_search(&o).is_ok();
        let defined = self.definitions(ops);
        let defined_before = |v: ValueId, at: usize| {
            defined
                .binary_search_by_key(&v, |&(w, _)| w)
                .is_ok_and(|k| defined[k].1 < at)
        };
        // Reads of values not defined before them, with their order.
        let mut reads: Vec<(ValueId, usize)> = Vec::new();
        let mut outputs = Vec::new();
        for (at, &id) in ops.iter().enumerate() {
            let op = self.op(id);
            for v in op.input_values() {
                if !defined_before(v, at) {
                    reads.push((v, reads.len()));
                }
            }
            for &v in &op.outputs {
                if uses.escapes(v, inside) {
                    outputs.push(v);
                }
            }
        }
        // Each value once, at its first read.
        reads.sort_unstable();
        reads.dedup_by_key(|r| r.0);
        reads.sort_unstable_by_key(|r| r.1);
        (reads.into_iter().map(|(v, _)| v).collect(), outputs)
    }

    /// Each value the ops define, with the position in `ops` of the op
    /// defining it, sorted by value for binary search.
    fn definitions(&self, ops: &[OpId]) -> Vec<(ValueId, usize)> {
        let mut defined: Vec<(ValueId, usize)> = ops
            .iter()
            .enumerate()
            .flat_map(|(p, &o)| self.op(o).outputs.iter().map(move |&v| (v, p)))
            .collect();
        defined.sort_unstable();
        defined
    }

    /// The device an op works on: its first output's (or first operand's).
    pub fn op_device(&self, op: OpId) -> Device {
        let o = self.op(op);
        o.outputs
            .first()
            .copied()
            .or_else(|| o.input_values().next())
            .map(|v| self.meta(v).device)
            .unwrap_or(Device::Cpu)
    }
}

/// A region's ops, ready to be cut in two at any position: each cut's two
/// pieces' boundaries in O(region) (no sorting, no search), equal to
/// [`Trace::region_boundary`] of each piece, and the boundaries of many
/// cuts at once in one pass ([`Cuts::boundaries`]). The memory fitter tries
/// many cut points of one large region. The region's ops are in an order
/// where each follows the ops of the region it reads (a plan's regions
/// are).
pub struct Cuts<'a> {
    ops: &'a [OpId],
    /// Per op position, the range of its reads in `reads` and of its
    /// results in `results`.
    read_at: Vec<usize>,
    result_at: Vec<usize>,
    /// Each operand read: the value, its slot among the distinct values
    /// read, and the position of the op defining it (`OUTSIDE` if none).
    reads: Vec<(ValueId, usize, usize)>,
    /// Each result: the value, whether it leaves the whole region, and the
    /// first and last positions that read it (`OUTSIDE` if none).
    results: Vec<(ValueId, bool, usize, usize)>,
    slots: usize,
}

/// The position of no op of the region.
const OUTSIDE: usize = usize::MAX;

/// What [`Cuts::new`] knows of a value while it reads the region.
#[derive(Clone, Copy)]
struct Seen {
    /// The position of the op defining it, or `OUTSIDE`.
    def: usize,
    /// Its slot among the distinct values read, once read.
    slot: Option<usize>,
    /// Whether it leaves the whole region.
    leaving: bool,
}

/// The two pieces' boundaries of one cut, as sets: each piece's inputs and
/// outputs.
pub type CutBoundaries = [(Vec<ValueId>, Vec<ValueId>); 2];

impl<'a> Cuts<'a> {
    /// The cuts of the region of `ops` whose outputs are `outputs` (its
    /// boundary's); `uses` is [`Trace::uses`].
    pub fn new(trace: &Trace, ops: &'a [OpId], outputs: &[ValueId], uses: &Uses) -> Cuts<'a> {
        // Per op and per value of the trace, not searches: one pass each.
        crate::work::add(ops.len() + trace.ops.len() + trace.values.len());
        let mut position = vec![OUTSIDE; trace.ops.len()];
        let mut seen = vec![
            Seen {
                def: OUTSIDE,
                slot: None,
                leaving: false,
            };
            trace.values.len()
        ];
        for (p, &o) in ops.iter().enumerate() {
            position[o.index()] = p;
            for v in &trace.op(o).outputs {
                seen[v.index()].def = p;
            }
        }
        for v in outputs {
            seen[v.index()].leaving = true;
        }
        let mut slots = 0;
        let (mut read_at, mut result_at) = (vec![0], vec![0]);
        let (mut reads, mut results) = (Vec::new(), Vec::new());
        for &o in ops {
            let op = trace.op(o);
            for v in op.input_values() {
                let s = &mut seen[v.index()];
                let slot = *s.slot.get_or_insert_with(|| {
                    slots += 1;
                    slots - 1
                });
                reads.push((v, slot, s.def));
            }
            for &v in &op.outputs {
                let readers = uses.consumers[v.index()]
                    .iter()
                    .map(|&u| position[u.index()])
                    .filter(|&p| p != OUTSIDE);
                let (first, last) = readers.fold((OUTSIDE, OUTSIDE), |(f, l), p| {
                    (f.min(p), if l == OUTSIDE { p } else { l.max(p) })
                });
                results.push((v, seen[v.index()].leaving, first, last));
            }
            read_at.push(reads.len());
            result_at.push(results.len());
        }
        Cuts {
            ops,
            read_at,
            result_at,
            reads,
            results,
            slots,
        }
    }
    /// The two pieces of a cut before position `k` (0 < k < the region's
    /// length): each piece's ops, inputs and outputs.
    pub fn pieces(&self, k: usize) -> [(Vec<OpId>, Vec<ValueId>, Vec<ValueId>); 2] {
        crate::work::add(self.ops.len());
        let n = self.ops.len();
        let mut seen = vec![0u8; self.slots];
        let mut piece = |from: usize, to: usize, mark: u8| {
            let mut inputs = Vec::new();
            for p in from..to {
                for &(v, slot, def) in &self.reads[self.read_at[p]..self.read_at[p + 1]] {
                    // Not defined earlier in this piece.
                    let outside = def == OUTSIDE || def < from || def >= p;
                    if outside && seen[slot] != mark {
                        seen[slot] = mark;
                        inputs.push(v);
                    }
                }
            }
            let outputs = self.results[self.result_at[from]..self.result_at[to]]
                .iter()
                .filter(|&&(_, leaves, first, last)| {
                    leaves || (first != OUTSIDE && first < from) || (last != OUTSIDE && last >= to)
                })
                .map(|&(v, ..)| v)
                .collect();
            (self.ops[from..to].to_vec(), inputs, outputs)
        };
        [piece(0, k, 1), piece(k, n, 2)]
    }

    /// The boundaries of the two pieces of each cut before the positions
    /// `ks` (ascending, each 0 < k < the region's length): those of
    /// [`Cuts::pieces`] as sets, in no set order. One pass over the region
    /// finds them all, and each cut costs what its boundaries hold, so that
    /// judging many cuts of a large region by their memory stays linear.
    pub fn boundaries(&self, ks: &[usize]) -> Vec<CutBoundaries> {
        crate::work::add(self.ops.len() + ks.len());
        let n = self.ops.len();
        // Values from outside the region: first and last positions read.
        let mut span = vec![(OUTSIDE, 0usize, None); self.slots];
        for p in 0..n {
            for &(v, slot, def) in &self.reads[self.read_at[p]..self.read_at[p + 1]] {
                if def == OUTSIDE {
                    let s = &mut span[slot];
                    *s = (s.0.min(p), p, Some(v));
                }
            }
        }
        let mut by_first: Vec<(usize, usize, ValueId)> = span
            .into_iter()
            .filter_map(|(first, last, v)| Some((first, last, v?)))
            .collect();
        by_first.sort_unstable();
        let mut by_last = by_first.clone();
        by_last.sort_unstable_by_key(|&(_, last, v)| (std::cmp::Reverse(last), v));
        // Results that leave the whole region, by position; results read
        // across each cut (made before it, read at or after it).
        let mut leaving: Vec<(usize, ValueId)> = Vec::new();
        let mut across: Vec<Vec<(ValueId, bool)>> = vec![Vec::new(); ks.len()];
        for p in 0..n {
            for &(v, leaves, _, last) in &self.results[self.result_at[p]..self.result_at[p + 1]] {
                if leaves {
                    leaving.push((p, v));
                }
                if last != OUTSIDE {
                    let cuts = ks.partition_point(|&k| k <= p)..ks.partition_point(|&k| k <= last);
                    for c in &mut across[cuts] {
                        c.push((v, leaves));
                    }
                }
            }
        }
        ks.iter()
            .zip(across)
            .map(|(&k, across)| {
                let before = leaving.partition_point(|&(p, _)| p < k);
                let a_inputs = by_first.iter().take_while(|e| e.0 < k).map(|e| e.2).collect();
                let a_outputs = leaving[..before]
                    .iter()
                    .map(|&(_, v)| v)
                    .chain(across.iter().filter(|(_, leaves)| !leaves).map(|&(v, _)| v))
                    .collect();
                let b_inputs = by_last
                    .iter()
                    .take_while(|e| e.1 >= k)
                    .map(|e| e.2)
                    .chain(across.iter().map(|&(v, _)| v))
                    .collect();
                let b_outputs = leaving[before..].iter().map(|&(_, v)| v).collect();
                [(a_inputs, a_outputs), (b_inputs, b_outputs)]
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::Cuts;
    use crate::dtype::DType;
    use crate::ir::{OpId, Trace, TraceBuilder, ValueId};

    /// The boundary by its definition, with hash sets.
    fn reference(t: &Trace, ops: &[OpId]) -> (Vec<ValueId>, Vec<ValueId>) {
        let uses = t.uses();
        let inside: HashSet<OpId> = ops.iter().copied().collect();
        let (mut defined, mut seen) = (HashSet::new(), HashSet::new());
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        for &id in ops {
            for v in t.op(id).input_values() {
                if !defined.contains(&v) && seen.insert(v) {
                    inputs.push(v);
                }
            }
            for &v in &t.op(id).outputs {
                defined.insert(v);
                let users = &uses.consumers[v.index()];
                if uses.is_output[v.index()] || users.is_empty() || users.iter().any(|u| !inside.contains(u))
                {
                    outputs.push(v);
                }
            }
        }
        (inputs, outputs)
    }

    /// A random chain of binary ops over recent values.
    fn trace(picks: &[(usize, usize)]) -> Trace {
        let mut b = TraceBuilder::new();
        let mut vals = vec![b.input("x", DType::F32, &[4]).unwrap()];
        for &(i, j) in picks {
            let (a, c) = (
                vals[vals.len() - 1 - i % vals.len()],
                vals[vals.len() - 1 - j % vals.len()],
            );
            vals.push(b.add(a, c).unwrap());
        }
        b.output(&[*vals.last().unwrap()]);
        b.finish().unwrap()
    }

    proptest! {
        #[test]
        fn the_boundary_is_the_definitions(
            picks in prop::collection::vec((0usize..6, 0usize..6), 1..40),
            keep in prop::collection::vec(any::<bool>(), 40),
            reversed in any::<bool>(),
        ) {
            let t = trace(&picks);
            let mut ops: Vec<OpId> = (0..t.ops.len()).filter(|&i| keep[i]).map(|i| OpId(i as u32)).collect();
            // Out of order too: a value read before the op defining it is an input.
            if reversed {
                ops.reverse();
            }
            prop_assert_eq!(t.region_boundary(&ops, &t.uses()), reference(&t, &ops));
        }

        #[test]
        fn every_cut_has_the_boundaries_of_its_pieces(
            picks in prop::collection::vec((0usize..6, 0usize..6), 2..40),
            keep in prop::collection::vec(any::<bool>(), 40),
        ) {
            let t = trace(&picks);
            let uses = t.uses();
            let ops: Vec<OpId> = (0..t.ops.len()).filter(|&i| keep[i]).map(|i| OpId(i as u32)).collect();
            let (_, outputs) = t.region_boundary(&ops, &uses);
            let cuts = Cuts::new(&t, &ops, &outputs, &uses);
            for k in 1..ops.len() {
                for (piece, range) in cuts.pieces(k).into_iter().zip([0..k, k..ops.len()]) {
                    let (i, o) = t.region_boundary(&ops[range.clone()], &uses);
                    prop_assert_eq!(piece, (ops[range].to_vec(), i, o), "cut at {}", k);
                }
            }
            // All cuts at once, and any few of them, as sets.
            let sorted = |mut v: Vec<ValueId>| {
                v.sort_unstable();
                v
            };
            let all: Vec<usize> = (1..ops.len()).collect();
            let some: Vec<usize> = all.iter().copied().filter(|k| k % 3 == 1).collect();
            for ks in [all, some] {
                for (&k, both) in ks.iter().zip(cuts.boundaries(&ks)) {
                    for ((i, o), (_, pi, po)) in both.into_iter().zip(cuts.pieces(k)) {
                        prop_assert_eq!((sorted(i), sorted(o)), (sorted(pi), sorted(po)), "cut at {}", k);
                    }
                }
            }
        }
    }
}
