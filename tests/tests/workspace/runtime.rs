//! The runtime: measured peak bytes against the design's definition on traces
//! worked out by hand, input checking, and determinism.

use std::sync::Arc;
use switchyard_core::io::random_inputs;
use switchyard_core::runtime::CompiledPlan;
use switchyard_core::text::parse;
use switchyard_core::{Error, Tensor};

use switchyard_exec_fallback::FallbackExecutor;
use switchyard_tests::{plan_on, run, run_plan, workloads};

fn peaks(src: &str) -> (usize, usize) {
    let t = parse(src).unwrap();
    let r = run(&t, &random_inputs(&t, 0)).unwrap();
    (r.peak_bytes, r.peak_bytes_with_inputs)
}

#[test]
fn outputs_are_counted_before_inputs_are_freed() {
    // x is 16 bytes. relu: a (16). exp: a + b = 32, then a is freed. add: b + c
    // = 32. Counting x, which lives until the add: 16 + 32 = 48.
    let (p, pi) = peaks("input x: f32[4]\na = relu(x)\nb = exp(a)\nc = add(b, x)\noutput c\n");
    assert_eq!((p, pi), (32, 48));
}

#[test]
fn views_add_no_bytes_and_keep_their_buffer_alive() {
    // transpose is a view of the input (0 bytes); reshape of that view must copy
    // (24); relu adds 24 while the copy is live: 48. The input's 24 bytes stay
    // live through the view until the reshape has run.
    let (p, pi) = peaks(
        "input x: f32[2, 3]\nt = transpose(x, perm=[1, 0])\nr = reshape(t, shape=[6])\ny = relu(r)\noutput y\n",
    );
    assert_eq!((p, pi), (48, 48));
    // A reshape of a contiguous intermediate is a view: only `a` and `b` count.
    let (p, _) = peaks("input x: f32[2, 3]\na = relu(x)\nv = reshape(a, shape=[6])\nb = exp(v)\noutput b\n");
    assert_eq!(p, 48);
}

#[test]
fn outputs_stay_live_to_the_end_and_dead_values_die_at_once() {
    // y is an output: y, z, w are live together (48) before z is freed.
    let (p, _) = peaks("input x: f32[4]\ny = relu(x)\nz = exp(y)\nw = neg(z)\noutput y, w\n");
    assert_eq!(p, 48);
    // d is never read: allocated (16) and freed right after its op.
    let (p, _) = peaks("input x: f32[4]\nd = exp(x)\ny = relu(x)\noutput y\n");
    assert_eq!(p, 16);
}

#[test]
fn workload_1_peaks_match_eager_program_order() {
    // One tensor is f32[256, 256] = 0.25 MiB. In program order the efficient
    // (depth-first) function peaks at 3 live tensors, the breadth-first one at 11.
    let eff = workloads::parallel_paths(10, 256, true).unwrap();
    let ineff = workloads::parallel_paths(10, 256, false).unwrap();
    let r = run(&eff, &random_inputs(&eff, 0)).unwrap();
    assert_eq!(r.peak_bytes, 786_432);
    let r = run(&ineff, &random_inputs(&ineff, 0)).unwrap();
    assert_eq!(r.peak_bytes, 2_883_584);
    assert!(r.peak_bytes_with_inputs > r.peak_bytes);
}

#[test]
fn inputs_are_checked() {
    let t = parse("input x: f32[2, 3]\ny = relu(x)\noutput y\n").unwrap();
    let wrong_shape = Tensor::from_vec(vec![0f32; 6], &[3, 2]).unwrap();
    let e = run(&t, &[wrong_shape]).unwrap_err();
    assert!(matches!(&e, Error::Tensor { name, .. } if name == "x"), "{e}");
    assert!(
        e.to_string().contains("expected f32[2, 3] but got f32[3, 2]"),
        "{e}"
    );
    let wrong_dtype = Tensor::from_vec(vec![0f64; 6], &[2, 3]).unwrap();
    assert!(
        run(&t, &[wrong_dtype])
            .unwrap_err()
            .to_string()
            .contains("but got f64[2, 3]")
    );
    let e = run(&t, &[]).unwrap_err().to_string();
    assert!(e.contains("takes 1 inputs, 0 were given"), "{e}");
}

