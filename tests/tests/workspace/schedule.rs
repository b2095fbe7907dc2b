//! Schedulers: the peaks of workloads 1 and 5, min-peak against program
//! order and against the exact optimum, and every order computing the same
//! results.

use std::sync::Arc;

use proptest::prelude::*;
use switchyard_core::buffer::ARENA_ALIGN;
use switchyard_core::executor::Executor;
use switchyard_core::io::random_inputs;
use switchyard_core::memory::{Buffers, ValueFacts, arena_bytes};
use switchyard_core::plan::Plan;
use switchyard_core::schedule::{Strategy, exact, heuristic, order, schedule};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_tests::workloads::{BlockSize, llama, parallel_paths, random_ops, sliced_attention};
use switchyard_tests::{assert_close, notes, plan_on, plan_with_options, run_plan};

fn fused() -> Vec<Arc<dyn Executor>> {
    vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]
}

fn fallback() -> Vec<Arc<dyn Executor>> {
    vec![Arc::new(FallbackExecutor)]
}

fn peak(plan: &Plan) -> usize {
    plan.planned_peak_bytes().0
}

const MIB: usize = 1 << 20;

#[test]
fn parallel_paths_peak_at_three_quarters_of_a_mib_in_either_order() {
    for efficient in [true, false] {
        let t = parallel_paths(10, 256, efficient).unwrap();
        let plan = schedule(plan_on(&t, fused()).unwrap(), Strategy::MinPeak).unwrap();
        assert_eq!(peak(&plan), 786_432, "efficient: {efficient}");
        // What the plan measures when it runs is what was planned.
        let inputs = random_inputs(&t, 0);
        let r = run_plan(plan, &inputs).unwrap();
        assert_eq!(r.peak_bytes, 786_432);
    }
    // The eager orders, on the fallback in program order: 0.75 and 2.75 MiB.
    let eager = |efficient| {
        let t = parallel_paths(10, 256, efficient).unwrap();
        peak(&schedule(plan_on(&t, fallback()).unwrap(), Strategy::Program).unwrap())
    };
    assert_eq!((eager(true), eager(false)), (3 * MIB / 4, 11 * MIB / 4));
}

#[test]
fn sliced_attention_depth_first_holds_one_slice_breadth_first_all() {
    let (slices, seq, head) = (8, 256, 16);
    let t = sliced_attention(slices, seq, head).unwrap();
    let scores = seq * seq * 4;
    let outputs = slices * seq * head * 4;
    let dfs = peak(&schedule(plan_on(&t, fused()).unwrap(), Strategy::Dfs).unwrap());
    let bfs = peak(&schedule(plan_on(&t, fused()).unwrap(), Strategy::Bfs).unwrap());
    let min = peak(&schedule(plan_on(&t, fused()).unwrap(), Strategy::MinPeak).unwrap());
    // Depth-first: one slice's scores and probabilities, with the outputs so far.
    assert!(dfs <= 2 * scores + 2 * outputs, "dfs {dfs}");
    // Breadth-first: every slice's scores at once.
    assert!(bfs >= slices * scores, "bfs {bfs}");
    // So they differ by about the number of slices' scores.
    assert!(bfs - dfs >= (slices - 2) * scores, "dfs {dfs}, bfs {bfs}");
    assert!(min <= dfs);
}

#[test]
fn min_peak_never_exceeds_program_order_on_eight_layers() {
    let t = llama(8, BlockSize::SMALL).unwrap();
    let program = schedule(plan_on(&t, fused()).unwrap(), Strategy::Program).unwrap();
    let min = schedule(plan_on(&t, fused()).unwrap(), Strategy::MinPeak).unwrap();
    assert!(
        peak(&min) <= peak(&program),
        "{} > {}",
        peak(&min),
        peak(&program)
    );
}

