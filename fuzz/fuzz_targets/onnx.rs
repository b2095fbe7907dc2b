//! Fuzz target `onnx`: see `switchyard_tests::fuzzing::Target::Onnx`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    switchyard_tests::fuzzing::Target::Onnx.run(data);
});