#[test]
fn runs_are_deterministic() {
    let t = workloads::llama(1, workloads::BlockSize::SMALL).unwrap();
    let inputs = random_inputs(&t, 3);
    let a = run(&t, &inputs).unwrap();
    let b = run(&t, &inputs).unwrap();
    assert_eq!(
        a.outputs[0].to_f64_vec().unwrap(),
        b.outputs[0].to_f64_vec().unwrap()
    );
    assert_eq!(a.peak_bytes, b.peak_bytes);
}

/// The fallback alone, then the fuser in front of it.
fn fallback_then_fuser() -> [Vec<Arc<dyn switchyard_core::executor::Executor>>; 2] {
    use switchyard_exec_fuser::FuserExecutor;
    [
        vec![Arc::new(FallbackExecutor)],
        vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)],
    ]
}

#[test]
fn planned_peaks_equal_measured_peaks() {
    // Liveness follows buffers: fused intermediates take none, zero-copy
    // views share their base's, and a reshape that must copy takes its own.
    use switchyard_tests::workloads::examples;
    for (name, t) in examples().unwrap() {
        for execs in fallback_then_fuser() {
            let fused = execs.len() > 1;
            let plan = plan_on(&t, execs).unwrap();
            let planned = plan.planned_peak_bytes();
            let inputs = switchyard_core::io::random_inputs(&t, 1);
            let r = run_plan(plan, &inputs).unwrap();
            assert_eq!(
                planned,
                (r.peak_bytes, r.peak_bytes_with_inputs),
                "{name} (fuser: {fused})"
            );
        }
    }
}

fn same_bits(a: &[Tensor], b: &[Tensor]) -> bool {
    let bits = |t: &Tensor| -> Vec<u64> { t.to_f64_vec().unwrap().iter().map(|x| x.to_bits()).collect() };
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.shape() == y.shape() && bits(x) == bits(y))
}

#[test]
fn intermediates_run_from_an_arena_kept_between_runs() {
    use switchyard_core::runtime::{CompiledPlan, RunOptions};
    use switchyard_tests::workloads::examples;
    let per_call = RunOptions {
        allocate_per_call: true,
        ..RunOptions::default()
    };
    for (name, t) in examples().unwrap() {
        for execs in fallback_then_fuser() {
            let fused = execs.len() > 1;
            let plan = plan_on(&t, execs).unwrap();
            let planned = plan.planned_peak_bytes();
            let compiled = CompiledPlan::compile(plan).unwrap();
            let inputs = random_inputs(&t, 2);
            let fresh = compiled.run(&inputs, per_call).unwrap();
            let first = compiled.run(&inputs, RunOptions::default()).unwrap();
            let second = compiled.run(&inputs, RunOptions::default()).unwrap();
            let what = format!("{name} (fuser: {fused})");
            assert_eq!((fresh.arena_bytes, fresh.arena_reused), (0, false), "{what}");
            assert!(!first.arena_reused && second.arena_reused, "{what}");
            assert_eq!(first.arena_bytes, compiled.arena_bytes(), "{what}");
            for r in [&fresh, &first, &second] {
                assert_eq!(planned, (r.peak_bytes, r.peak_bytes_with_inputs), "{what}");
            }
            assert!(same_bits(&fresh.outputs, &first.outputs), "{what}");
            assert!(same_bits(&fresh.outputs, &second.outputs), "{what}");
        }
    }
}

