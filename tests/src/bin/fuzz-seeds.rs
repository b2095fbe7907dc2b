//! Writes each fuzz target's seed corpus (from the examples) into
//! `DIR/TARGET/`, as cargo-fuzz reads it (`DIR` is `fuzz/corpus` when not
//! given): `cargo run -p switchyard-tests --bin fuzz-seeds [DIR]`.

use switchyard_tests::fuzzing::Target;

fn main() -> std::io::Result<()> {
    let root = match std::env::args_os().nth(1) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus"),
    };
    for target in Target::ALL {
        let dir = root.join(target.name());
        std::fs::create_dir_all(&dir)?;
        let seeds = target.seeds();
        for (i, seed) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:03}")), seed)?;
        }
        println!("{}: {} seeds in {}", target.name(), seeds.len(), dir.display());
    }
    Ok(())
}
