//! Fuzz target `trace_text`: see `switchyard_tests::fuzzing::Target::TraceText`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    switchyard_tests::fuzzing::Target::TraceText.run(data);
});