/// `y = exp(x * 2)` over `n` elements, planned on the fuser.
fn fused_exp(n: usize) -> switchyard_core::runtime::CompiledPlan {
    use switchyard_exec_fuser::FuserExecutor;
    let t = parse(&format!(
        "input x: f32[{n}]\na = mul(x, 2.0)\ny = exp(a)\noutput y\n"
    ))
    .unwrap();
    let plan = plan_on(&t, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    switchyard_core::runtime::CompiledPlan::compile(plan).unwrap()
}

#[test]
fn outputs_handed_back_are_written_again_and_kept_ones_never() {
    use switchyard_core::runtime::RunOptions;
    let compiled = fused_exp(4096);
    let x = |v: f32| Tensor::from_vec(vec![v; 4096], &[4096]).unwrap();
    let want = |v: f32| vec![(v * 2.0).exp(); 4096];
    let first = compiled.run(&[x(0.5)], RunOptions::default()).unwrap();
    assert_eq!(first.outputs_reused.as_slice(), [false]);
    let id = first.outputs[0].storage_id();
    assert_eq!(compiled.recycle(first.outputs), 1);
    let second = compiled.run(&[x(0.25)], RunOptions::default()).unwrap();
    assert_eq!(second.outputs_reused.as_slice(), [true]);
    assert_eq!(
        second.outputs[0].storage_id(),
        id,
        "written into the buffer handed back"
    );
    assert_eq!(second.outputs[0].to_vec::<f32>().unwrap(), want(0.25));
    // A caller that keeps a reference: the buffer is refused, never written.
    let kept = second.outputs[0].clone();
    assert_eq!(compiled.recycle(second.outputs), 0);
    let third = compiled.run(&[x(1.0)], RunOptions::default()).unwrap();
    assert_eq!(third.outputs_reused.as_slice(), [false]);
    assert_ne!(third.outputs[0].storage_id(), id);
    assert_eq!(
        kept.to_vec::<f32>().unwrap(),
        want(0.25),
        "kept output overwritten"
    );
    assert_eq!(third.outputs[0].to_vec::<f32>().unwrap(), want(1.0));
    // Runs that allocate per call take nothing from the pool.
    assert_eq!(compiled.recycle(third.outputs), 1);
    let per_call = RunOptions {
        allocate_per_call: true,
        ..RunOptions::default()
    };
    assert_eq!(
        compiled
            .run(&[x(1.0)], per_call)
            .unwrap()
            .outputs_reused
            .as_slice(),
        [false]
    );
}

#[test]
fn run_into_writes_into_the_callers_buffers_and_checks_them() {
    use switchyard_core::runtime::RunOptions;
    use switchyard_core::{DType, OutputBuffer};
    let compiled = fused_exp(64);
    let x = Tensor::from_vec(vec![0.5f32; 64], &[64]).unwrap();
    let mut mine = OutputBuffer::new(DType::F32, &[64]).unwrap();
    let at = mine.slice_mut::<f32>().unwrap().as_ptr();
    let r = compiled
        .run_into(std::slice::from_ref(&x), vec![Some(mine)], RunOptions::default())
        .unwrap();
    assert_eq!(r.outputs_reused.as_slice(), [true]);
    assert_eq!(r.outputs[0].contiguous_data::<f32>().unwrap().as_ptr(), at);
    assert_eq!(r.outputs[0].to_vec::<f32>().unwrap(), vec![1f32.exp(); 64]);
    // An output taken back from a run is a buffer to give again.
    let again = OutputBuffer::reclaim(r.outputs.into_iter().next().unwrap()).unwrap();
    let r = compiled
        .run_into(std::slice::from_ref(&x), vec![Some(again)], RunOptions::default())
        .unwrap();
    assert_eq!(r.outputs[0].contiguous_data::<f32>().unwrap().as_ptr(), at);
    let wrong = OutputBuffer::new(DType::F64, &[64]).unwrap();
    let e = compiled
        .run_into(std::slice::from_ref(&x), vec![Some(wrong)], RunOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("y") && e.contains("the buffer given for it holds f64[64], the output is f32[64]"),
        "{e}"
    );
    let e = compiled
        .run_into(std::slice::from_ref(&x), vec![None, None], RunOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("2 output buffers given; the trace has 1 outputs"),
        "{e}"
    );
}

#[test]
fn a_value_output_twice_and_an_input_output_come_back_on_every_run() {
    use switchyard_core::ir::{Attrs, OpKind, Operand, UnaryOp};
    use switchyard_core::runtime::{CompiledPlan, RunOptions};
    // Built as an importer builds it; the text format reads it back.
    let mut b = switchyard_core::TraceBuilder::new();
    let x = b.input("x", switchyard_core::DType::F32, &[3]).unwrap();
    let y = b
        .op(
            OpKind::Unary(UnaryOp::Exp),
            &[Operand::Value(x)],
            Attrs::default(),
        )
        .unwrap();
    b.output(&[y, x, y]);
    let t = b.finish().unwrap();
    let printed = t.to_string();
    assert!(
        printed.contains("output t0, x, t0") || printed.contains(", x, "),
        "{printed}"
    );
    assert_eq!(parse(&printed).unwrap().outputs, t.outputs);
    for executors in fallback_then_fuser() {
        let compiled = CompiledPlan::compile(plan_on(&t, executors).unwrap()).unwrap();
        let x = Tensor::from_vec(vec![0f32, 1.0, 2.0], &[3]).unwrap();
        let want: Vec<f32> = [0f32, 1.0, 2.0].iter().map(|v| v.exp()).collect();
        // Later runs reuse the first one's state and take its outputs back.
        let mut last: Option<switchyard_core::runtime::RunResult> = None;
        for _ in 0..3 {
            if let Some(r) = last.take() {
                compiled.recycle(r.outputs);
            }
            let r = compiled
                .run(std::slice::from_ref(&x), RunOptions::default())
                .unwrap();
            assert_eq!(r.outputs.len(), 3);
            assert_eq!(r.outputs[0].to_vec::<f32>().unwrap(), want);
            assert_eq!(r.outputs[1].to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0]);
            assert_eq!(r.outputs[2].to_vec::<f32>().unwrap(), want);
            last = Some(r);
        }
    }
}

