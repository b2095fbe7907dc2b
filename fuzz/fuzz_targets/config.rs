//! Fuzz target `config`: see `switchyard_tests::fuzzing::Target::Config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    switchyard_tests::fuzzing::Target::Config.run(data);
});
