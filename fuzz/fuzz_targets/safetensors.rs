//! Fuzz target `safetensors`: see `switchyard_tests::fuzzing::Target::Safetensors`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    switchyard_tests::fuzzing::Target::Safetensors.run(data);
});