#[test]
fn the_fallback_writes_dense_elementwise_results_into_the_buffers_given() {
    use switchyard_core::runtime::{CompiledPlan, RunOptions};
    // exp and add on dense f32 and f64 take the paths that write in place;
    // `y` lives in the arena, `z` and `w` are outputs handed back.
    let t = parse(
        "input x: f32[64, 64]\ninput d: f64[4096]\ny = exp(x)\nz = add(y, x)\nw = tanh(d)\noutput z, w\n",
    )
    .unwrap();
    let plan = plan_on(&t, vec![Arc::new(FallbackExecutor)]).unwrap();
    let compiled = CompiledPlan::compile(plan).unwrap();
    assert!(compiled.arena_bytes() > 0, "y is placed in the arena");
    let inputs = random_inputs(&t, 3);
    let per_call = RunOptions {
        allocate_per_call: true,
        ..RunOptions::default()
    };
    let alone = compiled.run(&inputs, per_call).unwrap();
    assert_eq!(alone.outputs_reused.as_slice(), [false, false]);
    // The fuser computes the same functions (the bits of
    // `switchyard_simd::math`) through code of its own.
    let fused = plan_on(
        &t,
        vec![
            Arc::new(switchyard_exec_fuser::FuserExecutor),
            Arc::new(FallbackExecutor),
        ],
    )
    .unwrap();
    let want = CompiledPlan::compile(fused)
        .unwrap()
        .run(&inputs, per_call)
        .unwrap();
    assert!(same_bits(&alone.outputs, &want.outputs));
    let mut last = compiled.run(&inputs, RunOptions::default()).unwrap();
    for _ in 0..2 {
        compiled.recycle(last.outputs);
        last = compiled.run(&inputs, RunOptions::default()).unwrap();
        assert_eq!(last.outputs_reused.as_slice(), [true, true]);
        assert!(same_bits(&last.outputs, &want.outputs));
    }
}

/// Runs `src` on the fallback four times with new inputs each time, each
/// run's outputs handed back before the next: from the second run on every
/// output is written into a buffer handed back, and `check` sees each
/// run's inputs and outputs (a buffer not written would show old values).
fn recycled_runs_on_new_inputs(src: &str, check: impl Fn(&[Tensor], &[Tensor])) {
    use switchyard_core::runtime::{CompiledPlan, RunOptions};
    let t = parse(src).unwrap();
    let compiled = CompiledPlan::compile(plan_on(&t, vec![Arc::new(FallbackExecutor)]).unwrap()).unwrap();
    assert!(
        compiled.arena_bytes() > 0,
        "an intermediate is placed in the arena"
    );
    let mut last: Option<switchyard_core::runtime::RunResult> = None;
    for seed in 0..4 {
        let inputs = random_inputs(&t, seed);
        if let Some(r) = last.take() {
            compiled.recycle(r.outputs);
        }
        let r = compiled.run(&inputs, RunOptions::default()).unwrap();
        assert!(
            r.outputs_reused.iter().all(|&u| u == (seed > 0)),
            "run {seed}: {:?}",
            r.outputs_reused
        );
        check(&inputs, &r.outputs);
        last = Some(r);
    }
}

