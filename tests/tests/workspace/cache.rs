//! The kernel cache: canonical keys (names never matter; shape, dtype, strides,
//! attributes and options always do), LRU eviction, concurrent use, and
//! workload 4: as many kernels compiled for 32 identical layers as for one.

use std::sync::Arc;

use switchyard_core::cache::{KernelCache, RegionKey};
use switchyard_core::executor::{Kernel, Numerics, Region};
use switchyard_core::runtime::CompiledPlan;
use switchyard_core::text::parse;
use switchyard_core::{Result, Tensor, Trace};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_tests::plan_on;
use switchyard_tests::workloads::{BlockSize, llama};

/// The key of the first region of a one-region plan of `src` on the fallback.
fn key(src: &str, options: &toml::Table) -> RegionKey {
    let t = parse(src).unwrap();
    let plan = plan_on(&t, vec![Arc::new(FallbackExecutor)]).unwrap();
    key_of(&plan.trace, &plan.regions[0], options)
}

fn key_of(trace: &Trace, region: &Region, options: &toml::Table) -> RegionKey {
    RegionKey::new(trace, region, "fallback", "1", options, Numerics::default())
}

struct Nop;
impl Kernel for Nop {
    fn run(&self, _: &[&Tensor]) -> Result<Vec<Tensor>> {
        Ok(vec![])
    }
}

fn nop() -> Result<Box<dyn Kernel>> {
    Ok(Box::new(Nop))
}

#[test]
fn names_do_not_matter_metadata_attributes_and_options_do() {
    let none = toml::Table::new();
    let base = key("input x: f32[4, 8]\ny = sum(x, dims=[1])\noutput y\n", &none);
    assert_eq!(
        base,
        key("input a: f32[4, 8]\nb = sum(a, dims=[1])\noutput b\n", &none),
        "renamed values"
    );
    let differ = [
        ("shape", "input x: f32[4, 9]\ny = sum(x, dims=[1])\noutput y\n"),
        ("dtype", "input x: f64[4, 8]\ny = sum(x, dims=[1])\noutput y\n"),
        (
            "strides",
            "input x: f32[4, 8] strides=[1, 4]\ny = sum(x, dims=[1])\noutput y\n",
        ),
        (
            "attribute",
            "input x: f32[4, 8]\ny = sum(x, dims=[0])\noutput y\n",
        ),
        (
            "keepdim",
            "input x: f32[4, 8]\ny = sum(x, dims=[1], keepdim=true)\noutput y\n",
        ),
        ("op", "input x: f32[4, 8]\ny = amax(x, dims=[1])\noutput y\n"),
    ];
    for (what, src) in differ {
        assert_ne!(base, key(src, &none), "a different {what} must miss");
    }
    let mut opts = toml::Table::new();
    opts.insert("tile".into(), toml::Value::Integer(64));
    assert_ne!(
        base,
        key("input x: f32[4, 8]\ny = sum(x, dims=[1])\noutput y\n", &opts),
        "options"
    );
    let t = parse("input x: f32[4, 8]\ny = sum(x, dims=[1])\noutput y\n").unwrap();
    let plan = plan_on(&t, vec![Arc::new(FallbackExecutor)]).unwrap();
    let key_with = |exec, version, numerics| {
        RegionKey::new(&plan.trace, &plan.regions[0], exec, version, &none, numerics)
    };
    let other_exec = key_with("fuser", "1", Numerics::default());
    let other_version = key_with("fallback", "2", Numerics::default());
    assert_ne!(base, other_exec);
    assert_ne!(base, other_version);
    // A kernel compiled for IEEE f32 is not one allowed TF32.
    assert_eq!(base, key_with("fallback", "1", Numerics::default()));
    assert_ne!(base, key_with("fallback", "1", Numerics { allow_tf32: true }));
    // Scalars are part of the op.
    let a = key("input x: f32[4]\ny = mul(x, 2.0)\noutput y\n", &none);
    assert_ne!(a, key("input x: f32[4]\ny = mul(x, 3.0)\noutput y\n", &none));
}

