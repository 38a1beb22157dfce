//! The `sluice` binary; everything lives in the library (see `cli`).

/// glibc's malloc took about a seventh of the server's CPU on the Redis path (arena locks,
/// consolidation); with mimalloc the server used 14% less CPU per decision in the same run
/// (docs/BENCHMARKS.md). Chosen here, in the binary, not in the library; `sluice-bench` (its null server
/// too) uses the same, so the benchmark compares like with like.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sluice_server::cli::main()
}