#[test]
fn the_fallback_writes_reductions_and_products_into_the_buffers_given() {
    // `p` lives in the arena, `s` and `m` are outputs.
    let src = "input a: f32[32, 48]\ninput b: f32[48, 16]\np = matmul(a, b)\ns = sum(p, dims=[0])\nm = amax(a, dims=[1])\noutput s, m\n";
    recycled_runs_on_new_inputs(src, |inputs, outputs| {
        let (a, b) = (
            inputs[0].to_vec::<f32>().unwrap(),
            inputs[1].to_vec::<f32>().unwrap(),
        );
        let mut s = [0f64; 16];
        for i in 0..32 {
            for (j, s) in s.iter_mut().enumerate() {
                *s += (0..48)
                    .map(|k| a[i * 48 + k] as f64 * b[k * 16 + j] as f64)
                    .sum::<f64>();
            }
        }
        let m: Vec<f32> = a
            .chunks(48)
            .map(|r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max))
            .collect();
        let got = outputs[0].to_vec::<f32>().unwrap();
        for (g, w) in got.iter().zip(s) {
            assert!((*g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
        }
        assert_eq!(outputs[1].to_vec::<f32>().unwrap(), m);
    });
}

#[test]
fn the_fallbacks_general_walk_writes_into_the_buffers_given() {
    // A broadcast add (the general walk), a `where` and a cast: `y` lives
    // in the arena, `z` and `c` are outputs.
    let src = "input x: f32[64, 48]\ninput b: f32[48]\ny = add(x, b)\nm = gt(y, 0.0)\nz = where(m, y, b)\nc = cast(z, dtype=f64)\noutput z, c\n";
    recycled_runs_on_new_inputs(src, |inputs, outputs| {
        let (x, b) = (
            inputs[0].to_vec::<f32>().unwrap(),
            inputs[1].to_vec::<f32>().unwrap(),
        );
        let z: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let y = v + b[i % 48];
                if y > 0.0 { y } else { b[i % 48] }
            })
            .collect();
        assert_eq!(outputs[0].to_vec::<f32>().unwrap(), z);
        let c: Vec<f64> = z.iter().map(|&v| v as f64).collect();
        assert_eq!(outputs[1].to_vec::<f64>().unwrap(), c);
    });
}

#[test]
fn the_fallbacks_copying_scanning_and_creating_ops_write_into_the_buffers_given() {
    // `c`, `i` and `g` live in the arena; the rest are outputs.
    let src = "input x: f32[16, 12]\ninput y: f32[4, 12]\nc = cat(x, y, dim=0)\n\
               i = iota(shape=[5], dim=0, start=1, step=3)\ns = index_select(c, i, dim=0)\n\
               g = iota(shape=[20, 3], dim=1, start=0, step=4)\nh = gather(c, g, dim=1)\n\
               k = cumsum(c, dim=1)\nf = full(shape=[7], value=2.5)\noutput s, h, k, f\n";
    recycled_runs_on_new_inputs(src, |inputs, outputs| {
        let mut c = inputs[0].to_vec::<f32>().unwrap();
        c.extend(inputs[1].to_vec::<f32>().unwrap());
        let row = |r: usize| &c[r * 12..(r + 1) * 12];
        let s: Vec<f32> = [1, 4, 7, 10, 13].iter().flat_map(|&r| row(r).to_vec()).collect();
        assert_eq!(outputs[0].to_vec::<f32>().unwrap(), s, "index_select");
        let h: Vec<f32> = (0..20).flat_map(|r| [0, 4, 8].map(|j| row(r)[j])).collect();
        assert_eq!(outputs[1].to_vec::<f32>().unwrap(), h, "gather");
        let k: Vec<f32> = (0..20)
            .flat_map(|r| {
                // The fallback's scans accumulate in f64, each output rounded once.
                row(r).iter().scan(0f64, |acc, &v| {
                    *acc += v as f64;
                    Some(*acc as f32)
                })
            })
            .collect();
        assert_eq!(outputs[2].to_vec::<f32>().unwrap(), k, "cumsum");
        assert_eq!(outputs[3].to_vec::<f32>().unwrap(), vec![2.5; 7], "full");
    });
}

