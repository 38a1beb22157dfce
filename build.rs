//! Compiles `proto/` into Rust with prost/tonic.
//!
//! The protobuf compiler is `protox`, a pure-Rust implementation, so a fresh machine builds
//! without a `protoc` binary and the build does not depend on whichever `protoc` happens to be
//! installed. The encoded descriptor set is also written to OUT_DIR: the server uses it for gRPC
//! reflection and for the proto3-JSON mapping of the HTTP `/json` endpoint.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/service/discovery/v3/ads.proto",
    "ratelimit/config/ratelimit/v3/rls_conf.proto",
    "sluice/v1/limiter.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true).include_source_info(false);
    compiler.open_files(PROTOS)?;
    let descriptors = compiler.file_descriptor_set();

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("sluice_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
