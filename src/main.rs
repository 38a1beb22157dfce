//! The `sluice` binary; everything lives in the library (see `cli`).

fn main() -> std::process::ExitCode {
    sluice::cli::main()
}