#[test]
fn concurrent_runs_of_one_plan_each_get_an_arena() {
    use switchyard_core::runtime::{CompiledPlan, RunOptions};
    use switchyard_exec_fuser::FuserExecutor;
    let t = workloads::llama(1, workloads::BlockSize::SMALL).unwrap();
    let plan = plan_on(&t, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let compiled = CompiledPlan::compile(plan).unwrap();
    let inputs: Vec<Vec<Tensor>> = (0..4).map(|s| random_inputs(&t, s)).collect();
    let want: Vec<Vec<Tensor>> = inputs
        .iter()
        .map(|i| compiled.run(i, RunOptions::default()).unwrap().outputs)
        .collect();
    std::thread::scope(|s| {
        for (i, w) in inputs.iter().zip(&want) {
            let compiled = &compiled;
            s.spawn(move || {
                for _ in 0..3 {
                    let got = compiled.run(i, RunOptions::default()).unwrap();
                    assert!(same_bits(&got.outputs, w));
                }
            });
        }
    });
}

#[test]
fn one_plan_run_from_eight_threads_a_hundred_times_each_gives_single_run_results() {
    use switchyard_core::runtime::CompiledPlan;
    let t = workloads::llama(1, workloads::BlockSize::SMALL).unwrap();
    let compiled = CompiledPlan::compile(switchyard_tests::fused_planner().plan(&t).unwrap()).unwrap();
    let inputs: Vec<Vec<Tensor>> = (0..16).map(|s| random_inputs(&t, s)).collect();
    switchyard_tests::concurrent_runs_match_single_runs(&compiled, &inputs, 8, 100);
}

#[test]
fn an_arena_is_not_reused_while_a_kernel_keeps_a_tensor_in_it() {
    use std::sync::Mutex;
    use switchyard_core::runtime::{CompiledPlan, RunOptions};
    use switchyard_tests::fakes::{Script, Scripted};
    let t = parse("input x: f32[64]\na = relu(x)\nb = exp(a)\nc = neg(b)\noutput c\n").unwrap();
    let kept = Arc::new(Mutex::new(Vec::new()));
    // The hoarder runs relu and exp, copying their results into the arena,
    // and keeps every input: x, then `a`, which lies in the arena.
    let hoarder = Scripted::operator("hoarder")
        .with("relu", Script::Accept(0.0))
        .with("exp", Script::Accept(0.0))
        .keeping(kept.clone())
        .arc();
    let plan = plan_on(&t, vec![hoarder, Arc::new(FallbackExecutor)]).unwrap();
    assert_eq!(plan.executor_name(&plan.regions[1]), "hoarder");
    let compiled = CompiledPlan::compile(plan).unwrap();
    let x1 = Tensor::from_vec((0..64).map(|i| i as f32 - 9.0).collect(), &[64]).unwrap();
    let x2 = Tensor::from_vec(vec![7f32; 64], &[64]).unwrap();
    compiled.run(&[x1], RunOptions::default()).unwrap();
    let second = compiled.run(&[x2], RunOptions::default()).unwrap();
    assert!(!second.arena_reused, "the first arena is still referenced");
    let kept = kept.lock().unwrap();
    let want: Vec<f32> = (0..64).map(|i| (i as f32 - 9.0).max(0.0)).collect();
    assert_eq!(kept[1].to_vec::<f32>().unwrap(), want, "kept tensor overwritten");
    assert_eq!(kept[3].to_vec::<f32>().unwrap(), vec![7f32; 64]);
}

/// The fallback, but its kernels fail once after they computed: the `n`-th
/// call from when `panic_in` (or `fail_in`) is set to `n` panics (or
/// returns an error).
#[derive(Clone, Default)]
struct Flaky {
    panic_in: Arc<std::sync::atomic::AtomicUsize>,
    fail_in: Arc<std::sync::atomic::AtomicUsize>,
}

struct FlakyKernel {
    inner: Box<dyn switchyard_core::executor::Kernel>,
    how: Flaky,
}

impl switchyard_core::executor::Kernel for FlakyKernel {
    fn run(&self, inputs: &[&Tensor]) -> switchyard_core::Result<Vec<Tensor>> {
        switchyard_core::executor::run_allocating(self, inputs)
    }

    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<switchyard_core::OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> switchyard_core::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        self.inner.run_into(inputs, given, outputs)?;
        let now = |n: &std::sync::atomic::AtomicUsize| {
            n.fetch_update(SeqCst, SeqCst, |k| k.checked_sub(1)) == Ok(1)
        };
        if now(&self.how.panic_in) {
            panic!("a kernel that panics");
        }
        if now(&self.how.fail_in) {
            return Err(Error::Kernel {
                executor: "flaky".into(),
                op: "region".into(),
                message: "a kernel that fails".into(),
            });
        }
        Ok(())
    }
}

