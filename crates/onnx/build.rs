//! Compiles the vendored `onnx.proto` to Rust: `protox` parses it (no
//! `protoc` needed) and `prost-build` writes the message types.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/onnx.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    prost_build::Config::new()
        // Tensor bytes stay slices of the file they were read from.
        .bytes(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