#[test]
fn min_peak_against_the_exact_optimum() {
    // Small random plans: min-peak's fast heuristic is never above program
    // order, never below the optimum, and equal to it on most; min-peak
    // itself (which searches exactly at this size) is the optimum.
    let (mut equal, mut total, mut gap, mut program_off) = (0usize, 0usize, 0f64, 0usize);
    for seed in 0..200u64 {
        let t = random_ops(10 + (seed % 5) as usize, seed).unwrap();
        let plan = plan_on(&t, fallback()).unwrap();
        let g = plan.memory_graph();
        let Some(best) = exact(&g) else { continue };
        let opt = g.timeline(&best).peak_bytes;
        let min = g.timeline(&heuristic(&g)).peak_bytes;
        assert_eq!(g.timeline(&order(&g, Strategy::MinPeak)).peak_bytes, opt);
        let prog = g.timeline(&order(&g, Strategy::Program)).peak_bytes;
        assert!(
            opt <= min && min <= prog,
            "seed {seed}: exact {opt}, min-peak {min}, program {prog}"
        );
        total += 1;
        program_off += usize::from(prog > opt);
        if min == opt {
            equal += 1;
        } else {
            gap += (min - opt) as f64 / opt as f64;
        }
    }
    eprintln!(
        "min-peak's heuristic equals the optimum on {equal} of {total} plans (program order on {}); mean gap {:.2}%",
        total - program_off,
        100.0 * gap / total as f64
    );
    assert!(total >= 150 && equal * 10 >= total * 8, "{equal} of {total}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn every_order_is_valid_and_computes_the_same(n in 8usize..40, seed in any::<u64>()) {
        let t = random_ops(n, seed).unwrap();
        let inputs = random_inputs(&t, seed);
        let base = run_plan(plan_on(&t, fused()).unwrap(), &inputs).unwrap();
        for s in Strategy::ALL {
            let plan = schedule(plan_on(&t, fused()).unwrap(), s).unwrap();
            let g = plan.memory_graph();
            let identity: Vec<usize> = (0..plan.regions.len()).collect();
            prop_assert!(g.is_valid_order(&identity), "{s}");
            prop_assert!(plan.regions.iter().enumerate().all(|(i, r)| r.id == i));
            let got = run_plan(plan, &inputs).unwrap();
            for (a, b) in got.outputs.iter().zip(&base.outputs) {
                assert_close(a, &b.to_f64_vec().unwrap(), 1e-4);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// The graph candidates are judged with (each region's unread results
    /// as one buffer) gives every strategy the order, peak and live sum of
    /// the plan's full graph.
    #[test]
    fn the_peak_graph_orders_and_peaks_as_the_full_one(n in 8usize..40, seed in any::<u64>()) {
        let t = random_ops(n, seed).unwrap();
        for executors in [fused(), fallback()] {
            let plan = plan_on(&t, executors).unwrap();
            let full = plan.memory_graph();
            let facts = ValueFacts::of(&plan.trace);
            let merged = plan.memory_graph_of(&plan.regions, &facts, Buffers::Peak);
            prop_assert!(merged.buffers.len() <= full.buffers.len());
            for s in Strategy::ALL {
                let o = order(&full, s);
                prop_assert_eq!(&order(&merged, s), &o, "{}", s);
                prop_assert_eq!(merged.peak_and_sum(&o), full.peak_and_sum(&o), "{}", s);
            }
        }
    }
}

fn partitioned(t: &switchyard_core::Trace, horizontal: bool) -> Plan {
    plan_with_options(t, fused(), &[], horizontal).unwrap()
}

#[test]
fn horizontal_merges_that_raise_the_peak_are_undone() {
    use switchyard_core::fit::fit;
    for efficient in [true, false] {
        let t = parallel_paths(10, 256, efficient).unwrap();
        // Merged as Thunder merges them, the relus of every path are live at once.
        let merged = schedule(partitioned(&t, true), Strategy::MinPeak).unwrap();
        assert!(peak(&merged) > 2 * MIB, "{}", peak(&merged));
        let plan = fit(partitioned(&t, true), Strategy::MinPeak, None).unwrap();
        assert_eq!(peak(&plan), 786_432, "efficient: {efficient}");
        assert!(
            notes(&plan)
                .iter()
                .any(|n| n.contains("independent ops split apart"))
        );
        let inputs = random_inputs(&t, 0);
        let r = run_plan(plan, &inputs).unwrap();
        assert_eq!(r.peak_bytes, 786_432);
    }
    // Merges that cost nothing stay.
    let t = switchyard_core::text::parse(
        "input x: f32[64]\ninput y: f32[64]\na = exp(x)\nb = exp(y)\nc = add(a, b)\noutput c\n",
    )
    .unwrap();
    let plan = fit(partitioned(&t, true), Strategy::MinPeak, None).unwrap();
    assert_eq!(plan.regions.len(), 1);
}

#[test]
fn a_fusion_that_holds_its_input_too_long_is_cut_at_the_peak() {
    use switchyard_core::fit::fit;
    // Fused, `m` stays live while `v` is written; cut after the sum, it is
    // freed first.
    let t = switchyard_core::text::parse(
        "input x: f32[64, 64]\ninput z: f32[64, 64]\nm = matmul(x, x)\ns = sum(m, dims=[1], keepdim=true)\nv = mul(s, z)\noutput v\n",
    )
    .unwrap();
    let fused_peak = peak(&schedule(partitioned(&t, false), Strategy::MinPeak).unwrap());
    let plan = fit(partitioned(&t, false), Strategy::MinPeak, None).unwrap();
    assert_eq!((fused_peak, peak(&plan)), (32_768, 16_640));
    assert!(notes(&plan).iter().any(|n| n.contains("cut at the peak")));
    // The pieces are costed once fitting is done, as their executor prices them.
    let uses = plan.trace.uses();
    for (r, &estimate) in plan.regions.iter().zip(&plan.estimates) {
        let cost = plan.with_context(r, &uses, |cx| plan.executor_of(r).cost(&r.ops, cx));
        assert_eq!(estimate, cost, "region {}", r.id);
    }
    let inputs = random_inputs(&t, 0);
    let want = switchyard_tests::run(&t, &inputs).unwrap();
    let got = run_plan(plan, &inputs).unwrap();
    assert_close(&got.outputs[0], &want.outputs[0].to_f64_vec().unwrap(), 1e-4);
    assert_eq!(got.peak_bytes, 16_640);
}

#[test]
fn a_memory_budget_reorders_to_fit_or_names_what_is_live() {
    use switchyard_core::fit::fit;
    let t = parallel_paths(10, 256, false).unwrap();
    // In program order the breadth-first program needs 2.75 MiB; within a
    // 1 MiB budget it is reordered to fit.
    let plan = fit(plan_on(&t, fallback()).unwrap(), Strategy::Program, Some(MIB)).unwrap();
    assert_eq!(peak(&plan), 786_432);
    // Nothing fits in half a MiB: the error names the peak and the tensors.
    let e = fit(plan_on(&t, fallback()).unwrap(), Strategy::Program, Some(MIB / 2))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("needs 786432 bytes at its peak, over the memory budget of 524288 bytes"),
        "{e}"
    );
    assert!(e.contains("(262144 bytes)"), "{e}");
}

#[test]
fn arena_offsets_never_overlap_while_live() {
    use switchyard_tests::workloads::examples;
    let mut plans: Vec<(String, Plan)> = examples()
        .unwrap()
        .into_iter()
        .map(|(name, t)| {
            (
                name.to_string(),
                schedule(plan_on(&t, fused()).unwrap(), Strategy::MinPeak).unwrap(),
            )
        })
        .collect();
    for seed in 0..20 {
        let t = random_ops(60, seed).unwrap();
        plans.push((
            format!("random {seed}"),
            schedule(plan_on(&t, fallback()).unwrap(), Strategy::MinPeak).unwrap(),
        ));
    }
    for (name, plan) in plans {
        let g = plan.memory_graph();
        let order: Vec<usize> = (0..g.len()).collect();
        let arena = g.arena(&order);
        let iv = g.intervals(&order);
        let size = |b: usize| arena_bytes(g.buffers[b].bytes);
        // Intermediates are placed, inputs and returned buffers are not.
        let placed: Vec<usize> = (0..g.buffers.len())
            .filter(|&b| {
                let intermediate = g.buffers[b].producer.is_some() && !g.buffers[b].output;
                assert_eq!(arena.offsets[b].is_some(), intermediate, "{name}: buffer {b}");
                intermediate
            })
            .collect();
        let peak = (0..order.len())
            .map(|s| {
                let live = placed
                    .iter()
                    .filter(|&&b| iv[b].is_some_and(|(f, l)| f <= s && s <= l));
                live.map(|&b| size(b)).sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        assert!(
            arena.size >= peak,
            "{name}: arena {} under the intermediates' peak {peak}",
            arena.size
        );
        for (i, &a) in placed.iter().enumerate() {
            let (o1, n1) = (arena.offsets[a].unwrap(), size(a));
            assert_eq!(o1 % ARENA_ALIGN, 0, "{name}: buffer {a} misaligned");
            assert!(o1 + n1 <= arena.size);
            for &b in &placed[i + 1..] {
                let ((s1, e1), (s2, e2)) = (iv[a].unwrap(), iv[b].unwrap());
                if s1 > e2 || s2 > e1 {
                    continue;
                }
                let (o2, n2) = (arena.offsets[b].unwrap(), size(b));
                assert!(
                    o1 + n1 <= o2 || o2 + n2 <= o1 || n1 == 0 || n2 == 0,
                    "{name}: buffers {a} and {b} are live together and overlap"
                );
            }
        }
        if name.starts_with("parallel_paths") {
            assert_eq!(arena.size, peak, "{name}: equal-sized buffers pack exactly");
        }
    }
}