impl switchyard_core::executor::Executor for Flaky {
    fn info(&self) -> switchyard_core::executor::ExecutorInfo {
        let mut info = FallbackExecutor.info();
        info.name = "flaky".into();
        info
    }

    fn claim(
        &self,
        op: switchyard_core::ir::OpId,
        cx: &switchyard_core::executor::Context,
    ) -> switchyard_core::executor::Claim {
        FallbackExecutor.claim(op, cx)
    }

    fn compile(
        &self,
        region: &switchyard_core::executor::Region,
        cx: &switchyard_core::executor::Context,
    ) -> switchyard_core::Result<Box<dyn switchyard_core::executor::Kernel>> {
        Ok(Box::new(FlakyKernel {
            inner: FallbackExecutor.compile(region, cx)?,
            how: self.clone(),
        }))
    }
}

#[test]
fn a_run_that_failed_or_panicked_leaves_the_next_run_a_clean_state() {
    use std::sync::atomic::Ordering::SeqCst;
    use switchyard_core::executor::Executor;
    use switchyard_core::runtime::{CompiledPlan, RunOptions};
    let how = Flaky::default();
    let flaky = Arc::new(how.clone());
    // Two regions, an intermediate in the arena, an input returned as an
    // output; the runs fail in the second region, the first one's result
    // in its slot.
    let t = parse("input x: f32[4]\ny = exp(x)\nz = neg(y)\noutput z, x\n").unwrap();
    let compiled = CompiledPlan::compile(plan_on(&t, vec![flaky as Arc<dyn Executor>]).unwrap()).unwrap();
    let x = Tensor::from_vec(vec![0f32, 1.0, 2.0, 3.0], &[4]).unwrap();
    let want: Vec<f32> = [0f32, 1.0, 2.0, 3.0].iter().map(|v| -v.exp()).collect();
    let run = || compiled.run(std::slice::from_ref(&x), RunOptions::default());
    let first = run().unwrap();
    compiled.recycle(first.outputs);
    let check = || {
        for _ in 0..3 {
            let r = run().unwrap();
            assert_eq!(r.outputs[0].to_vec::<f32>().unwrap(), want);
            assert_eq!(r.outputs[1].to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0, 3.0]);
            assert_eq!(r.peak_bytes, first.peak_bytes, "the bookkeeping starts afresh");
            assert_eq!(r.peak_bytes_with_inputs, first.peak_bytes_with_inputs);
            compiled.recycle(r.outputs);
        }
    };
    how.fail_in.store(2, SeqCst);
    let e = run().unwrap_err().to_string();
    assert!(e.contains("a kernel that fails"), "{e}");
    check();
    how.panic_in.store(2, SeqCst);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
    assert!(panicked.is_err(), "the kernel panicked through the run");
    check();
}

/// An operator executor for `relu` whose kernel says whether it uses the
/// thread pool, and records which pool thread each run ran on (`None`: a
/// thread outside the pool).
struct ThreadProbe {
    uses_threads: bool,
    seen: Arc<std::sync::Mutex<Vec<Option<usize>>>>,
}

struct ProbeKernel {
    uses_threads: bool,
    seen: Arc<std::sync::Mutex<Vec<Option<usize>>>>,
}

impl switchyard_core::executor::Kernel for ProbeKernel {
    fn run(&self, inputs: &[&Tensor]) -> switchyard_core::Result<Vec<Tensor>> {
        self.seen.lock().unwrap().push(rayon::current_thread_index());
        let x = inputs[0].to_vec::<f32>().unwrap();
        Ok(vec![Tensor::from_vec(
            x.into_iter().map(|v| v.max(0.0)).collect(),
            inputs[0].shape(),
        )?])
    }

    fn uses_threads(&self) -> bool {
        self.uses_threads
    }
}

impl switchyard_core::executor::Executor for ThreadProbe {
    fn info(&self) -> switchyard_core::executor::ExecutorInfo {
        switchyard_core::executor::ExecutorInfo::operator("probe", "test", &["cpu"])
    }

