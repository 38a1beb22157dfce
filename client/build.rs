//! Compiles the two services this crate calls, from the workspace's `proto/` directory, with
//! `protox` (a protobuf compiler in Rust), as the service's own build does: no `protoc` needed.
//!
//! Only client stubs are generated. Unlike the service, the client keeps the RLS `domain` and
//! descriptor entries as `string`s: a Rust caller builds them from `&str`, and the server accepts
//! any bytes either way (the wire format is the same).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto");
    let mut compiler = protox::Compiler::new(["../proto"])?;
    compiler.include_imports(true).include_source_info(false);
    compiler.open_files([
        "envoy/service/ratelimit/v3/rls.proto",
        "sluice/v1/limiter.proto",
    ])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
