//! Fuzz target `trace_json`: see `switchyard_tests::fuzzing::Target::TraceJson`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    switchyard_tests::fuzzing::Target::TraceJson.run(data);
});