    fn claim(
        &self,
        op: switchyard_core::ir::OpId,
        cx: &switchyard_core::executor::Context,
    ) -> switchyard_core::executor::Claim {
        use switchyard_core::executor::Claim;
        match cx.trace.op(op).kind.name() {
            "relu" => Claim::Accept(1.0),
            _ => Claim::Reject("runs relu only".into()),
        }
    }

    fn compile(
        &self,
        _region: &switchyard_core::executor::Region,
        _cx: &switchyard_core::executor::Context,
    ) -> switchyard_core::Result<Box<dyn switchyard_core::executor::Kernel>> {
        Ok(Box::new(ProbeKernel {
            uses_threads: self.uses_threads,
            seen: self.seen.clone(),
        }))
    }
}

/// Runs `src` planned on the probe (saying `uses_threads`) and the
/// fallback from a thread outside the pool, as a caller's is; returns the
/// pool thread each probe run ran on.
fn probe_threads(src: &str, inputs: &[Tensor], uses_threads: bool) -> Vec<Option<usize>> {
    let t = parse(src).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let probe = Arc::new(ThreadProbe {
        uses_threads,
        seen: seen.clone(),
    });
    let plan = plan_on(&t, vec![probe, Arc::new(FallbackExecutor)]).unwrap();
    assert!(plan.regions.iter().any(|r| plan.executor_name(r) == "probe"));
    let inputs = inputs.to_vec();
    std::thread::spawn(move || run_plan(plan, &inputs).map(|r| r.outputs))
        .join()
        .unwrap()
        .unwrap();
    seen.lock().unwrap().clone()
}

#[test]
fn a_host_plan_moves_onto_the_pool_only_when_a_kernel_may_use_it() {
    // Moving onto a worker costs two wake-ups across threads: a plan whose
    // kernels never start a parallel loop stays on the caller's thread.
    if rayon::current_num_threads() < 2 {
        println!("skipped: one thread in the pool, where no plan moves onto it");
        return;
    }
    let src = "input x: f32[4]\ny = relu(x)\noutput y\n";
    let inputs = random_inputs(&parse(src).unwrap(), 0);
    assert_eq!(
        probe_threads(src, &inputs, false),
        vec![None],
        "a plan without threaded kernels stays on the caller's thread"
    );
    let ran_on = probe_threads(src, &inputs, true);
    assert!(
        matches!(ran_on.as_slice(), [Some(_)]),
        "a plan with one runs on a worker: {ran_on:?}"
    );
    // The fallback says so by what its ops write: a row gathered from a
    // large table is one thread's work (a decoder's position embedding),
    // an exp over the whole table is shared over the pool.
    let table = Tensor::from_vec(vec![0.5f32; 65536 * 4], &[65536, 4]).unwrap();
    let row = Tensor::from_vec(vec![3i64], &[1]).unwrap();
    let gather = "input table: f32[65536, 4]\ninput i: i64[1]\nrow = index_select(table, i, dim=0)\n\
                  y = relu(row)\noutput y\n";
    assert_eq!(
        probe_threads(gather, &[table.clone(), row.clone()], false),
        vec![None]
    );
    let whole = "input table: f32[65536, 4]\ninput i: i64[1]\nrow = index_select(table, i, dim=0)\n\
                 y = relu(row)\nz = exp(table)\noutput y, z\n";
    let ran_on = probe_threads(whole, &[table, row], false);
    assert!(matches!(ran_on.as_slice(), [Some(_)]), "{ran_on:?}");
}

#[test]
fn a_compiled_plan_counts_the_regions_that_may_share_their_work_over_the_pool() {
    // A large exp is shared over the pool; a transpose of the same tensor
    // is a view, which writes nothing; a small exp stays on one thread.
    let t = parse(
        "input x: f32[512, 512]\ninput s: f32[4]\ny = exp(x)\nv = transpose(x, perm=[1, 0])\n\
         hint fuse=false {\nz = exp(s)\n}\noutput y, v, z\n",
    )
    .unwrap();
    let plan = plan_on(&t, vec![Arc::new(FallbackExecutor)]).unwrap();
    assert_eq!(plan.regions.len(), 3);
    let compiled = CompiledPlan::compile(plan).unwrap();
    assert_eq!(compiled.threaded_regions(), 1);
}