#[test]
fn hits_misses_and_lru_eviction() {
    let none = toml::Table::new();
    let k = |n: usize| key(&format!("input x: f32[{n}]\ny = relu(x)\noutput y\n"), &none);
    let cache = KernelCache::new(2);
    cache.get_or_compile(k(1), nop).unwrap();
    cache.get_or_compile(k(2), nop).unwrap();
    cache.get_or_compile(k(1), nop).unwrap(); // 1 is now the most recently used
    cache.get_or_compile(k(3), nop).unwrap(); // evicts 2, the least recently used
    let s = cache.stats();
    assert_eq!((s.hits, s.misses, s.compiled, s.evicted), (1, 3, 3, 1));
    assert_eq!(cache.len(), 2);
    cache.get_or_compile(k(1), nop).unwrap();
    assert_eq!(cache.stats().hits, 2, "1 survived");
    cache.get_or_compile(k(2), nop).unwrap();
    assert_eq!(cache.stats().misses, 4, "2 was evicted");
    // A failed compile caches nothing.
    let e = cache.get_or_compile(k(9), || Err(switchyard_core::Error::InvalidTrace("boom".into())));
    assert!(e.is_err());
    assert_eq!(cache.stats().compiled, 4);
}

#[test]
fn concurrent_lookups_are_safe() {
    let none = toml::Table::new();
    let keys: Vec<RegionKey> = (1..=8)
        .map(|n| key(&format!("input x: f32[{n}]\ny = exp(x)\noutput y\n"), &none))
        .collect();
    let cache = Arc::new(KernelCache::new(4));
    std::thread::scope(|s| {
        for t in 0..4 {
            let cache = Arc::clone(&cache);
            let keys = keys.clone();
            s.spawn(move || {
                for i in 0..200 {
                    cache
                        .get_or_compile(keys[(i * 7 + t) % keys.len()].clone(), nop)
                        .unwrap();
                }
            });
        }
    });
    let s = cache.stats();
    assert_eq!(s.hits + s.misses, 800);
    assert!(cache.len() <= 4);
}

#[test]
fn identical_layers_compile_once() {
    let compiled = |layers: usize| {
        let t = llama(layers, BlockSize::SMALL).unwrap();
        let plan = plan_on(&t, vec![Arc::new(FallbackExecutor)]).unwrap();
        let regions = plan.regions.len();
        let c = CompiledPlan::compile_with(plan, &KernelCache::new(1024)).unwrap();
        let fused = plan_on(&t, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
        let f = CompiledPlan::compile_with(fused, &KernelCache::new(1024)).unwrap();
        (c.cache_stats().compiled, f.cache_stats().compiled, regions)
    };
    let (one, fused_one, r1) = compiled(1);
    let (eight, fused_eight, r8) = compiled(8);
    let (thirty_two, fused_thirty_two, r32) = compiled(32);
    assert!(r32 == 32 * r1 && r8 == 8 * r1, "{r1} {r8} {r32}");
    assert_eq!(
        (one, eight, thirty_two),
        (one, one, one),
        "kernels compiled for 1, 8 and 32 layers, fallback alone"
    );
    assert_eq!(
        (fused_one, fused_eight, fused_thirty_two),
        (fused_one, fused_one, fused_one),
        "kernels compiled for 1, 8 and 32 layers, with the fuser"
    );
}

#[test]
fn shared_kernels_still_compute_each_region() {
    // Two identical regions share a kernel but read their own inputs.
    let t =
        parse("input x: f32[4]\ninput y: f32[4]\na = exp(x)\nb = exp(y)\nc = add(a, b)\noutput c\n").unwrap();
    let plan = plan_on(&t, vec![Arc::new(FallbackExecutor)]).unwrap();
    let c = CompiledPlan::compile_with(plan, &KernelCache::new(8)).unwrap();
    assert_eq!(c.cache_stats().hits, 1);
    let x = Tensor::from_vec(vec![0f32, 1.0, 2.0, 3.0], &[4]).unwrap();
    let y = Tensor::from_vec(vec![1f32, 0.0, -1.0, 0.5], &[4]).unwrap();
    let out = c.run(&[x, y], Default::default()).unwrap();
    let want: Vec<f64> = [(0.0f64, 1.0f64), (1.0, 0.0), (2.0, -1.0), (3.0, 0.5)]
        .iter()
        .map(|(a, b)| a.exp() + b.exp())
        .collect();
    switchyard_tests::assert_close(&out.outputs[0], &want, 1e-6);
}
