//! Fuzz target `plugin_answers`: see `switchyard_tests::fuzzing::Target::PluginAnswers`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    switchyard_tests::fuzzing::Target::PluginAnswers.run(data);
});
